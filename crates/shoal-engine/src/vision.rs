//! Images in prompts, above the backend seam: decoding under limits, an
//! image's place and length in the token sequence, and the key the prefix
//! cache knows it by.
//!
//! A vision model reads an image as a run of positions the backend fills
//! from the image itself (llama.cpp's multimodal library encodes it and
//! decodes the embeddings). Everything above the seam (scheduler, prefix
//! cache, usage, the context window) still sees one token sequence: each
//! image stands in it as [`ImageSpan::len`] placeholder ids derived from the
//! image's content hash. Placeholders are never real vocabulary ids (their
//! high bit is set), so a sampler, a penalty or a draft never mistakes one
//! for a word; two requests with the same picture at the same place share
//! the prefix, so a second question about it reuses its KV instead of
//! encoding it again, in RAM and on disk alike; another picture differs from
//! its first position on.
//!
//! Images are decoded here (PNG, JPEG, WebP, GIF's first frame) by the
//! `image` crate, after the byte and pixel limits are checked, so native code
//! only ever sees plain RGB pixels.
use std::any::Any;
use std::io::Cursor;
use std::sync::Arc;

use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::error::{EngineError, Result};

/// Where an image sits in a rendered prompt's text. Dialects put one here
/// per image, in order; user text never carries it (see [`scrub`]).
pub const MARKER: &str = "<\u{E000}shoal-image\u{E000}>";

/// The set bit that makes an id a placeholder, never a vocabulary id.
const PLACEHOLDER: u32 = 0x8000_0000;

/// What one request's images may be (`[vision]` settings).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImageLimits {
    /// Bytes of one encoded image.
    pub max_bytes: usize,
    /// Images in one request.
    pub max_images: usize,
    /// Pixels (width × height) of one image.
    pub max_pixels: u64,
}

impl Default for ImageLimits {
    fn default() -> Self {
        ImageLimits {
            max_bytes: 20 << 20,
            max_images: 16,
            max_pixels: 50_000_000,
        }
    }
}

/// Why an image was refused; each is the client's to fix (a 400).
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ImageError {
    #[error(
        "{at}: the image is {bytes} bytes; this server takes at most {max} (server.max_image_mb)"
    )]
    TooLarge {
        at: String,
        bytes: usize,
        max: usize,
    },
    #[error("{at}: the image is {width}×{height} pixels; this server takes at most {max} pixels (server.max_image_pixels)")]
    TooManyPixels {
        at: String,
        width: u32,
        height: u32,
        max: u64,
    },
    #[error("{n} images is more than this server takes in one request ({max}; server.max_images)")]
    TooMany { n: usize, max: usize },
    #[error("{at}: not a PNG, JPEG, WebP or GIF image")]
    NotAnImage { at: String },
    #[error("{at}: the image could not be decoded: {why}")]
    Broken { at: String, why: String },
    #[error("model '{model}' cannot read images: {why}")]
    NoVision { model: String, why: String },
}

/// An image as pixels, with the hash that identifies its content.
#[derive(Clone)]
pub struct DecodedImage {
    pub width: u32,
    pub height: u32,
    /// Row-major RGB, 3 bytes a pixel.
    pub rgb: Vec<u8>,
    /// SHA-256 over the size and the pixels: the same picture in another
    /// file format is the same image.
    pub digest: [u8; 32],
}

impl std::fmt::Debug for DecodedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodedImage")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("id", &hex(&self.digest[..8]))
            .finish()
    }
}

/// Decodes one image the client sent (`at` names it in errors).
pub fn decode(at: &str, bytes: &[u8], limits: &ImageLimits) -> Result<DecodedImage, ImageError> {
    if bytes.len() > limits.max_bytes {
        return Err(ImageError::TooLarge {
            at: at.into(),
            bytes: bytes.len(),
            max: limits.max_bytes,
        });
    }
    let reader = image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .map_err(|e| ImageError::Broken {
            at: at.into(),
            why: e.to_string(),
        })?;
    use image::ImageFormat as F;
    if !matches!(reader.format(), Some(F::Png | F::Jpeg | F::WebP | F::Gif)) {
        return Err(ImageError::NotAnImage { at: at.into() });
    }
    let broken = |e: image::ImageError| ImageError::Broken {
        at: at.into(),
        why: e.to_string(),
    };
    let decoder = reader.into_decoder().map_err(broken)?;
    let (width, height) = image::ImageDecoder::dimensions(&decoder);
    if u64::from(width) * u64::from(height) > limits.max_pixels {
        return Err(ImageError::TooManyPixels {
            at: at.into(),
            width,
            height,
            max: limits.max_pixels,
        });
    }
    if width == 0 || height == 0 {
        return Err(ImageError::Broken {
            at: at.into(),
            why: "it has no pixels".into(),
        });
    }
    // A GIF decodes to its first frame.
    let rgb = image::DynamicImage::from_decoder(decoder)
        .map_err(broken)?
        .to_rgb8()
        .into_raw();
    let mut h = Sha256::new();
    h.update(width.to_le_bytes());
    h.update(height.to_le_bytes());
    h.update(&rgb);
    Ok(DecodedImage {
        width,
        height,
        rgb,
        digest: h.finalize().into(),
    })
}

/// An image made ready for one model: how many positions it takes and the
/// backend's own prepared form of it.
pub struct PreparedImage {
    /// Hex of the content hash: the id the backend and the cache know it by.
    pub id: String,
    pub digest: [u8; 32],
    /// Tokens it takes in the prompt (its KV cells, and the image tokens of
    /// the usage).
    pub tokens: usize,
    /// Positions it takes in the model's sequence: its tokens, or fewer
    /// where the model lays an image out in 2-D (M-RoPE: the Qwen2-VL
    /// family), as llama.cpp's multimodal library reports.
    pub positions: usize,
    /// The backend's prepared image (llama.cpp's input chunks).
    pub payload: Box<dyn Any + Send + Sync>,
}

impl std::fmt::Debug for PreparedImage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PreparedImage")
            .field("id", &self.id)
            .field("tokens", &self.tokens)
            .finish()
    }
}

/// What a vision model does to an image before a request is queued: its
/// preprocessing and tokenization (no encoding: that runs on the engine
/// thread at prefill). Shared by every thread that builds prompts.
pub trait ImageReader: Send + Sync {
    fn prepare(&self, image: &DecodedImage) -> Result<PreparedImage>;
}

/// Whether a model reads images, and how.
#[derive(Clone, Default)]
pub struct Vision {
    /// The model's image reader, for a vision model.
    pub reader: Option<Arc<dyn ImageReader>>,
    /// Why a model with a projector beside it still reads text only.
    pub unavailable: Option<String>,
}

impl Vision {
    pub fn reads_images(&self) -> bool {
        self.reader.is_some()
    }

    /// Why the model `model` cannot read images, if it cannot.
    pub fn refusal(&self, model: &str) -> Option<ImageError> {
        if self.reader.is_some() {
            return None;
        }
        Some(ImageError::NoVision {
            model: model.into(),
            why: match &self.unavailable {
                Some(why) => format!("its projector did not load ({why})"),
                None => "it is not a vision model (a GGUF reads images with its projector, an mmproj-*.gguf file beside it or named by --mmproj)".into(),
            },
        })
    }

    /// `image` made ready for the model `model`, or why it cannot be.
    pub fn prepare(&self, model: &str, image: &DecodedImage) -> Result<PreparedImage> {
        match (&self.reader, self.refusal(model)) {
            (Some(r), _) => r.prepare(image),
            (None, Some(e)) => Err(e.into()),
            (None, None) => Err(EngineError::Unsupported("no image reader".into())),
        }
    }
}

/// Tokens of these images that take no position of their own (M-RoPE).
pub fn positions_saved(spans: &[ImageSpan]) -> usize {
    spans
        .iter()
        .map(|s| s.image.tokens.saturating_sub(s.image.positions))
        .sum()
}

/// One image's run of tokens in a request's prompt.
#[derive(Clone, Debug)]
pub struct ImageSpan {
    /// Index of its first position in the prompt.
    pub start: usize,
    pub image: Arc<PreparedImage>,
}

impl ImageSpan {
    pub fn len(&self) -> usize {
        self.image.tokens
    }

    pub fn is_empty(&self) -> bool {
        self.image.tokens == 0
    }

    pub fn end(&self) -> usize {
        self.start + self.image.tokens
    }
}

/// The placeholder ids an image stands as: derived from its content hash,
/// so the same picture gives the same run, with the high bit set so none is
/// a vocabulary id.
pub fn placeholders(image: &PreparedImage) -> impl Iterator<Item = u32> + '_ {
    let seed = u32::from_le_bytes([
        image.digest[0],
        image.digest[1],
        image.digest[2],
        image.digest[3],
    ]);
    (0..image.tokens).map(move |i| PLACEHOLDER | (seed.wrapping_add(i as u32) & !PLACEHOLDER))
}

/// Whether `id` stands for part of an image.
pub fn is_placeholder(id: u32) -> bool {
    id & PLACEHOLDER != 0
}

/// The first position at or after `len` where a prefix of a prompt may end
/// without cutting an image: `len` itself, or the start of the image it
/// falls inside.
pub fn whole_images(spans: &[ImageSpan], len: usize) -> usize {
    spans
        .iter()
        .find(|s| s.start < len && len < s.end())
        .map_or(len, |s| s.start)
}

/// User text with the image marker taken out, so only the server places it.
pub fn scrub(text: &str) -> std::borrow::Cow<'_, str> {
    if text.contains(MARKER) {
        std::borrow::Cow::Owned(text.replace(MARKER, ""))
    } else {
        std::borrow::Cow::Borrowed(text)
    }
}

/// Tokens of a rendered prompt whose text holds one [`MARKER`] per image,
/// in order: each text piece tokenized (BOS only at the very start), each
/// marker replaced by its image's placeholders.
pub fn encode_with_images(
    text: &str,
    images: &[Arc<PreparedImage>],
    mut encode: impl FnMut(&str, bool) -> Result<Vec<u32>>,
) -> Result<(Vec<u32>, Vec<ImageSpan>)> {
    let pieces: Vec<&str> = text.split(MARKER).collect();
    if pieces.len() != images.len() + 1 {
        return Err(EngineError::InvalidRequest(format!(
            "the prompt has {} image places for {} images (the model's chat template dropped or repeated an image)",
            pieces.len() - 1,
            images.len()
        )));
    }
    if !images.is_empty() && pieces.last().is_some_and(|p| p.is_empty()) {
        return Err(EngineError::InvalidRequest(
            "an image cannot be the last part of the prompt; add text after it".into(),
        ));
    }
    let mut tokens = Vec::new();
    let mut spans = Vec::with_capacity(images.len());
    for (i, piece) in pieces.iter().enumerate() {
        if i == 0 || !piece.is_empty() {
            tokens.extend(encode(piece, i == 0)?);
        }
        if let Some(image) = images.get(i) {
            spans.push(ImageSpan {
                start: tokens.len(),
                image: image.clone(),
            });
            tokens.extend(placeholders(image));
        }
    }
    Ok((tokens, spans))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Hex of a digest (an image's id).
pub fn digest_id(digest: &[u8; 32]) -> String {
    hex(digest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(w: u32, h: u32, rgb: [u8; 3]) -> Vec<u8> {
        let img = image::RgbImage::from_pixel(w, h, image::Rgb(rgb));
        let mut out = Cursor::new(Vec::new());
        img.write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    fn prepared(tokens: usize, first: u8) -> Arc<PreparedImage> {
        let mut digest = [0u8; 32];
        digest[0] = first;
        Arc::new(PreparedImage {
            id: digest_id(&digest),
            digest,
            tokens,
            positions: tokens,
            payload: Box::new(()),
        })
    }

    #[test]
    fn a_png_decodes_to_its_pixels_and_the_same_picture_hashes_alike() {
        let limits = ImageLimits::default();
        let a = decode("img", &png(3, 2, [10, 20, 30]), &limits).unwrap();
        assert_eq!((a.width, a.height, a.rgb.len()), (3, 2, 18));
        assert_eq!(&a.rgb[..3], &[10, 20, 30]);
        let b = decode("img", &png(3, 2, [10, 20, 30]), &limits).unwrap();
        assert_eq!(a.digest, b.digest);
        let c = decode("img", &png(3, 2, [10, 20, 31]), &limits).unwrap();
        assert_ne!(a.digest, c.digest);
    }

    #[test]
    fn jpeg_webp_and_a_gifs_first_frame_decode_too() {
        let limits = ImageLimits::default();
        let img = image::RgbImage::from_pixel(6, 4, image::Rgb([200, 30, 30]));
        for format in [image::ImageFormat::Jpeg, image::ImageFormat::WebP] {
            let mut out = Cursor::new(Vec::new());
            img.write_to(&mut out, format).unwrap();
            let d = decode("img", out.get_ref(), &limits).unwrap();
            assert_eq!((d.width, d.height), (6, 4), "{format:?}");
            // Lossy or not, the picture is still red.
            assert!(
                d.rgb[0] > 150 && d.rgb[1] < 80,
                "{format:?}: {:?}",
                &d.rgb[..3]
            );
        }
        // An animated GIF: its first frame (red), not the second (blue).
        let mut gif = Vec::new();
        {
            let mut enc = image::codecs::gif::GifEncoder::new(&mut gif);
            for rgb in [[255, 0, 0], [0, 0, 255]] {
                let frame =
                    image::RgbaImage::from_pixel(5, 5, image::Rgba([rgb[0], rgb[1], rgb[2], 255]));
                enc.encode_frame(image::Frame::new(frame)).unwrap();
            }
        }
        let d = decode("gif", &gif, &limits).unwrap();
        assert_eq!((d.width, d.height), (5, 5));
        assert!(d.rgb[0] > 200 && d.rgb[2] < 50, "{:?}", &d.rgb[..3]);
    }

    #[test]
    fn bad_images_are_refused_with_what_is_wrong() {
        let limits = ImageLimits {
            max_bytes: 1000,
            max_images: 2,
            max_pixels: 100,
        };
        let good = png(10, 10, [1, 2, 3]);
        assert!(decode("a", &good, &limits).is_ok());
        assert!(matches!(
            decode("a", &png(11, 10, [1, 2, 3]), &limits),
            Err(ImageError::TooManyPixels {
                width: 11,
                height: 10,
                ..
            })
        ));
        assert!(matches!(
            decode("a", &vec![0u8; 1001], &limits),
            Err(ImageError::TooLarge { bytes: 1001, .. })
        ));
        assert_eq!(
            decode("a", b"hello, not an image", &limits).err(),
            Some(ImageError::NotAnImage { at: "a".into() })
        );
        // A PNG cut short is a PNG that does not decode.
        let cut = &good[..good.len() / 2];
        assert!(matches!(
            decode("a", cut, &limits),
            Err(ImageError::Broken { .. })
        ));
    }

    #[test]
    fn images_stand_in_the_prompt_as_placeholders_of_their_length() {
        let (a, b) = (prepared(3, 1), prepared(2, 2));
        let text = format!("start {MARKER} middle {MARKER}.");
        let (tokens, spans) = encode_with_images(&text, &[a.clone(), b.clone()], |t, first| {
            let mut v: Vec<u32> = t.bytes().filter(|c| *c != b' ').map(u32::from).collect();
            if first {
                v.insert(0, 1);
            }
            Ok(v)
        })
        .unwrap();
        // BOS + "start" (5), image a (3), "middle" (6), image b (2), ".".
        assert_eq!(tokens.len(), 1 + 5 + 3 + 6 + 2 + 1);
        assert_eq!((spans[0].start, spans[0].end()), (6, 9));
        assert_eq!((spans[1].start, spans[1].end()), (15, 17));
        assert!(tokens[6..9].iter().all(|&t| is_placeholder(t)));
        assert!(!tokens[..6].iter().any(|&t| is_placeholder(t)));
        // Another picture differs at its first position; the same one agrees.
        assert_ne!(placeholders(&a).next(), placeholders(&b).next());
        assert!(placeholders(&a).eq(placeholders(&prepared(3, 1))));
        // A prefix never ends inside an image.
        assert_eq!(whole_images(&spans, 7), 6);
        assert_eq!(whole_images(&spans, 9), 9);
        assert_eq!(whole_images(&spans, 3), 3);
        // A marker count that does not match is an error, not a guess.
        assert!(encode_with_images(MARKER, &[], |_, _| Ok(vec![])).is_err());
        // Nor may an image end the prompt: nothing would follow to predict from.
        assert!(encode_with_images(MARKER, std::slice::from_ref(&a), |_, _| Ok(vec![])).is_err());
        assert_eq!(scrub(&format!("a{MARKER}b")), "ab");
    }
}
