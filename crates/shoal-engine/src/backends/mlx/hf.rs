//! Hugging Face / MLX-community model directories: `config.json`,
//! `*.safetensors` (single or sharded via the index), an optional MLX
//! `quantization` block, `tokenizer.json` and the chat template.
use std::collections::HashMap;
use std::path::{Path, PathBuf};

use mlx_rs::Array;
use serde_json::Value;

use super::ModelConfig;
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

/// Parsed `config.json` plus the MLX quantization group size (if quantized).
pub fn config(dir: &Path) -> Result<(ModelConfig, Option<i32>)> {
    let cfg = read_json(&dir.join("config.json"))?;
    let arch = cfg
        .get("model_type")
        .and_then(Value::as_str)
        .ok_or_else(|| missing("config.json field", "model_type"))?
        .to_string();
    if !matches!(arch.as_str(), "llama" | "qwen2" | "qwen3") {
        return Err(EngineError::Unsupported(format!(
            "model_type '{arch}' (supported: llama, qwen2, qwen3)"
        )));
    }
    let hidden = req(&cfg, "hidden_size")?;
    let heads = req(&cfg, "num_attention_heads")?;
    let head_dim = match num(&cfg, "head_dim") {
        Some(v) => v as usize,
        None if heads > 0 => hidden / heads,
        None => 0,
    };
    let theta = num(&cfg, "rope_theta").unwrap_or(10000.0) as f32;
    let rope_freqs = match cfg.get("rope_scaling") {
        Some(s) if s.is_object() => llama3_freqs(s, theta, head_dim)?,
        _ => None,
    };
    let quant = cfg
        .get("quantization")
        .or_else(|| cfg.get("quantization_config"));
    let group = quant
        .and_then(|q| q.get("group_size"))
        .and_then(Value::as_i64)
        .map(|g| g as i32);
    let quantization = quant.and_then(|q| {
        let bits = q.get("bits").and_then(Value::as_i64)?;
        Some(format!("{bits}-bit g{}", group.unwrap_or(64)))
    });
    let config = ModelConfig {
        architecture: arch.clone(),
        hidden_size: hidden,
        intermediate_size: req(&cfg, "intermediate_size")?,
        num_layers: req(&cfg, "num_hidden_layers")?,
        num_heads: heads,
        num_kv_heads: num(&cfg, "num_key_value_heads").map_or(heads, |v| v as usize),
        head_dim,
        vocab_size: req(&cfg, "vocab_size")?,
        rms_norm_eps: num(&cfg, "rms_norm_eps").unwrap_or(1e-6) as f32,
        rope_theta: theta,
        rope_traditional: false,
        rope_freqs,
        context_length: num(&cfg, "max_position_embeddings").map_or(4096, |v| v as usize),
        tie_word_embeddings: cfg
            .get("tie_word_embeddings")
            .and_then(Value::as_bool)
            .unwrap_or(false),
        quantization,
        format: "safetensors".into(),
    };
    Ok((config, group))
}

/// Llama 3.1-style frequency scaling, expressed as rotary periods for MLX.
fn llama3_freqs(s: &Value, theta: f32, head_dim: usize) -> Result<Option<Vec<f32>>> {
    let kind = s
        .get("rope_type")
        .or_else(|| s.get("type"))
        .and_then(Value::as_str)
        .unwrap_or("");
    match kind {
        "llama3" => {}
        "default" | "" => return Ok(None),
        other => {
            return Err(EngineError::Unsupported(format!(
                "rope_scaling type '{other}'"
            )));
        }
    }
    let g = |k: &str, d: f64| s.get(k).and_then(Value::as_f64).unwrap_or(d) as f32;
    let factor = g("factor", 8.0);
    let low = g("low_freq_factor", 1.0);
    let high = g("high_freq_factor", 4.0);
    let orig = g("original_max_position_embeddings", 8192.0);
    let low_wavelen = orig / low;
    let high_wavelen = orig / high;
    let dims = head_dim as f32;
    let freqs = (0..head_dim / 2)
        .map(|i| {
            let period = theta.powf(2.0 * i as f32 / dims);
            let wavelen = 2.0 * std::f32::consts::PI * period;
            if wavelen < high_wavelen {
                period
            } else if wavelen > low_wavelen {
                period * factor
            } else {
                let smooth = (orig / wavelen - low) / (high - low);
                period / ((1.0 - smooth) / factor + smooth)
            }
        })
        .collect();
    Ok(Some(freqs))
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
