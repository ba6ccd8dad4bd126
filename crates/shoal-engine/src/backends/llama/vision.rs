//! Vision models on llama.cpp: a GGUF's projector file (`mmproj-*.gguf`)
//! loaded by llama.cpp's multimodal library (`mtmd`), which preprocesses an
//! image, tokenizes it into the positions it takes, and at prefill encodes
//! it and decodes its embeddings into a sequence.
//!
//! Images reach this file already decoded to RGB by [`crate::vision`]; the
//! library's own file decoding is never used.
use std::ffi::CString;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use llama_cpp_2::context::LlamaContext;
use llama_cpp_2::model::LlamaModel;
use llama_cpp_2::mtmd::{
    mtmd_default_marker, MtmdBitmap, MtmdContext, MtmdContextParams, MtmdInputChunks, MtmdInputText,
};

use crate::error::{EngineError, Result};
use crate::vision::{digest_id, DecodedImage, ImageReader, PreparedImage};

/// The projector of the model at `model`: the first `mmproj*.gguf` in its
/// folder (where a hub pull puts it, and how LM Studio and Ollama lay one
/// out), if there is one.
pub fn projector_beside(model: &Path) -> Option<PathBuf> {
    let dir = model.parent()?;
    let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                let n = n.to_ascii_lowercase();
                n.starts_with("mmproj") && n.ends_with(".gguf")
            }) && p.as_path() != model
        })
        .collect();
    found.sort();
    found.into_iter().next()
}

/// A model's projector, shared by the threads that prepare prompts and the
/// engine thread that runs them. The multimodal context points into the
/// text model, which it therefore keeps alive.
pub struct LlamaVision {
    ctx: Mutex<MtmdContext>,
    /// Declared after `ctx`, so it is dropped after it.
    _model: Arc<LlamaModel>,
    marker: String,
}

/// An image's input chunks (the positions it takes, and what the encoder
/// reads at prefill).
struct Chunks(MtmdInputChunks);

impl LlamaVision {
    /// Loads the projector at `path` for `model`.
    pub fn load(path: &Path, model: Arc<LlamaModel>, threads: usize) -> Result<Self> {
        let marker = mtmd_default_marker().to_string();
        let params = MtmdContextParams {
            use_gpu: cfg!(target_os = "macos"),
            print_timings: false,
            n_threads: i32::try_from(threads.max(1)).unwrap_or(1),
            media_marker: CString::new(marker.clone())
                .map_err(|e| EngineError::Backend(e.to_string()))?,
            image_min_tokens: -1,
            image_max_tokens: -1,
        };
        let where_ = path.display().to_string();
        let ctx = MtmdContext::init_from_file(&where_, &model, &params).map_err(|e| {
            EngineError::InvalidModel(format!(
                "llama.cpp could not load the projector {where_}: {e} (is it the projector of this model?)"
            ))
        })?;
        if !ctx.support_vision() {
            return Err(EngineError::Unsupported(format!(
                "{where_} has no vision encoder (audio projectors are not supported)"
            )));
        }
        Ok(LlamaVision {
            ctx: Mutex::new(ctx),
            _model: model,
            marker,
        })
    }

    fn lock(&self) -> MutexGuard<'_, MtmdContext> {
        self.ctx.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Encodes `image` and decodes it into sequence `seq` of `llama` from
    /// position `at`. Returns the position after it.
    pub(super) fn eval(
        &self,
        image: &PreparedImage,
        llama: &mut LlamaContext,
        at: usize,
        seq: i32,
        n_batch: usize,
    ) -> Result<usize> {
        let chunks = image
            .payload
            .downcast_ref::<Chunks>()
            .ok_or_else(|| EngineError::Backend("an image prepared by another model".into()))?;
        let n_past =
            i32::try_from(at).map_err(|_| EngineError::Backend("position out of range".into()))?;
        let mut mtmd = self.lock();
        let end = chunks
            .0
            .eval_chunks(
                &mut mtmd,
                llama,
                n_past,
                seq,
                i32::try_from(n_batch).unwrap_or(i32::MAX),
                false,
            )
            .map_err(|e| EngineError::Backend(format!("llama.cpp image: {e}")))?;
        usize::try_from(end).map_err(|_| EngineError::Backend("position out of range".into()))
    }
}

impl ImageReader for LlamaVision {
    fn prepare(&self, image: &DecodedImage) -> Result<PreparedImage> {
        let id = digest_id(&image.digest);
        let mut bitmap = MtmdBitmap::from_image_data(image.width, image.height, &image.rgb)
            .map_err(|e| EngineError::Backend(format!("llama.cpp image: {e}")))?;
        bitmap
            .set_id(&id)
            .map_err(|e| EngineError::Backend(e.to_string()))?;
        let text = MtmdInputText {
            text: self.marker.clone(),
            add_special: false,
            parse_special: true,
        };
        let chunks = self.lock().tokenize(text, &[&bitmap]).map_err(|e| {
            EngineError::InvalidRequest(format!("the image could not be prepared: {e}"))
        })?;
        // Models with M-RoPE positions (Qwen2-VL and its kind) lay an image
        // out in 2-D: it takes fewer positions than tokens, and the text
        // after it goes on from its last position (`LlamaKv::shifts`).
        let tokens = chunks.total_tokens();
        let positions = usize::try_from(chunks.total_positions()).unwrap_or(0);
        if tokens == 0 || positions == 0 || positions > tokens {
            return Err(EngineError::Backend(format!(
                "the projector laid an image out in {tokens} tokens over {positions} positions"
            )));
        }
        Ok(PreparedImage {
            id,
            digest: image.digest,
            tokens,
            positions,
            payload: Box::new(Chunks(chunks)),
        })
    }
}
