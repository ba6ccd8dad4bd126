//! What a model on disk is, read from its headers without loading it:
//! architecture, quantization, context length, parameter count and size.
//! `shoal models`, `/v1/models` and the memory check before a load use it.
use std::fs::File;
use std::io::{BufReader, Read};
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

/// llama.cpp's `general.file_type` numbers.
fn file_type_name(n: u64) -> String {
    let name = match n {
        0 => "F32",
        1 => "F16",
        2 => "Q4_0",
        3 => "Q4_1",
        7 => "Q8_0",
        8 => "Q5_0",
        9 => "Q5_1",
        10 => "Q2_K",
        11 => "Q3_K_S",
        12 => "Q3_K_M",
        13 => "Q3_K_L",
        14 => "Q4_K_S",
        15 => "Q4_K_M",
        16 => "Q5_K_S",
        17 => "Q5_K_M",
        18 => "Q6_K",
        32 => "BF16",
        _ => return format!("file type {n}"),
    };
    name.to_string()
}

/// A metadata value, kept only as far as the card needs it.
enum Meta {
    Uint(u64),
    Str(String),
    Other,
}

/// Reads the GGUF header: metadata and tensor shapes, never the weights.
fn read_gguf(path: &Path) -> Result<ModelCard> {
    let size_bytes = std::fs::metadata(path)?.len();
    let mut r = GgufReader {
        r: BufReader::new(File::open(path)?),
        path,
    };
    if &r.bytes::<4>()? != b"GGUF" {
        return Err(bad(path, "not a GGUF file"));
    }
    let version = u32::from_le_bytes(r.bytes()?);
    if !(2..=3).contains(&version) {
        return Err(bad(path, format!("GGUF version {version}")));
    }
    let tensors = r.u64()?;
    let kvs = r.u64()?;
    let mut meta = std::collections::HashMap::new();
    for _ in 0..kvs {
        let key = r.string()?;
        let ty = u32::from_le_bytes(r.bytes()?);
        let value = r.value(ty)?;
        meta.insert(key, value);
    }
    let mut parameters = 0u64;
    for _ in 0..tensors {
        r.string()?;
        let dims = u32::from_le_bytes(r.bytes()?);
        if dims > 8 {
            return Err(bad(path, format!("tensor with {dims} dimensions")));
        }
        let mut elems = 1u64;
        for _ in 0..dims {
            elems = elems.saturating_mul(r.u64()?);
        }
        r.bytes::<12>()?; // type and offset
        parameters = parameters.saturating_add(elems);
    }
    let text = |k: &str| match meta.get(k) {
        Some(Meta::Str(s)) => Some(s.clone()),
        _ => None,
    };
    let number = |k: &str| match meta.get(k) {
        Some(Meta::Uint(n)) => Some(*n),
        _ => None,
    };
    let architecture = text("general.architecture");
    let context_length = architecture
        .as_ref()
        .and_then(|a| number(&format!("{a}.context_length")));
    let layers = architecture
        .as_ref()
        .and_then(|a| number(&format!("{a}.block_count")));
    Ok(ModelCard {
        format: "gguf".into(),
        quantization: number("general.file_type").map(file_type_name),
        architecture,
        context_length,
        layers,
        parameters,
        size_bytes,
    })
}

struct GgufReader<'a> {
    r: BufReader<File>,
    path: &'a Path,
}

impl GgufReader<'_> {
    fn bytes<const N: usize>(&mut self) -> Result<[u8; N]> {
        let mut b = [0u8; N];
        self.r
            .read_exact(&mut b)
            .map_err(|e| bad(self.path, format!("truncated header: {e}")))?;
        Ok(b)
    }

    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.bytes()?))
    }

    fn string(&mut self) -> Result<String> {
        let len = self.u64()?;
        if len > 1 << 24 {
            return Err(bad(self.path, format!("string of {len} bytes")));
        }
        let mut s = vec![0u8; len as usize];
        self.r
            .read_exact(&mut s)
            .map_err(|e| bad(self.path, format!("truncated header: {e}")))?;
        Ok(String::from_utf8_lossy(&s).into_owned())
    }

    /// Reads one value of GGUF type `ty`; arrays are read and dropped.
    fn value(&mut self, ty: u32) -> Result<Meta> {
        Ok(match ty {
            0 | 1 | 7 => Meta::Uint(u64::from(self.bytes::<1>()?[0])),
            2 | 3 => Meta::Uint(u64::from(u16::from_le_bytes(self.bytes()?))),
            4 | 5 => Meta::Uint(u64::from(u32::from_le_bytes(self.bytes()?))),
            6 => {
                self.bytes::<4>()?;
                Meta::Other
            }
            8 => Meta::Str(self.string()?),
            9 => {
                let inner = u32::from_le_bytes(self.bytes()?);
                let n = self.u64()?;
                if inner == 9 {
                    return Err(bad(self.path, "nested arrays"));
                }
                for _ in 0..n {
                    self.value(inner)?;
                }
                Meta::Other
            }
            10 | 11 => Meta::Uint(self.u64()?),
            12 => {
                self.bytes::<8>()?;
                Meta::Other
            }
            _ => return Err(bad(self.path, format!("unknown value type {ty}"))),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::fixture::{gguf_bytes, safetensors_bytes};

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
        assert!(err.contains("truncated"), "{err}");
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
