//! The two engines behind the seam in [`crate::backend`] and the choice
//! between them: MLX for Hugging Face / MLX directories (and, on Metal, the
//! GGUF files MLX can read), llama.cpp for GGUF files.
use std::path::Path;

use crate::backend::BackendKind;
use crate::error::{EngineError, Result};

pub mod llama;
pub mod mlx;

/// Which backend a user asked for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// MLX for directories, llama.cpp for GGUF (see [`choose`]).
    #[default]
    Auto,
    Mlx,
    Llama,
}

impl std::str::FromStr for BackendChoice {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "auto" => Ok(BackendChoice::Auto),
            "mlx" => Ok(BackendChoice::Mlx),
            "llama" | "llama.cpp" | "llamacpp" => Ok(BackendChoice::Llama),
            other => Err(format!(
                "unknown backend {other:?} (choose auto, mlx or llama)"
            )),
        }
    }
}

impl std::fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            BackendChoice::Auto => "auto",
            BackendChoice::Mlx => "mlx",
            BackendChoice::Llama => "llama",
        })
    }
}

/// GGUF tensor types MLX's loader reads (`ggml_type` numbers: F32, F16,
/// Q4_0, Q4_1, Q8_0).
const MLX_GGUF_TYPES: &[u32] = &[0, 1, 2, 3, 8];

/// Whether MLX can load this GGUF: its architecture, its vocabulary kind and
/// every tensor type.
pub fn mlx_reads(header: &shoal_gguf::Header) -> std::result::Result<(), String> {
    let arch = header.architecture().unwrap_or("unknown");
    let archs = mlx::gguf::GGUF_ARCHITECTURES;
    if !archs.contains(&arch) {
        return Err(format!(
            "MLX runs GGUF files of {} but the file's architecture is {arch:?}",
            archs.join(", ")
        ));
    }
    let space = match header.metadata.get("tokenizer.ggml.add_space_prefix") {
        Some(shoal_gguf::Value::Bool(b)) => Some(*b),
        _ => None,
    };
    crate::tokenizer::rebuilds(
        header.string("tokenizer.ggml.model"),
        header.string("tokenizer.ggml.pre"),
        space,
    )
    .map_err(|why| format!("MLX does not rebuild {why}"))?;
    if let Some(t) = header
        .tensors
        .iter()
        .find(|t| !MLX_GGUF_TYPES.contains(&t.ggml_type))
    {
        return Err(format!(
            "MLX's GGUF loader reads F32, F16, Q4_0, Q4_1 and Q8_0 tensors, not {} ({})",
            type_name(t.ggml_type),
            t.name
        ));
    }
    Ok(())
}

/// The backend that runs `path` for `choice`, after the checks that keep a
/// bad file away from native code.
///
/// `auto` sends directories to MLX and GGUF files to llama.cpp. On macOS a
/// GGUF that MLX reads whole (its tensor types and architecture) goes to MLX
/// instead: there MLX computes on Metal with the quantized weights as they
/// are, and on Apple silicon its decode is the faster of the two (published
/// M-series figures put mlx_lm well ahead of llama.cpp); this machine has no
/// Metal, so that half of the rule is not measured here.
pub fn choose(path: &Path, choice: BackendChoice) -> Result<BackendKind> {
    route(path, choice).map(|r| r.backend)
}

/// Where a model goes, with the GGUF header read on the way (for the loader
/// and memory estimates, so the file is not parsed twice).
pub struct Route {
    pub backend: BackendKind,
    /// The checked header of a GGUF file; `None` for a model directory.
    pub header: Option<shoal_gguf::Header>,
}

/// [`choose`], keeping the header it read.
pub fn route(path: &Path, choice: BackendChoice) -> Result<Route> {
    if path.is_dir() {
        return match choice {
            BackendChoice::Llama => Err(EngineError::Unsupported(format!(
                "{}: llama.cpp runs GGUF files; this is a model directory (use the mlx backend)",
                path.display()
            ))),
            _ => {
                mlx::hf::architecture(path)?;
                Ok(Route {
                    backend: BackendKind::Mlx,
                    header: None,
                })
            }
        };
    }
    if !path.is_file() {
        return Err(EngineError::MissingModelPart {
            what: "model".into(),
            detail: format!("{} does not exist", path.display()),
        });
    }
    if path.extension().is_none_or(|e| e != "gguf") {
        return Err(EngineError::Unsupported(format!(
            "{}: expected a .gguf file or a model directory",
            path.display()
        )));
    }
    route_gguf(check_gguf(path)?, choice, path)
}

/// [`route`] for a GGUF file whose header is read already (from a file not
/// downloaded yet, say); `path` names it in errors.
pub fn route_gguf(header: shoal_gguf::Header, choice: BackendChoice, path: &Path) -> Result<Route> {
    let backend = match choice {
        // Embedding models run on llama.cpp whatever the choice: the MLX
        // side here runs causal language models only.
        _ if llama::embed::pooling_of(&header).is_some() => BackendKind::Llama,
        BackendChoice::Llama => BackendKind::Llama,
        BackendChoice::Mlx => match mlx_reads(&header) {
            Ok(()) => BackendKind::Mlx,
            Err(why) => {
                return Err(EngineError::Unsupported(format!(
                    "{}: {why} (tried: mlx; the llama backend runs this file)",
                    path.display()
                )))
            }
        },
        BackendChoice::Auto if cfg!(target_os = "macos") && mlx_reads(&header).is_ok() => {
            BackendKind::Mlx
        }
        BackendChoice::Auto => BackendKind::Llama,
    };
    Ok(Route {
        backend,
        header: Some(header),
    })
}

/// `ggml_type`'s name, or its number when ggml does not know it.
pub fn type_name(ggml_type: u32) -> String {
    if !known_type(ggml_type) {
        return format!("type {ggml_type}");
    }
    // SAFETY: ggml_type_name indexes a static table; the type is in range.
    let name = unsafe { std::ffi::CStr::from_ptr(llama_cpp_sys_2::ggml_type_name(ggml_type as _)) };
    name.to_string_lossy().into_owned()
}

fn known_type(ggml_type: u32) -> bool {
    if ggml_type >= llama_cpp_sys_2::GGML_TYPE_COUNT {
        return false;
    }
    // SAFETY: in range of ggml's type table; removed types have block size 0.
    unsafe { llama_cpp_sys_2::ggml_blck_size(ggml_type as _) > 0 }
}

/// Reads and checks a GGUF header before any backend sees the file: every
/// tensor of a type ggml knows, with a shape its blocks divide, inside the
/// file. llama.cpp aborts the process on some files that fail these.
pub fn check_gguf(path: &Path) -> Result<shoal_gguf::Header> {
    let h = shoal_gguf::Header::read(path).map_err(|e| match e {
        shoal_gguf::GgufError::Io { source, .. } => EngineError::Io(source),
        e @ (shoal_gguf::GgufError::Malformed { .. } | shoal_gguf::GgufError::CutShort { .. }) => {
            EngineError::InvalidModel(e.to_string())
        }
    })?;
    if h.architecture().is_none() {
        return Err(EngineError::InvalidModel(format!(
            "{}: the GGUF header names no architecture (general.architecture)",
            path.display()
        )));
    }
    for t in &h.tensors {
        if !known_type(t.ggml_type) {
            return Err(EngineError::Unsupported(format!(
                "{}: tensor {} has tensor type {} that no backend here reads (tried: llama, mlx)",
                path.display(),
                t.name,
                t.ggml_type
            )));
        }
        // SAFETY: the type is known (checked above).
        let (block, size) = unsafe {
            (
                llama_cpp_sys_2::ggml_blck_size(t.ggml_type as _) as u64,
                llama_cpp_sys_2::ggml_type_size(t.ggml_type as _) as u64,
            )
        };
        let inner = t.dims.first().copied().unwrap_or(0);
        if block == 0 || inner % block != 0 {
            return Err(EngineError::InvalidModel(format!(
                "{}: tensor {} of type {} has a row of {inner} values, not a whole number of {block}-value blocks",
                path.display(),
                t.name,
                type_name(t.ggml_type)
            )));
        }
        let bytes = (t.elements() / block).saturating_mul(size);
        let end = h.data_offset.saturating_add(t.offset).saturating_add(bytes);
        if end > h.file_len {
            return Err(EngineError::InvalidModel(format!(
                "{}: the file is truncated: tensor {} ends at byte {end} but the file has {} bytes",
                path.display(),
                t.name,
                h.file_len
            )));
        }
    }
    Ok(h)
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_gguf::testing::{gguf_bytes, MetaValue};

    fn file(name: &str, bytes: &[u8]) -> std::path::PathBuf {
        let dir = std::env::temp_dir().join(format!("shoal-backends-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let p = dir.join(name);
        std::fs::write(&p, bytes).expect("write");
        p
    }

    fn tiny(arch: &'static str) -> Vec<u8> {
        gguf_bytes(
            &[
                ("general.architecture", MetaValue::Str(arch)),
                ("tokenizer.ggml.model", MetaValue::Str("gpt2")),
            ],
            &[
                ("token_embd.weight", &[64, 8]),
                ("output_norm.weight", &[64]),
            ],
        )
    }

    #[test]
    fn bad_files_get_a_sentence_before_any_native_code() {
        let bytes = tiny("llama");
        // Cut inside the tensor data.
        let p = file("cut.gguf", &bytes[..bytes.len() - 100]);
        let e = check_gguf(&p).unwrap_err().to_string();
        assert!(
            e.contains("truncated") && e.contains("output_norm.weight"),
            "{e}"
        );
        // A tensor type no ggml knows.
        let mut odd = bytes.clone();
        let at = odd
            .windows(18)
            .position(|w| w == b"output_norm.weight")
            .expect("name")
            + 18
            + 4
            + 8;
        odd[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
        let p = file("odd.gguf", &odd);
        let e = check_gguf(&p).unwrap_err().to_string();
        assert!(e.contains("tensor type 99") && e.contains("tried"), "{e}");
        // Not a GGUF at all.
        let p = file("zip.gguf", b"PK\x03\x04 not a model at all, just bytes");
        let e = crate::loader::load(&p, &Default::default())
            .err()
            .expect("refused")
            .to_string();
        assert!(e.contains("not a GGUF"), "{e}");
    }

    #[test]
    fn an_architecture_nobody_runs_is_named_with_the_backends_tried() {
        let p = file("foo.gguf", &tiny("foo"));
        for choice in [BackendChoice::Auto, BackendChoice::Llama] {
            let e = crate::loader::load(
                &p,
                &crate::loader::LoadOptions {
                    backend: choice,
                    ..Default::default()
                },
            )
            .err()
            .expect("refused")
            .to_string();
            assert!(e.contains("\"foo\"") && e.contains("tried: llama"), "{e}");
            assert!(
                e.contains("mlx (MLX runs GGUF files of llama, qwen2, qwen3"),
                "{e}"
            );
        }
        let e = choose(&p, BackendChoice::Mlx).unwrap_err().to_string();
        assert!(e.contains("\"foo\"") && e.contains("tried: mlx"), "{e}");
        // A directory: refused before any weight is read, naming the
        // architecture and what MLX runs.
        let dir = p.parent().expect("dir").join("falcon-dir");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "falcon"}"#).expect("config");
        let e = choose(&dir, BackendChoice::Auto).unwrap_err().to_string();
        assert!(
            e.contains("'falcon'") && e.contains("tried: mlx (it runs llama, mistral"),
            "{e}"
        );
        assert!(e.contains("gemma3_text") && e.contains("gpt_oss"), "{e}");
    }

    #[test]
    fn auto_sends_gguf_to_llama_here_and_directories_to_mlx() {
        let p = file("ok.gguf", &tiny("llama"));
        let want = if cfg!(target_os = "macos") {
            BackendKind::Mlx
        } else {
            BackendKind::Llama
        };
        assert_eq!(choose(&p, BackendChoice::Auto).expect("auto"), want);
        assert_eq!(
            choose(&p, BackendChoice::Mlx).expect("mlx reads F32"),
            BackendKind::Mlx
        );
        // A vocabulary MLX's side does not build stays on llama.cpp.
        let spm = file(
            "spm.gguf",
            &gguf_bytes(
                &[
                    ("general.architecture", MetaValue::Str("llama")),
                    ("tokenizer.ggml.model", MetaValue::Str("llama")),
                ],
                &[("token_embd.weight", &[64, 8])],
            ),
        );
        let e = choose(&spm, BackendChoice::Mlx).unwrap_err().to_string();
        assert!(
            e.contains("SentencePiece") && e.contains("llama backend runs"),
            "{e}"
        );
        assert_eq!(
            choose(&spm, BackendChoice::Auto).expect("auto"),
            BackendKind::Llama
        );
        let dir = p.parent().expect("dir").join("gemma-dir");
        std::fs::create_dir_all(&dir).expect("mkdir");
        std::fs::write(dir.join("config.json"), r#"{"model_type": "gemma3_text"}"#)
            .expect("config");
        assert_eq!(
            choose(&dir, BackendChoice::Auto).expect("dir"),
            BackendKind::Mlx
        );
        assert!(choose(&dir, BackendChoice::Llama).is_err());
        assert_eq!("llama".parse::<BackendChoice>(), Ok(BackendChoice::Llama));
        assert!("tpu".parse::<BackendChoice>().is_err());
    }
}
