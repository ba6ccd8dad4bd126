//! Images a request carries, gathered by every dialect alike: each dialect
//! reads its own wire form (OpenAI's `image_url` part, Responses'
//! `input_image`, Anthropic's `image` block, Ollama's `images`) into
//! [`Images`] and puts [`MARKER`] where the image sits in the message text;
//! [`Served::prepare_images`] then decodes them under the server's limits
//! and makes them ready for the model, or refuses them with a 400 that says
//! why (not an image, too large, too many, a model that cannot see).
use std::sync::Arc;

use base64::Engine as _;
use shoal_engine::vision::{self, ImageError, PreparedImage};

use crate::error::ApiError;
use crate::state::Served;

pub use shoal_engine::vision::MARKER;

/// One image as the client sent it: its bytes, or the web address to
/// fetch them from (only where `server.fetch_image_urls` allows).
#[derive(Clone)]
pub struct ImageSource {
    /// Where it was in the request, for errors (`messages[0].content[1]`).
    pub at: String,
    pub bytes: Arc<[u8]>,
    pub url: Option<String>,
}

/// How long fetching one image may take.
const FETCH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A request's images, in the order their markers sit in its messages.
#[derive(Default)]
pub struct Images {
    pub sources: Vec<ImageSource>,
}

impl Images {
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    pub fn len(&self) -> usize {
        self.sources.len()
    }

    /// An image given by URL: a `data:` URL is read; an http(s) one is
    /// fetched when the model is run, if the server allows it. Returns the
    /// marker to put in the text.
    pub fn push_url(&mut self, at: &str, url: &str) -> Result<&'static str, ApiError> {
        let Some(rest) = url.strip_prefix("data:") else {
            let scheme = url.split(':').next().unwrap_or("").to_ascii_lowercase();
            if scheme == "http" || scheme == "https" {
                self.sources.push(ImageSource {
                    at: at.to_string(),
                    bytes: Arc::from(Vec::new()),
                    url: Some(url.to_string()),
                });
                return Ok(MARKER);
            }
            return Err(ApiError::param(
                at,
                format!("{at}: an image URL must be data: (data:image/png;base64,…) or http(s):, not '{scheme}:'"),
            ));
        };
        let Some((meta, data)) = rest.split_once(',') else {
            return Err(ApiError::param(
                at,
                format!("{at}: a data: URL needs a ',' before its data"),
            ));
        };
        if !meta.ends_with(";base64") {
            return Err(ApiError::param(
                at,
                format!("{at}: an image's data: URL must be base64 (data:image/png;base64,…)"),
            ));
        }
        self.push_base64(at, data)
    }

    /// An image given as base64 text (Anthropic's and Ollama's form).
    pub fn push_base64(&mut self, at: &str, data: &str) -> Result<&'static str, ApiError> {
        let bytes = base64_bytes(at, data)?;
        self.sources.push(ImageSource {
            at: at.to_string(),
            bytes: bytes.into(),
            url: None,
        });
        Ok(MARKER)
    }
}

/// An image's bytes from its base64 text (line breaks and spaces allowed),
/// or a 400 naming where it was.
pub fn base64_bytes(at: &str, data: &str) -> Result<Vec<u8>, ApiError> {
    let clean: String = data.chars().filter(|c| !c.is_ascii_whitespace()).collect();
    base64::engine::general_purpose::STANDARD
        .decode(clean.as_bytes())
        .map_err(|e| ApiError::param(at, format!("{at}: the image is not valid base64: {e}")))
}

/// Text a client wrote, with the image marker taken out of it, so only the
/// server places images.
pub fn user_text(text: &str) -> std::borrow::Cow<'_, str> {
    vision::scrub(text)
}

impl From<ImageError> for ApiError {
    fn from(e: ImageError) -> Self {
        let param = match &e {
            ImageError::TooLarge { at, .. }
            | ImageError::TooManyPixels { at, .. }
            | ImageError::NotAnImage { at }
            | ImageError::Broken { at, .. } => at.clone(),
            ImageError::TooMany { .. } | ImageError::NoVision { .. } => "messages".into(),
        };
        ApiError::param(&param, e.to_string())
    }
}

impl Served {
    /// The request's images decoded under the server's limits and made
    /// ready for its model.
    pub fn prepare_images(&self, images: &Images) -> Result<Vec<Arc<PreparedImage>>, ApiError> {
        if images.is_empty() {
            return Ok(Vec::new());
        }
        let limits = self.access.images;
        let vocab = &self.engine.model.vocab;
        if let Some(e) = vocab.vision.refusal(&self.engine.model.id) {
            // Said before any decoding: the model is the problem, not the picture.
            return Err(e.into());
        }
        if images.len() > limits.max_images {
            return Err(ImageError::TooMany {
                n: images.len(),
                max: limits.max_images,
            }
            .into());
        }
        images
            .sources
            .iter()
            .map(|s| {
                let fetched;
                let bytes: &[u8] = match &s.url {
                    None => &s.bytes,
                    Some(url) => {
                        fetched = self.fetch_image(&s.at, url)?;
                        &fetched
                    }
                };
                let decoded = vision::decode(&s.at, bytes, &limits)?;
                Ok(Arc::new(
                    vocab.vision.prepare(&self.engine.model.id, &decoded)?,
                ))
            })
            .collect()
    }

    /// An image's bytes from its web address, if the server fetches for
    /// clients (`server.fetch_image_urls`; off by default: a server that
    /// fetches what a client names can be made to reach what the client
    /// cannot). At most the image byte limit is read, within 30 s.
    fn fetch_image(&self, at: &str, url: &str) -> Result<Vec<u8>, ApiError> {
        if !self.access.fetch_image_urls {
            return Err(ApiError::param(
                at,
                format!(
                    "{at}: this server does not fetch image URLs for clients (server.fetch_image_urls is off); send the image as a data: URL or base64"
                ),
            ));
        }
        let max = self.access.images.max_bytes;
        let fail = |why: String| {
            ApiError::param(
                at,
                format!("{at}: could not fetch the image at {url}: {why}"),
            )
        };
        // The request's handler is not async here: a thread of its own, with
        // a runtime of its own, fetches.
        let url_owned = url.to_string();
        let fetch = || {
            std::thread::scope(|scope| {
                scope
                    .spawn(move || -> Result<Vec<u8>, String> {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map_err(|e| e.to_string())?;
                        rt.block_on(async move {
                            let client = reqwest::Client::builder()
                                .timeout(FETCH_TIMEOUT)
                                .build()
                                .map_err(|e| e.to_string())?;
                            let mut resp = client
                                .get(&url_owned)
                                .send()
                                .await
                                .map_err(|e| e.to_string())?;
                            if !resp.status().is_success() {
                                return Err(format!("HTTP {}", resp.status().as_u16()));
                            }
                            let mut body = Vec::new();
                            while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
                                body.extend_from_slice(&chunk);
                                if body.len() > max {
                                    return Err(format!(
                                        "it is over {max} bytes (server.max_image_mb)"
                                    ));
                                }
                            }
                            Ok(body)
                        })
                    })
                    .join()
                    .unwrap_or_else(|_| Err("the fetch failed".into()))
            })
        };
        // This worker waits: its queued tasks go to the others meanwhile
        // (the fetched address may be served by this very process).
        let got = match tokio::runtime::Handle::try_current() {
            Ok(h) if h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread => {
                tokio::task::block_in_place(fetch)
            }
            _ => fetch(),
        };
        got.map_err(fail)
    }
}
