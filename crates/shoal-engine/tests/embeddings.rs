//! Embeddings on the real all-MiniLM-L6-v2 GGUF (`make models` converts it
//! from the sentence-transformers files with `tools/py/bert_gguf.py`),
//! checked against an independent numpy BERT on those same files
//! (`tools/py/bert_reference.py`, the `tokenizers` package for the tokens):
//! every vector of a fixed corpus (short, long, unicode, code) at cosine ≥
//! 0.999, every token count equal, and a vector computed beside others equal
//! to its lone run.
mod common;

use std::path::PathBuf;

use shoal_engine::{Engine, EngineError, EngineOptions, GenerateRequest};

/// The converted GGUF: `SHOAL_TEST_EMBED_GGUF`, else where `make models` puts it.
fn gguf() -> PathBuf {
    let p = std::env::var("SHOAL_TEST_EMBED_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            common::repo().join(".cache/models/all-minilm-l6-v2-0.1.2/all-MiniLM-L6-v2-F16.gguf")
        });
    assert!(
        p.is_file(),
        "embedding model missing at {} — run `make models`",
        p.display()
    );
    p
}

/// The sentence-transformers directory the GGUF was made from.
fn hf_dir() -> PathBuf {
    gguf().parent().expect("a directory").join("hf")
}

fn corpus() -> Vec<String> {
    let text = std::fs::read_to_string(common::repo().join("tests/data/embedding-corpus.json"))
        .expect("corpus");
    serde_json::from_str(&text).expect("a JSON list of strings")
}

struct Reference {
    token_counts: Vec<usize>,
    vectors: Vec<Vec<f64>>,
}

/// The numpy reference on `inputs`, one at a time, for the model files in `hf`.
fn reference_of(hf: &std::path::Path, inputs: &[String]) -> Reference {
    static RUNS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let run = RUNS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("shoal-embed-ref-{}-{run}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let (input, out) = (dir.join("inputs.json"), dir.join("out.json"));
    std::fs::write(&input, serde_json::to_string(inputs).expect("json")).expect("write");
    py(&[
        common::repo()
            .join("tools/py/bert_reference.py")
            .as_os_str(),
        hf.as_os_str(),
        "--inputs-json".as_ref(),
        input.as_os_str(),
        "--out".as_ref(),
        out.as_os_str(),
    ]);
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).expect("output")).expect("json");
    let _ = std::fs::remove_dir_all(&dir);
    Reference {
        token_counts: serde_json::from_value(v["token_counts"].clone()).expect("counts"),
        vectors: serde_json::from_value(v["vectors"].clone()).expect("vectors"),
    }
}

/// The reference on the shipped model's own files.
fn reference(inputs: &[String]) -> Reference {
    reference_of(&hf_dir(), inputs)
}

fn cosine(a: &[f32], b: &[f64]) -> f64 {
    let dot: f64 = a.iter().zip(b).map(|(&x, &y)| f64::from(x) * y).sum();
    let na: f64 = a.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|y| y * y).sum::<f64>().sqrt();
    dot / (na * nb)
}

fn widen(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&x| f64::from(x)).collect()
}

fn start() -> Engine {
    Engine::start(&gguf(), "minilm", EngineOptions::default()).expect("load the embedding model")
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

#[test]
fn vectors_and_token_counts_equal_the_reference_alone_batched_and_concurrent() {
    let engine = start();
    let info = engine
        .model
        .embedding()
        .expect("an embedding model")
        .clone();
    assert_eq!(
        (info.dimensions, info.pooling.as_str(), info.normalize),
        (384, "mean", true)
    );
    assert_eq!(info.max_input_tokens, 512);
    let texts = corpus();
    let want = reference(&texts);
    let tokens: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| engine.model.embedding_tokens(t, false).expect("tokenize"))
        .collect();
    let counts: Vec<usize> = tokens.iter().map(Vec::len).collect();
    assert_eq!(
        counts, want.token_counts,
        "token counts against `tokenizers`"
    );

    let rt = runtime();
    // Each input alone.
    let lone: Vec<Vec<f32>> = tokens
        .iter()
        .map(|t| {
            let out = rt.block_on(engine.embed(vec![t.clone()])).expect("embed");
            assert_eq!(out.tokens, vec![t.len()]);
            out.vectors.into_iter().next().expect("one vector")
        })
        .collect();
    for (i, (got, want)) in lone.iter().zip(&want.vectors).enumerate() {
        let c = cosine(got, want);
        assert!(c >= 0.999, "input {i} ({:?}): cosine {c}", texts[i]);
        let norm: f32 = got.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!((norm - 1.0).abs() < 1e-4, "input {i}: norm {norm}");
    }
    // All in one request: the passes share inputs.
    let batched = rt
        .block_on(engine.embed(tokens.clone()))
        .expect("embed batch");
    assert_eq!(batched.prompt_tokens(), counts.iter().sum::<usize>());
    for (i, (b, l)) in batched.vectors.iter().zip(&lone).enumerate() {
        let c = cosine(b, &widen(l));
        assert!(c >= 0.9999, "input {i}: batched against lone cosine {c}");
    }
    // Many requests at once: they join the same round.
    let together = rt.block_on(async {
        let calls: Vec<_> = tokens
            .iter()
            .map(|t| {
                let e = engine.clone();
                let t = t.clone();
                tokio::spawn(async move { e.embed(vec![t]).await })
            })
            .collect();
        let mut out = Vec::new();
        for c in calls {
            out.push(c.await.expect("task").expect("embed"));
        }
        out
    });
    for (i, (t, l)) in together.iter().zip(&lone).enumerate() {
        let c = cosine(&t.vectors[0], &widen(l));
        assert!(c >= 0.9999, "input {i}: concurrent against lone cosine {c}");
    }
}

#[test]
fn requests_that_wait_together_share_one_round_and_its_passes() {
    use std::sync::atomic::Ordering::Relaxed;
    let engine = start();
    let stats = engine.stats.clone();
    let rt = runtime();
    // A request long enough to keep the engine busy while twelve more queue.
    let busy: Vec<Vec<u32>> = (0..512)
        .map(|i| {
            engine
                .model
                .embedding_tokens(
                    &format!(
                        "sentence {i} of a long request that keeps the engine busy for a while"
                    ),
                    false,
                )
                .expect("tokenize")
        })
        .collect();
    // Every corpus entry but the long one.
    let small: Vec<Vec<u32>> = corpus()
        .iter()
        .map(|t| engine.model.embedding_tokens(t, true).expect("tokenize"))
        .filter(|t| t.len() < 100)
        .collect();
    assert_eq!(small.len(), 12);
    let rounds = stats.embedding_rounds.load(Relaxed);
    let passes = stats.decode_passes.load(Relaxed);
    rt.block_on(async {
        let e = engine.clone();
        let big = tokio::spawn(async move { e.embed(busy).await });
        // The long request's round has begun when the engine says it runs.
        while stats.running.load(Relaxed) == 0 {
            tokio::task::yield_now().await;
        }
        let calls: Vec<_> = small
            .iter()
            .map(|t| {
                let e = engine.clone();
                let t = t.clone();
                tokio::spawn(async move { e.embed(vec![t]).await })
            })
            .collect();
        for c in calls {
            c.await.expect("task").expect("embed");
        }
        big.await.expect("task").expect("embed");
    });
    assert_eq!(
        stats.embedding_rounds.load(Relaxed) - rounds,
        2,
        "the long request's round, then one round for the twelve that waited"
    );
    let small_tokens: usize = small.iter().map(Vec::len).sum();
    let info = engine.model.embedding().expect("embedding").clone();
    assert!(small_tokens <= info.batch_tokens, "the twelve fit one pass");
    let big_passes = stats.decode_passes.load(Relaxed) - passes - 1;
    assert!(
        (1..512).contains(&big_passes),
        "{big_passes} passes for 512 inputs"
    );
}

#[test]
fn long_inputs_are_refused_or_truncated_and_bad_ids_refused() {
    let engine = start();
    let long = "word ".repeat(1000);
    let full = engine
        .model
        .embedding_tokens(&long, false)
        .expect("tokenize");
    assert_eq!(full.len(), 1002, "[CLS] + 1000 words + [SEP]");
    let rt = runtime();
    match rt.block_on(engine.embed(vec![full.clone()])) {
        Err(EngineError::ContextOverflow {
            prompt_tokens: 1002,
            context: 512,
        }) => {}
        other => panic!("expected a context overflow, got {other:?}"),
    }
    let cut = engine
        .model
        .embedding_tokens(&long, true)
        .expect("tokenize");
    assert_eq!(cut.len(), 512);
    assert_eq!(
        (cut[0], cut[510], cut[511]),
        (full[0], full[510], full[1001]),
        "the cut keeps [CLS] and ends with [SEP]"
    );
    let out = rt.block_on(engine.embed(vec![cut])).expect("embed");
    assert_eq!(out.prompt_tokens(), 512);
    match rt.block_on(engine.embed(vec![vec![101, 999_999, 102]])) {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("999999"), "{m}"),
        other => panic!("expected an invalid request, got {other:?}"),
    }
    match rt.block_on(engine.embed(vec![Vec::new()])) {
        Err(EngineError::InvalidRequest(m)) => assert!(m.contains("no tokens"), "{m}"),
        other => panic!("expected an invalid request, got {other:?}"),
    }
    // Still serving after the refusals.
    assert_eq!(
        rt.block_on(engine.embed(vec![vec![101, 7592, 102]]))
            .expect("embed")
            .vectors[0]
            .len(),
        384
    );
}

#[test]
fn each_kind_of_model_refuses_the_other_kind_of_work() {
    let embedder = start();
    match embedder.submit(GenerateRequest::new(vec![101, 7592, 102])) {
        Err(EngineError::WrongKind(m)) => assert!(m.contains("embedding model"), "{m}"),
        Err(e) => panic!("expected WrongKind, got {e}"),
        Ok(_) => panic!("an embedding model generated"),
    }
    let chat = Engine::start(
        &common::gguf(),
        "chat",
        EngineOptions {
            backend: shoal_engine::BackendChoice::Llama,
            ..EngineOptions::default()
        },
    )
    .expect("load the chat model");
    assert!(chat.model.embedding().is_none());
    match runtime().block_on(chat.embed(vec![vec![1, 2, 3]])) {
        Err(EngineError::WrongKind(m)) => assert!(m.contains("not an embedding model"), "{m}"),
        other => panic!("expected WrongKind, got {other:?}"),
    }
}

/// Runs a tool of the test venv.
fn py(args: &[&std::ffi::OsStr]) {
    let status = std::process::Command::new(common::python())
        .args(args)
        .status()
        .expect("run python");
    assert!(status.success(), "python {args:?} failed");
}

/// Another pooling read from the model's own files: the same MiniLM with
/// its sentence-transformers pooling set to CLS, converted again, matches
/// the reference computed from those files.
#[test]
fn cls_pooling_comes_from_the_model_files() {
    let dir = std::env::temp_dir().join(format!("shoal-embed-cls-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let hf = dir.join("hf");
    std::fs::create_dir_all(hf.join("1_Pooling")).expect("dirs");
    for entry in std::fs::read_dir(hf_dir()).expect("hf dir") {
        let p = entry.expect("entry").path();
        if p.is_file() {
            std::os::unix::fs::symlink(&p, hf.join(p.file_name().expect("name"))).expect("link");
        }
    }
    std::fs::write(
        hf.join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 384, "pooling_mode_cls_token": true, "pooling_mode_mean_tokens": false}"#,
    )
    .expect("pooling config");
    let out = dir.join("cls.gguf");
    py(&[
        common::repo().join("tools/py/bert_gguf.py").as_os_str(),
        hf.as_os_str(),
        out.as_os_str(),
    ]);
    let engine = Engine::start(&out, "cls", EngineOptions::default()).expect("load");
    assert_eq!(
        engine
            .model
            .embedding()
            .expect("embedding")
            .pooling
            .as_str(),
        "cls"
    );
    let texts: Vec<String> = corpus().into_iter().take(4).collect();
    // The reference, on the CLS directory.
    let want = reference_of(&hf, &texts).vectors;
    let tokens: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| engine.model.embedding_tokens(t, false).expect("tokenize"))
        .collect();
    let got = runtime().block_on(engine.embed(tokens)).expect("embed");
    let mean = reference(&texts);
    for (i, g) in got.vectors.iter().enumerate() {
        let c = cosine(g, &want[i]);
        assert!(c >= 0.999, "input {i}: CLS cosine {c}");
        // And it is not the mean-pooled vector.
        assert!(
            cosine(g, &mean.vectors[i]) < 0.99,
            "input {i} looks mean-pooled"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A decoder embedding model (a causal GGUF marked with last-token pooling,
/// as Qwen3-Embedding files are): its KV cache is cleared after each pass,
/// so a vector is the same alone, beside others and asked again.
#[test]
fn a_decoder_embedding_model_pools_its_last_token() {
    let dir = std::env::temp_dir().join(format!("shoal-embed-last-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("dir");
    let out = dir.join("smollm2-last.gguf");
    py(&[
        common::repo().join("tools/py/gguf_edit.py").as_os_str(),
        common::gguf().as_os_str(),
        out.as_os_str(),
        "--pooling".as_ref(),
        "last".as_ref(),
    ]);
    // The MLX backend is asked for: an embedding model runs on llama.cpp anyway.
    let engine = Engine::start(
        &out,
        "last",
        EngineOptions {
            backend: shoal_engine::BackendChoice::Mlx,
            ..EngineOptions::default()
        },
    )
    .expect("load");
    assert_eq!(engine.model.info.backend, shoal_engine::BackendKind::Llama);
    let info = engine.model.embedding().expect("embedding").clone();
    assert_eq!((info.pooling.as_str(), info.dimensions), ("last", 576));
    let texts = [
        "A man is eating food.",
        "The girl is carrying a baby.",
        "def f(x): return x",
    ];
    let tokens: Vec<Vec<u32>> = texts
        .iter()
        .map(|t| engine.model.embedding_tokens(t, false).expect("tokenize"))
        .collect();
    let rt = runtime();
    let together = rt.block_on(engine.embed(tokens.clone())).expect("embed");
    for (i, t) in tokens.iter().enumerate() {
        for round in 0..2 {
            let lone = rt.block_on(engine.embed(vec![t.clone()])).expect("embed");
            let c = cosine(&lone.vectors[0], &widen(&together.vectors[i]));
            assert!(c >= 0.9999, "input {i}, round {round}: cosine {c}");
        }
    }
    let apart = cosine(&together.vectors[0], &widen(&together.vectors[2]));
    assert!(
        apart < 0.99,
        "different inputs, near-equal vectors: {apart}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
