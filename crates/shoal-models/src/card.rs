//! What a model on disk is, read from its headers without loading it:
//! architecture, quantization, context length, parameter count and size.
//! `shoal models`, `/v1/models` and the memory check before a load use it.
use std::fs::File;
use std::io::Read;
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::error::{ModelsError, Result};

/// Facts about one model, from its files alone.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct ModelCard {
    /// `gguf` or `safetensors`.
    pub format: String,
    pub architecture: Option<String>,
    /// `Q4_1`, `4-bit g64`, `bfloat16`…
    pub quantization: Option<String>,
    pub context_length: Option<u64>,
    /// Transformer blocks (how a pipeline splits the model).
    pub layers: Option<u64>,
    /// Weights, counted as the unquantized elements they stand for.
    pub parameters: u64,
    /// Bytes the model's files take on disk.
    pub size_bytes: u64,
    /// An embedding model's pooling (`mean`, `cls`, `last`); `None` for a
    /// model that generates text.
    pub embedding_pooling: Option<String>,
    /// Width of the model's hidden states (an embedding model's vector length).
    pub embedding_length: Option<u64>,
}

impl ModelCard {
    /// Reads a `.gguf` file or a Hugging Face / MLX model directory.
    pub fn read(path: &Path) -> Result<ModelCard> {
        if path.is_dir() {
            read_dir(path)
        } else {
            read_gguf(path)
        }
    }

    /// Memory the engine will need for the weights on this machine: the CPU
    /// backend computes with dense float32, Metal keeps quantized weights as
    /// they are on disk.
    pub fn weight_memory(&self, gpu: bool) -> u64 {
        if gpu {
            self.size_bytes
        } else {
            self.parameters.saturating_mul(4)
        }
    }
}

fn bad(path: &Path, why: impl std::fmt::Display) -> ModelsError {
    ModelsError::Unreadable {
        path: path.to_path_buf(),
        why: why.to_string(),
    }
}

fn read_dir(dir: &Path) -> Result<ModelCard> {
    let cfg_path = dir.join("config.json");
    let cfg: Value =
        serde_json::from_slice(&std::fs::read(&cfg_path)?).map_err(|e| bad(&cfg_path, e))?;
    let quant = cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"));
    let bits = quant.and_then(|q| q.get("bits")).and_then(Value::as_u64);
    let quantization = match bits {
        Some(b) => {
            let group = quant
                .and_then(|q| q.get("group_size"))
                .and_then(Value::as_u64)
                .unwrap_or(64);
            Some(format!("{b}-bit g{group}"))
        }
        None => cfg
            .get("torch_dtype")
            .and_then(Value::as_str)
            .map(str::to_string),
    };
    let architecture = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .map(str::to_string);
    let context_length = cfg.get("max_position_embeddings").and_then(Value::as_u64);
    let layers = cfg.get("num_hidden_layers").and_then(Value::as_u64);
    let mut card = ModelCard {
        format: "safetensors".into(),
        architecture,
        quantization,
        context_length,
        layers,
        ..ModelCard::default()
    };
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        // Symlinks into a hub cache's blobs count as the blobs' size.
        let len = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        card.size_bytes += len;
        if path.extension().is_some_and(|e| e == "safetensors") {
            card.parameters += safetensors_parameters(&path, bits)?;
        }
    }
    if card.parameters == 0 {
        return Err(bad(dir, "no .safetensors weights"));
    }
    Ok(card)
}

/// Elements in a safetensors file, packed quantized words unpacked to the
/// weights they hold; quantization scales and biases are not parameters.
fn safetensors_parameters(path: &Path, bits: Option<u64>) -> Result<u64> {
    let mut f = File::open(path)?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(bad(path, format!("header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)?;
    let header: serde_json::Map<String, Value> =
        serde_json::from_slice(&header).map_err(|e| bad(path, e))?;
    let mut total = 0u64;
    for (name, t) in &header {
        if name == "__metadata__" || name.ends_with(".scales") || name.ends_with(".biases") {
            continue;
        }
        let elems: u64 = t
            .get("shape")
            .and_then(Value::as_array)
            .map(|s| s.iter().filter_map(Value::as_u64).product())
            .unwrap_or(0);
        let packed = t.get("dtype").and_then(Value::as_str) == Some("U32");
        total += match (packed, bits) {
            (true, Some(b)) if b > 0 => elems * 32 / b,
            _ => elems,
        };
    }
    Ok(total)
}

/// Reads the GGUF header: metadata and tensor shapes, never the weights.
fn read_gguf(path: &Path) -> Result<ModelCard> {
    let h = shoal_gguf::Header::read(path).map_err(|e| match e {
        shoal_gguf::GgufError::Io { source, .. } => ModelsError::Io(source),
        shoal_gguf::GgufError::Malformed { why, .. } => bad(path, why),
        shoal_gguf::GgufError::CutShort { at, .. } => {
            bad(path, format!("the header is cut short at byte {at}"))
        }
    })?;
    Ok(ModelCard::of_gguf(&h))
}

impl ModelCard {
    /// What a GGUF header says of its model (the header's `file_len` is the size).
    pub fn of_gguf(h: &shoal_gguf::Header) -> ModelCard {
        ModelCard {
            format: "gguf".into(),
            quantization: h.file_type(),
            architecture: h.architecture().map(str::to_string),
            context_length: h.arch_uint("context_length"),
            layers: h.arch_uint("block_count"),
            parameters: h
                .tensors
                .iter()
                .fold(0u64, |a, t| a.saturating_add(t.elements())),
            size_bytes: h.file_len,
            embedding_pooling: h.embedding_pooling().map(str::to_string),
            embedding_length: h.arch_uint("embedding_length"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use shoal_hub_fixture::{gguf_bytes, safetensors_bytes};

    fn tiny_gguf() -> Vec<u8> {
        gguf_bytes(
            "llama",
            3,
            8192,
            &[("token_embd.weight", &[64, 10]), ("norm", &[64])],
        )
    }

    fn temp(name: &str) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("shoal-card-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn gguf_header_gives_the_card() {
        let dir = temp("gguf");
        let path = dir.join("m.gguf");
        let bytes = tiny_gguf();
        std::fs::write(&path, &bytes).unwrap();
        let card = ModelCard::read(&path).unwrap();
        assert_eq!(card.architecture.as_deref(), Some("llama"));
        assert_eq!(card.context_length, Some(8192));
        assert_eq!(card.quantization.as_deref(), Some("Q4_1"));
        assert_eq!(card.parameters, 64 * 10 + 64);
        assert_eq!(card.size_bytes, bytes.len() as u64);
        assert_eq!(card.weight_memory(false), (64 * 10 + 64) * 4);
    }

    #[test]
    fn truncated_or_foreign_gguf_is_an_error() {
        let dir = temp("bad");
        let path = dir.join("m.gguf");
        let bytes = tiny_gguf();
        std::fs::write(&path, &bytes[..bytes.len() - 20]).unwrap();
        let err = ModelCard::read(&path).unwrap_err().to_string();
        assert!(err.contains("cut short"), "{err}");
        std::fs::write(&path, b"PK\x03\x04 not a model").unwrap();
        let err = ModelCard::read(&path).unwrap_err().to_string();
        assert!(err.contains("not a GGUF"), "{err}");
    }

    #[test]
    fn mlx_directory_counts_packed_weights_unpacked() {
        let dir = temp("mlx");
        std::fs::write(
            dir.join("config.json"),
            r#"{"model_type":"qwen3","max_position_embeddings":40960,
                "quantization":{"bits":4,"group_size":64}}"#,
        )
        .unwrap();
        let st = safetensors_bytes(&[
            ("w.weight", "U32", &[8, 16]),
            ("w.scales", "F16", &[8, 2]),
            ("norm.weight", "F16", &[128]),
        ]);
        std::fs::write(dir.join("model.safetensors"), &st).unwrap();
        let card = ModelCard::read(&dir).unwrap();
        assert_eq!(card.architecture.as_deref(), Some("qwen3"));
        assert_eq!(card.quantization.as_deref(), Some("4-bit g64"));
        assert_eq!(card.context_length, Some(40960));
        assert_eq!(card.parameters, 8 * 16 * 8 + 128);
        assert!(card.size_bytes > st.len() as u64);
    }
}
