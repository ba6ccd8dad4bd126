//! Hugging Face / MLX-community model directories: `config.json`,
//! `*.safetensors` (single or sharded via the index), an optional MLX
//! `quantization` block, `tokenizer.json` and the chat template.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::Value;

use super::config::{Activation, MoeConfig, Routing};
use super::{rope, ModelConfig};
use crate::error::{EngineError, Result};

fn missing(what: &str, detail: impl Into<String>) -> EngineError {
    EngineError::MissingModelPart {
        what: what.into(),
        detail: detail.into(),
    }
}

pub fn read_json(path: &Path) -> Result<Value> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| missing("file", format!("{}: {e}", path.display())))?;
    serde_json::from_str(&text)
        .map_err(|e| EngineError::InvalidModel(format!("{}: {e}", path.display())))
}

fn num(cfg: &Value, key: &str) -> Option<f64> {
    cfg.get(key).and_then(Value::as_f64)
}

fn req(cfg: &Value, key: &str) -> Result<usize> {
    num(cfg, key)
        .map(|v| v as usize)
        .ok_or_else(|| missing("config.json field", key))
}

/// The `model_type`s this loader runs.
pub const ARCHITECTURES: [&str; 8] = [
    "llama",
    "mistral",
    "qwen2",
    "qwen3",
    "qwen3_moe",
    "gemma3_text",
    "phi3",
    "gpt_oss",
];

/// The directory's `model_type`, if MLX runs it; otherwise the sentence
/// that says what was tried (before any weight is read).
pub fn architecture(dir: &Path) -> Result<String> {
    let cfg = read_json(&dir.join("config.json"))?;
    check_architecture(dir, &cfg)
}

fn check_architecture(dir: &Path, cfg: &Value) -> Result<String> {
    let arch = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| missing("config.json field", "model_type"))?
        .to_string();
    if !ARCHITECTURES.contains(&arch.as_str()) {
        return Err(EngineError::Unsupported(format!(
            "{}: no backend here runs model_type '{arch}'; tried: mlx (it runs {}); \
             llama.cpp runs GGUF files, not model directories",
            dir.display(),
            ARCHITECTURES.join(", ")
        )));
    }
    Ok(arch)
}

/// Parsed `config.json` plus the MLX quantization group size (if quantized).
pub fn config(dir: &Path) -> Result<(ModelConfig, Option<i32>)> {
    let cfg = read_json(&dir.join("config.json"))?;
    let arch = check_architecture(dir, &cfg)?;
    let gemma = arch == "gemma3_text";
    let hidden = req(&cfg, "hidden_size")?;
    let heads = req(&cfg, "num_attention_heads")?;
    let layers = req(&cfg, "num_hidden_layers")?;
    let head_dim = match num(&cfg, "head_dim") {
        // phi3 derives it from the hidden size whatever the file says.
        Some(v) if arch != "phi3" => v as usize,
        None if gemma => 256,
        _ if heads > 0 => hidden / heads,
        _ => 0,
    };
    let default_theta = match arch.as_str() {
        "gemma3_text" => 1_000_000.0,
        "gpt_oss" => 150_000.0,
        _ => 10_000.0,
    };
    let theta = num(&cfg, "rope_theta").unwrap_or(default_theta) as f32;
    let max_positions = num(&cfg, "max_position_embeddings");
    let rope_dims = match num(&cfg, "partial_rotary_factor") {
        Some(f) => (head_dim as f64 * f) as usize,
        None => head_dim,
    };
    let scaling = rope::scaling(
        cfg.get("rope_scaling"),
        theta,
        rope_dims,
        rope::Context {
            max_positions: max_positions.unwrap_or(131072.0),
            original: num(&cfg, "original_max_position_embeddings"),
        },
    )?;
    let quant = cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"));
    let group = quant
        .and_then(|q| q.get("group_size"))
        .and_then(Value::as_i64)
        .map(|g| g as i32);
    let quant_overrides = quant
        .and_then(Value::as_object)
        .map(|q| {
            q.iter()
                .filter_map(|(k, v)| {
                    let g = v.get("group_size")?.as_i64()? as i32;
                    let b = v.get("bits")?.as_i64()? as i32;
                    Some((k.clone(), (g, b)))
                })
                .collect()
        })
        .unwrap_or_default();
    let quantization = quant.and_then(|q| {
        let bits = q.get("bits").and_then(Value::as_i64)?;
        Some(format!("{bits}-bit g{}", group.unwrap_or(64)))
    });
    let window = num(&cfg, "sliding_window").map(|w| w as usize);
    let layer_windows = match arch.as_str() {
        "gemma3_text" => {
            let pattern = num(&cfg, "sliding_window_pattern")
                .map_or(6, |p| p as usize)
                .max(1);
            let w = window.unwrap_or(512);
            super::config::every_nth_global(layers, pattern, w)
        }
        // layer_types decides, as in mlx-lm: a mistral config's bare
        // sliding_window does not make every layer slide.
        "llama" | "mistral" | "gpt_oss" => {
            let types: Vec<String> = match cfg.get("layer_types").and_then(Value::as_array) {
                Some(t) => t
                    .iter()
                    .map(|x| x.as_str().unwrap_or_default().to_string())
                    .collect(),
                None if arch == "gpt_oss" => (0..layers)
                    .map(|i| ["sliding_attention", "full_attention"][i % 2].to_string())
                    .collect(),
                None => Vec::new(),
            };
            if !types.is_empty() && types.len() != layers {
                return Err(EngineError::InvalidModel(format!(
                    "layer_types lists {} layers, the model has {layers}",
                    types.len()
                )));
            }
            let w = window.unwrap_or(128);
            types
                .iter()
                .map(|t| (t == "sliding_attention").then_some(w))
                .collect()
        }
        _ => Vec::new(),
    };
    let moe = match arch.as_str() {
        "qwen3_moe" => {
            let experts = req(&cfg, "num_experts")?;
            let step = num(&cfg, "decoder_sparse_step")
                .map_or(1, |s| s as usize)
                .max(1);
            let dense: Vec<usize> = cfg
                .get("mlp_only_layers")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_u64)
                        .map(|x| x as usize)
                        .collect()
                })
                .unwrap_or_default();
            Some(MoeConfig {
                num_experts: experts,
                top_k: req(&cfg, "num_experts_per_tok")?,
                routing: Routing::SoftmaxThenTopK,
                normalize: cfg
                    .get("norm_topk_prob")
                    .and_then(Value::as_bool)
                    .unwrap_or(false),
                sparse_layers: (0..layers)
                    .map(|i| !dense.contains(&i) && experts > 0 && (i + 1) % step == 0)
                    .collect(),
            })
        }
        "gpt_oss" => Some(MoeConfig {
            num_experts: req(&cfg, "num_local_experts")?,
            top_k: req(&cfg, "num_experts_per_tok")?,
            routing: Routing::TopKThenSoftmax,
            normalize: false,
            sparse_layers: vec![true; layers],
        }),
        _ => None,
    };
    let config = ModelConfig {
        architecture: arch.clone(),
        hidden_size: hidden,
        intermediate_size: req(&cfg, "intermediate_size")?,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: num(&cfg, "num_key_value_heads")
            .map_or(if gemma { 1 } else { heads }, |v| v as usize),
        head_dim,
        vocab_size: req(&cfg, "vocab_size")?,
        rms_norm_eps: num(&cfg, "rms_norm_eps").unwrap_or(if gemma { 1e-6 } else { 1e-5 }) as f32,
        rope_theta: theta,
        rope_traditional: cfg
            .get("rope_traditional")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        rope_scaling: scaling,
        context_length: max_positions.map_or(4096, |v| v as usize),
        tie_word_embeddings: cfg
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            // gemma ties unless the weights bring an lm_head.
            .unwrap_or(gemma),
        quantization,
        format: "safetensors".into(),
        layer_windows,
        rope_local_theta: gemma
            .then(|| num(&cfg, "rope_local_base_freq").unwrap_or(10_000.0) as f32),
        rope_dims,
        attn_scale: gemma.then(|| {
            let s = num(&cfg, "query_pre_attn_scalar").unwrap_or(256.0);
            s.powf(-0.5) as f32
        }),
        gemma,
        norms_plus_one: gemma,
        activation: match arch.as_str() {
            "gemma3_text" => Activation::GeluApprox,
            "gpt_oss" => Activation::SwigluOai,
            _ => Activation::Silu,
        },
        moe,
        quant_overrides,
    };
    Ok((config, group))
}

/// Lists the weight files: the shards named by the index, or every `*.safetensors`.
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let index = dir.join("model.safetensors.index.json");
    if index.is_file() {
        let idx = read_json(&index)?;
        let map = idx
            .get("weight_map")
            .and_then(Value::as_object)
            .ok_or_else(|| missing("index field", "weight_map"))?;
        let mut files: Vec<PathBuf> = map
            .values()
            .filter_map(Value::as_str)
            .map(|f| dir.join(f))
            .collect();
        files.sort();
        files.dedup();
        for f in &files {
            if !f.is_file() {
                return Err(missing("weight shard", f.display().to_string()));
            }
        }
        return Ok(files);
    }
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(missing(
            "weights",
            format!("no *.safetensors in {}", dir.display()),
        ));
    }
    Ok(files)
}

pub fn tensors(dir: &Path) -> Result<HashMap<String, Array>> {
    let mut out = HashMap::new();
    for f in weight_files(dir)? {
        let part = Array::load_safetensors(&f)
            .map_err(|e| EngineError::InvalidModel(format!("{}: {e}", f.display())))?;
        out.extend(part);
    }
    Ok(out)
}

/// Chat template: `chat_template.jinja`, or `tokenizer_config.json`'s
/// `chat_template` (a string, or a list of named templates — "default" wins).
pub fn chat_template(dir: &Path, tok_cfg: &Value) -> Result<Option<String>> {
    let jinja = dir.join("chat_template.jinja");
    if jinja.is_file() {
        return Ok(Some(std::fs::read_to_string(jinja)?));
    }
    Ok(match tok_cfg.get("chat_template") {
        Some(Value::String(s)) => Some(s.clone()),
        Some(Value::Array(list)) => {
            let named = |n: &str| {
                list.iter()
                    .find(|t| t.get("name").and_then(Value::as_str) == Some(n))
            };
            named("default")
                .or_else(|| list.first())
                .and_then(|t| t.get("template"))
                .and_then(Value::as_str)
                .map(str::to_string)
        }
        _ => None,
    })
}

/// A special token in tokenizer_config.json is a string or an AddedToken object.
pub fn special_token(tok_cfg: &Value, key: &str) -> Option<String> {
    match tok_cfg.get(key)? {
        Value::String(s) => Some(s.clone()),
        Value::Object(o) => o.get("content").and_then(Value::as_str).map(str::to_string),
        _ => None,
    }
}

/// EOS ids from config.json and generation_config.json (int or list).
pub fn eos_ids(dir: &Path) -> Vec<u32> {
    let mut ids = Vec::new();
    for name in ["config.json", "generation_config.json"] {
        if let Ok(v) = read_json(&dir.join(name)) {
            match v.get("eos_token_id") {
                Some(Value::Number(n)) => ids.extend(n.as_u64().map(|x| x as u32)),
                Some(Value::Array(a)) => {
                    ids.extend(a.iter().filter_map(Value::as_u64).map(|x| x as u32))
                }
                _ => {}
            }
        }
    }
    ids.sort_unstable();
    ids.dedup();
    ids
}
