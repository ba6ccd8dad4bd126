//! Correctness against an independent implementation: mlx-lm (Python) on the
//! same weights, converted to a Hugging Face directory by tools/py/convert_gguf.py.
//!
//! Tolerance: float32 logits from two implementations that sum in different
//! orders (and, for the GGUF weights, a different rotary layout) must agree to
//! within 1e-3 absolute (logits span roughly ±30; ~4e-5 is typical); greedy
//! tokens must match exactly.
use std::path::{Path, PathBuf};

use serde_json::Value;
use shoal_engine::loader::{self, Loaded};
use shoal_engine::ChatMessage;

mod common;
use common::{argmax, floats, ids, max_diff, repo};

const LOGIT_TOL: f32 = 1e-3;
const MAX_TOKENS: usize = 24;

fn hf_dir() -> PathBuf {
    let p = std::env::var("SHOAL_TEST_HF_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| repo().join(".cache/models/smollm2-135m-mlx-f32"));
    assert!(
        p.join("config.json").is_file(),
        "converted model missing at {} — run `make models`",
        p.display()
    );
    p
}

fn gguf() -> PathBuf {
    let p = std::env::var("SHOAL_TEST_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| loader::default_model_path());
    assert!(
        p.is_file(),
        "default model missing at {} — run `make models`",
        p.display()
    );
    p
}

const PROMPTS: [&str; 3] = [
    "What is the capital of France?",
    "Write a haiku about the ocean.",
    "List three prime numbers and explain why they are prime.",
];
const RAW_IDS: [u32; 8] = [504, 3458, 282, 4649, 314, 1345, 30, 216];

fn models_dir() -> PathBuf {
    hf_dir().parent().map(Path::to_path_buf).unwrap_or_default()
}

/// Runs mlx-lm once for all prompts on `dir`.
fn run_reference(dir: &Path) -> Value {
    {
        let mut cmd = common::reference_py(dir);
        for p in PROMPTS {
            cmd.args(["--prompt", p]);
        }
        let ids: Vec<String> = RAW_IDS.iter().map(u32::to_string).collect();
        cmd.args(["--token-ids", &ids.join(",")]);
        cmd.args(["--max-tokens", &MAX_TOKENS.to_string()]);
        let out = cmd.output().expect("run reference.py");
        assert!(
            out.status.success(),
            "reference.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("reference JSON")
    }
}

/// The reference on the float32 conversion, shared by the GGUF and HF checks.
fn reference() -> &'static Value {
    static REF: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    REF.get_or_init(|| run_reference(&hf_dir()))
}

/// Our prompt ids, last-position logits and greedy continuation.
fn ours(l: &Loaded, prompt: &[u32], eos: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let mut cache = l.model.new_cache().expect("cache");
    let first = l.model.forward(prompt, cache.as_mut()).expect("forward");
    let mut logits = first.clone();
    let mut out = Vec::new();
    while out.len() < MAX_TOKENS {
        let t = argmax(&logits);
        out.push(t);
        if eos.contains(&t) {
            break;
        }
        logits = l.model.forward(&[t], cache.as_mut()).expect("forward");
    }
    (first, out)
}

fn check_model(path: &Path) {
    check_against(path, reference(), true);
}

fn check_against(path: &Path, r: &Value, france_answer: bool) {
    let l = loader::load(
        path,
        &shoal_engine::LoadOptions {
            backend: shoal_engine::BackendChoice::Mlx,
            ..Default::default()
        },
    )
    .expect("load model");
    let results = r["results"].as_array().expect("results");
    assert_eq!(results.len(), PROMPTS.len() + 1);
    for (i, res) in results.iter().enumerate() {
        let ref_prompt = ids(&res["prompt_ids"]);
        let prompt = if i < PROMPTS.len() {
            let msgs = [ChatMessage {
                role: "user".into(),
                content: PROMPTS[i].into(),
            }];
            let text = l
                .vocab
                .render_chat(&msgs, true, &Default::default())
                .expect("render");
            let p = l.vocab.encode(&text).expect("encode");
            assert_eq!(
                p, ref_prompt,
                "prompt ids differ from transformers' template+tokenizer for {:?}",
                PROMPTS[i]
            );
            p
        } else {
            RAW_IDS.to_vec()
        };
        let (logits, greedy) = ours(&l, &prompt, &l.vocab.eos);
        let worst = max_diff(&logits, &floats(&res["logits"]));
        assert!(
            worst < LOGIT_TOL,
            "{}: max |logit diff| {worst} ≥ {LOGIT_TOL} (prompt {i})",
            path.display()
        );
        let ref_greedy = ids(&res["greedy_ids"]);
        assert_eq!(
            greedy,
            ref_greedy,
            "{}: greedy tokens differ for prompt {i}",
            path.display()
        );
        eprintln!(
            "{}: prompt {i}: max |Δlogit| = {worst:.2e}, {} greedy tokens match",
            path.display(),
            greedy.len()
        );
    }
    if france_answer {
        assert_eq!(results[0]["greedy_text"], "The capital of France is Paris.");
    }
}

#[test]
fn gguf_matches_mlx_lm() {
    check_model(&gguf());
}

#[test]
fn hf_directory_matches_mlx_lm() {
    check_model(&hf_dir());
}

/// An MLX-community-style directory: 4-bit affine weights (group 64) in two
/// shards named by an index, `chat_template.jinja`. The reference runs mlx-lm
/// on the same quantized weights expanded by mlx-lm itself
/// (tools/py/quantize_mlx.py), so the comparison is exact arithmetic.
#[test]
fn quantized_sharded_directory_matches_mlx_lm() {
    let quant = models_dir().join("smollm2-135m-mlx-q4-sharded");
    let dequant = models_dir().join("smollm2-135m-mlx-q4-dequant");
    assert!(
        quant.join("model.safetensors.index.json").is_file()
            && dequant.join("config.json").is_file(),
        "quantized test models missing under {} — run `make models`",
        models_dir().display()
    );
    let cfg: Value =
        serde_json::from_str(&std::fs::read_to_string(quant.join("config.json")).expect("config"))
            .expect("json");
    assert_eq!(cfg["quantization"]["bits"], 4);
    let r = run_reference(&dequant);
    check_against(&quant, &r, false);
}
