//! GGUF files through MLX's own loader.
//!
//! MLX returns Q4_0/Q4_1/Q8_0 tensors as affine-quantized triples
//! (`.weight` packed uint32, `.scales`, `.biases`, group size 32) and other
//! types dequantized; we only rename them to Hugging Face names. llama.cpp
//! stores llama q/k rows permuted for interleaved rotary pairs, so llama GGUFs
//! run with MLX's "traditional" rope instead of un-permuting the weights.
use std::collections::HashMap;
use std::path::Path;

use mlx_rs::io::{GgufFile, GgufMetadataValue};
use mlx_rs::{Array, Dtype};

use super::ModelConfig;
use crate::error::{EngineError, Result};

/// `general.architecture` values the MLX loader reads from GGUF.
pub const GGUF_ARCHITECTURES: &[&str] = &["llama", "qwen2", "qwen3", "qwen3moe", "gemma3", "phi3"];

/// GGUF stores llama.cpp's tensor names; MLX's group size for its quants is 32.
pub const GGUF_GROUP_SIZE: i32 = 32;

pub fn open(path: &Path) -> Result<GgufFile> {
    GgufFile::load(path).map_err(|e| EngineError::InvalidModel(format!("{}: {e}", path.display())))
}

pub fn meta_string(f: &GgufFile, key: &str) -> Result<Option<String>> {
    match f.get_metadata(key) {
        Ok(Some(GgufMetadataValue::String(s))) => Ok(Some(s)),
        Ok(Some(_)) => Err(EngineError::InvalidModel(format!(
            "GGUF key {key} is not a string"
        ))),
        Ok(None) => Ok(None),
        Err(e) => Err(EngineError::InvalidModel(format!("GGUF key {key}: {e}"))),
    }
}

/// Numeric metadata comes back as an MLX array of whatever integer/float type
/// the file used; read it as f64 so callers need not care.
pub fn meta_numbers(f: &GgufFile, key: &str) -> Result<Option<Vec<f64>>> {
    match f.get_metadata(key) {
        Ok(Some(GgufMetadataValue::Array(a))) => {
            let a = a.as_dtype(Dtype::Float64)?;
            a.eval()?;
            Ok(Some(a.as_slice::<f64>().to_vec()))
        }
        Ok(Some(_)) => Err(EngineError::InvalidModel(format!(
            "GGUF key {key} is not numeric"
        ))),
        Ok(None) => Ok(None),
        Err(e) => Err(EngineError::InvalidModel(format!("GGUF key {key}: {e}"))),
    }
}

pub fn meta_number(f: &GgufFile, key: &str) -> Result<Option<f64>> {
    Ok(meta_numbers(f, key)?.and_then(|v| v.first().copied()))
}

fn required(f: &GgufFile, key: &str) -> Result<f64> {
    meta_number(f, key)?.ok_or_else(|| EngineError::MissingModelPart {
        what: "GGUF metadata".into(),
        detail: key.into(),
    })
}

/// Reads the architecture hyperparameters.
pub fn config(f: &GgufFile) -> Result<ModelConfig> {
    let arch =
        meta_string(f, "general.architecture")?.ok_or_else(|| EngineError::MissingModelPart {
            what: "GGUF metadata".into(),
            detail: "general.architecture".into(),
        })?;
    if !GGUF_ARCHITECTURES.contains(&arch.as_str()) {
        return Err(EngineError::Unsupported(format!(
            "GGUF architecture '{arch}' (supported: {})",
            GGUF_ARCHITECTURES.join(", ")
        )));
    }
    let gemma = arch == "gemma3";
    let k = |s: &str| format!("{arch}.{s}");
    let hidden = required(f, &k("embedding_length"))? as usize;
    let heads = required(f, &k("attention.head_count"))? as usize;
    let kv_heads = meta_number(f, &k("attention.head_count_kv"))?.map_or(heads, |v| v as usize);
    let head_dim = match meta_number(f, &k("attention.key_length"))? {
        Some(v) => v as usize,
        None if gemma => 256,
        None if heads > 0 => hidden / heads,
        None => 0,
    };
    let rope_dims = meta_number(f, &k("rope.dimension_count"))?.map_or(head_dim, |v| v as usize);
    let layers = required(f, &k("block_count"))? as usize;
    let vocab = match f.get_metadata("tokenizer.ggml.tokens") {
        Ok(Some(GgufMetadataValue::Strings(t))) => t.len(),
        _ => meta_number(f, &k("vocab_size"))?.map_or(0, |v| v as usize),
    };
    let base =
        meta_number(f, &k("rope.freq_base"))?.unwrap_or(if gemma { 1_000_000.0 } else { 10_000.0 })
            as f32;
    let mut scaling = super::rope::Scaling::default();
    // Per-pair divisors of the rotary periods (MLX's rope takes the periods):
    // Llama 3.1+'s `rope_freqs`, or LongRoPE's long factors (phi3, as for HF
    // configs), which also scale the rotated part of q and k.
    for name in ["rope_freqs.weight", "rope_factors_long.weight"] {
        let Ok(Some(factors)) = f.get_array(name) else {
            continue;
        };
        let factors = factors.as_dtype(Dtype::Float32)?;
        factors.eval()?;
        scaling.freqs = Some(super::rope::scaled_periods(base, factors.as_slice::<f32>()));
        if name == "rope_freqs.weight" {
            continue;
        }
        let ctx = meta_number(f, &k("context_length"))?.unwrap_or(4096.0);
        let orig = meta_number(f, &k("rope.scaling.original_context_length"))?.unwrap_or(ctx);
        let attention = meta_number(f, &k("rope.scaling.attn_factor"))?
            .unwrap_or_else(|| super::rope::longrope_attention(ctx / orig, orig));
        scaling.input_scale = Some(attention as f32);
    }
    let moe = if arch == "qwen3moe" {
        let has = |name: String| matches!(f.get_array(&name), Ok(Some(_)));
        Some(super::config::MoeConfig {
            num_experts: required(f, &k("expert_count"))? as usize,
            top_k: required(f, &k("expert_used_count"))? as usize,
            routing: super::config::Routing::SoftmaxThenTopK,
            normalize: meta_number(f, &k("expert_weights_norm"))?.is_none_or(|v| v != 0.0),
            // A layer without a router is a dense MLP.
            sparse_layers: (0..layers)
                .map(|i| has(format!("blk.{i}.ffn_gate_inp.weight")))
                .collect(),
        })
    } else {
        None
    };
    match meta_string(f, &k("rope.scaling.type"))?.as_deref() {
        None | Some("none") => {}
        Some("linear") => {
            let factor = meta_number(f, &k("rope.scaling.factor"))?.unwrap_or(1.0) as f32;
            if factor > 0.0 {
                scaling.scale = Some(1.0 / factor);
            }
        }
        Some(other) => {
            return Err(EngineError::Unsupported(format!(
                "GGUF rope scaling '{other}' on MLX (supported: linear)"
            )))
        }
    }
    // llama.cpp's gemma3 layout: every sixth layer is global, the others
    // slide over `attention.sliding_window` positions with their own base.
    let layer_windows = if gemma {
        let pattern = meta_number(f, &k("attention.sliding_window_pattern"))?
            .map_or(6, |p| p as usize)
            .max(1);
        let w = meta_number(f, &k("attention.sliding_window"))?.map_or(512, |v| v as usize);
        super::config::every_nth_global(layers, pattern, w)
    } else {
        Vec::new()
    };
    let ftype = meta_number(f, "general.file_type")?;
    Ok(ModelConfig {
        architecture: arch.clone(),
        hidden_size: hidden,
        intermediate_size: required(f, &k("feed_forward_length"))? as usize,
        num_layers: layers,
        num_heads: heads,
        num_kv_heads: kv_heads,
        head_dim,
        vocab_size: vocab,
        rms_norm_eps: meta_number(f, &k("attention.layer_norm_rms_epsilon"))?.unwrap_or(if gemma {
            1e-6
        } else {
            1e-5
        }) as f32,
        rope_theta: base,
        rope_traditional: arch == "llama",
        rope_scaling: scaling,
        rope_dims,
        moe,
        context_length: meta_number(f, &k("context_length"))?.map_or(4096, |v| v as usize),
        tie_word_embeddings: !matches!(f.get_array("output.weight"), Ok(Some(_))),
        quantization: Some(ftype_name(ftype)),
        format: "gguf".into(),
        layer_windows,
        rope_local_theta: gemma
            .then_some(meta_number(f, &k("rope.freq_base_swa"))?.unwrap_or(10_000.0) as f32),
        // 1/sqrt(key_length), except gemma3 27B (62 layers): hidden / heads.
        attn_scale: gemma.then(|| {
            let s = if layers == 62 && heads > 0 {
                hidden / heads
            } else {
                head_dim
            };
            (s as f32).powf(-0.5)
        }),
        gemma,
        // llama.cpp's converter already stored gemma's norms as 1 + w.
        norms_plus_one: false,
        activation: if gemma {
            super::config::Activation::GeluApprox
        } else {
            super::config::Activation::Silu
        },
        ..ModelConfig::default()
    })
}

fn ftype_name(ftype: Option<f64>) -> String {
    match ftype.map(|v| v as i64) {
        Some(0) => "F32".into(),
        Some(1) => "F16".into(),
        Some(2) => "Q4_0".into(),
        Some(3) => "Q4_1".into(),
        Some(7) => "Q8_0".into(),
        Some(32) => "BF16".into(),
        Some(n) => format!("ftype {n}"),
        None => "unknown".into(),
    }
}

/// Maps llama.cpp tensor names onto Hugging Face names. Gemma's four norms
/// per layer take gemma's names: llama.cpp's `ffn_norm` is the norm before the
/// MLP in both, which HF calls `post_attention_layernorm` only in the llama shape.
fn hf_name(gguf: &str, arch: &str) -> Option<String> {
    let gemma = arch == "gemma3";
    let (base, suffix) = gguf.rsplit_once('.')?;
    let mapped = match base {
        "token_embd" => "model.embed_tokens".to_string(),
        "output_norm" => "model.norm".to_string(),
        "output" => "lm_head".to_string(),
        "rope_freqs" | "rope_factors_long" | "rope_factors_short" => return None,
        _ => {
            let rest = base.strip_prefix("blk.")?;
            let (idx, part) = rest.split_once('.')?;
            let part = match part {
                "attn_norm" => "input_layernorm",
                "ffn_norm" if gemma => "pre_feedforward_layernorm",
                "ffn_norm" => "post_attention_layernorm",
                "post_attention_norm" if gemma => "post_attention_layernorm",
                "post_ffw_norm" if gemma => "post_feedforward_layernorm",
                "attn_q" => "self_attn.q_proj",
                "attn_k" => "self_attn.k_proj",
                "attn_v" => "self_attn.v_proj",
                "attn_output" => "self_attn.o_proj",
                "attn_q_norm" => "self_attn.q_norm",
                "attn_k_norm" => "self_attn.k_norm",
                "ffn_gate" => "mlp.gate_proj",
                // phi3's gate and up projections, stacked.
                "ffn_up" if arch == "phi3" => "mlp.gate_up_proj",
                "ffn_up" => "mlp.up_proj",
                "attn_qkv" => "self_attn.qkv_proj",
                "ffn_gate_inp" => "mlp.gate",
                "ffn_gate_exps" => "mlp.switch_mlp.gate_proj",
                "ffn_up_exps" => "mlp.switch_mlp.up_proj",
                "ffn_down_exps" => "mlp.switch_mlp.down_proj",
                "ffn_down" => "mlp.down_proj",
                _ => return None,
            };
            format!("model.layers.{idx}.{part}")
        }
    };
    Some(format!("{mapped}.{suffix}"))
}

/// Reads every tensor, renamed to Hugging Face names for `cfg`'s architecture.
pub fn tensors(f: &GgufFile, cfg: &ModelConfig) -> Result<HashMap<String, Array>> {
    let arrays = f
        .arrays()
        .map_err(|e| EngineError::InvalidModel(format!("reading GGUF tensors: {e}")))?;
    let mut out = HashMap::with_capacity(arrays.len());
    for (name, a) in arrays {
        if let Some(hf) = hf_name(&name, &cfg.architecture) {
            out.insert(hf, a);
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::hf_name;

    #[test]
    fn names_map_to_hf() {
        assert_eq!(
            hf_name("token_embd.scales", "llama").as_deref(),
            Some("model.embed_tokens.scales")
        );
        assert_eq!(
            hf_name("blk.12.attn_output.weight", "llama").as_deref(),
            Some("model.layers.12.self_attn.o_proj.weight")
        );
        assert_eq!(
            hf_name("blk.0.ffn_norm.weight", "llama").as_deref(),
            Some("model.layers.0.post_attention_layernorm.weight")
        );
        for (gguf, hf) in [
            ("attn_norm", "input_layernorm"),
            ("post_attention_norm", "post_attention_layernorm"),
            ("ffn_norm", "pre_feedforward_layernorm"),
            ("post_ffw_norm", "post_feedforward_layernorm"),
        ] {
            assert_eq!(
                hf_name(&format!("blk.3.{gguf}.weight"), "gemma3"),
                Some(format!("model.layers.3.{hf}.weight"))
            );
        }
        assert_eq!(hf_name("blk.3.post_ffw_norm.weight", "llama"), None);
        assert_eq!(hf_name("rope_freqs.weight", "llama"), None);
        assert_eq!(hf_name("blk.0.unknown.weight", "llama"), None);
    }
}
