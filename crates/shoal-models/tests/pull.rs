//! `pull` against the loopback hub fixture: full download, resume after a
//! cut, checksum mismatch, missing files, tokens, progress, listing, removal.
use std::path::PathBuf;

use shoal_hub_fixture::{gguf_bytes, safetensors_bytes, FixtureFile, FixtureRepo, HubFixture};
use shoal_models::{pull, HubOptions, Library, ModelsError, PullEvent, PullSpec, Source};

const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";

fn temp(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-pull-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Bytes that do not compress or repeat, so a wrong range shows.
fn noise(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn dir_repo() -> FixtureRepo {
    let mut weights = safetensors_bytes(&[("model.norm.weight", "F32", &[1000])]);
    weights.extend(noise(0, 1));
    FixtureRepo {
        id: "org/tiny-mlx".into(),
        commit: COMMIT.into(),
        token: None,
        files: vec![
            FixtureFile::new(
                "config.json",
                br#"{"model_type":"qwen3","max_position_embeddings":4096,"quantization":{"bits":4,"group_size":64}}"#.to_vec(),
                false,
            ),
            FixtureFile::new("tokenizer.json", b"{\"model\":{}}".to_vec(), false),
            FixtureFile::new("model.safetensors", weights, true),
            FixtureFile::new("README.md", b"# not needed".to_vec(), false),
        ],
    }
}

/// A GGUF repo whose weights are big enough to cut mid-way: the header
/// followed by noise.
fn gguf_repo(token: Option<&str>) -> FixtureRepo {
    let mut q4 = gguf_bytes("llama", 2, 2048, &[("token_embd.weight", &[64, 100])]);
    q4.extend(noise(1 << 20, 7));
    let q2 = gguf_bytes("llama", 10, 2048, &[("token_embd.weight", &[64, 100])]);
    FixtureRepo {
        id: "org/tiny-GGUF".into(),
        commit: COMMIT.replace('0', "f"),
        token: token.map(str::to_string),
        files: vec![
            FixtureFile::new("tiny-Q4_0.gguf", q4, true),
            FixtureFile::new("tiny-Q2_K.gguf", q2, true),
        ],
    }
}

fn options(hub: &HubFixture, home: &std::path::Path) -> HubOptions {
    HubOptions {
        endpoint: hub.endpoint.clone(),
        token: None,
        library: Library::at(home.join("hub")),
        chunk_bytes: 64 << 10,
        retries: 0,
    }
}

async fn pull_collect(
    spec: &str,
    file: Option<&str>,
    opts: &HubOptions,
) -> (
    Result<shoal_models::LocalModel, ModelsError>,
    Vec<PullEvent>,
) {
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let spec = PullSpec::parse(spec, file.map(str::to_string)).unwrap();
    let result = pull(&spec, opts, tx).await;
    let mut events = Vec::new();
    while let Ok(e) = rx.try_recv() {
        events.push(e);
    }
    (result, events)
}

/// Progress byte counts never go down and the last one is the total.
fn assert_progress_complete(events: &[PullEvent]) {
    let total = events
        .iter()
        .find_map(|e| match e {
            PullEvent::Plan { total_bytes, .. } => Some(*total_bytes),
            _ => None,
        })
        .expect("a plan event");
    let bytes: Vec<u64> = events
        .iter()
        .filter_map(|e| match e {
            PullEvent::Progress {
                bytes, total_bytes, ..
            } => {
                assert_eq!(*total_bytes, total);
                Some(*bytes)
            }
            _ => None,
        })
        .collect();
    assert!(!bytes.is_empty(), "no progress events");
    assert!(
        bytes.windows(2).all(|w| w[0] <= w[1]),
        "progress went back: {bytes:?}"
    );
    assert_eq!(
        *bytes.last().unwrap(),
        total,
        "progress did not end at 100%"
    );
    assert!(matches!(events.last(), Some(PullEvent::Done { .. })));
}

#[tokio::test]
async fn full_download_lists_the_model_and_a_second_pull_fetches_nothing() {
    let hub = HubFixture::start(vec![dir_repo()]);
    let home = temp("full");
    let opts = options(&hub, &home);
    let (model, events) = pull_collect("org/tiny-mlx", None, &opts).await;
    let model = model.unwrap();
    assert_eq!(model.id, "org/tiny-mlx");
    assert_eq!(model.card.architecture.as_deref(), Some("qwen3"));
    assert_eq!(model.card.quantization.as_deref(), Some("4-bit g64"));
    assert_eq!(model.card.context_length, Some(4096));
    assert_eq!(
        model.source,
        Source::Hub {
            repo: "org/tiny-mlx".into(),
            commit: COMMIT.into()
        }
    );
    assert!(
        !model.path.join("README.md").exists(),
        "README is not a model file"
    );
    assert_progress_complete(&events);
    let verified = events
        .iter()
        .filter(|e| {
            matches!(
                e,
                PullEvent::FileDone {
                    verified: true,
                    cached: false,
                    ..
                }
            )
        })
        .count();
    assert_eq!(verified, 3);

    let listed = opts.library.list();
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].id, "org/tiny-mlx");

    let before = hub.requests().len();
    let (again, events) = pull_collect("org/tiny-mlx", None, &opts).await;
    again.unwrap();
    let after = hub.requests();
    assert!(
        after[before..].iter().all(|r| r.path.starts_with("/api/")),
        "files were fetched again: {:?}",
        &after[before..]
    );
    assert!(events
        .iter()
        .any(|e| matches!(e, PullEvent::FileDone { cached: true, .. })));
    assert_progress_complete(&events);
}

#[tokio::test]
async fn a_cut_download_resumes_from_the_last_whole_chunk() {
    let hub = HubFixture::start(vec![gguf_repo(None)]);
    let home = temp("resume");
    let opts = options(&hub, &home);
    hub.cut_after(Some(300_000));
    let (first, _) = pull_collect("org/tiny-GGUF", Some("tiny-Q4_0.gguf"), &opts).await;
    let err = first.unwrap_err();
    assert!(matches!(err, ModelsError::Hub(_)), "{err}");
    assert!(err.to_string().contains("resume"), "{err}");
    assert!(opts.library.list().is_empty(), "a half file is not a model");

    hub.cut_after(None);
    let before = hub.requests().len();
    let (second, events) = pull_collect("org/tiny-GGUF", Some("tiny-Q4_0.gguf"), &opts).await;
    let model = second.unwrap();
    assert_eq!(model.id, "org/tiny-GGUF/tiny-Q4_0.gguf");
    assert_eq!(model.card.quantization.as_deref(), Some("Q4_0"));
    // Data requests (not the one-byte metadata probe) start past zero.
    let starts: Vec<u64> = hub.requests()[before..]
        .iter()
        .filter_map(|r| r.range.filter(|(a, b)| b > a).map(|(a, _)| a))
        .collect();
    assert!(!starts.is_empty());
    assert!(
        starts[0] >= 64 << 10,
        "restarted from {}: {starts:?}",
        starts[0]
    );
    assert_progress_complete(&events);
}

#[tokio::test]
async fn a_checksum_mismatch_is_refused_and_leaves_nothing() {
    let hub = HubFixture::start(vec![gguf_repo(None)]);
    let home = temp("checksum");
    let opts = options(&hub, &home);
    hub.corrupt("tiny-Q4_0.gguf");
    let (res, _) = pull_collect("org/tiny-GGUF", None, &opts).await;
    let err = res.unwrap_err();
    assert!(matches!(err, ModelsError::Checksum { .. }), "{err}");
    assert!(opts.library.list().is_empty());
    hub.heal();
    let (res, _) = pull_collect("org/tiny-GGUF", None, &opts).await;
    // The preferred quantization of the two files.
    assert_eq!(res.unwrap().id, "org/tiny-GGUF/tiny-Q4_0.gguf");
}

#[tokio::test]
async fn missing_files_repos_and_tokens_get_clear_errors() {
    let hub = HubFixture::start(vec![gguf_repo(Some("secret"))]);
    let home = temp("errors");
    let mut opts = options(&hub, &home);
    let (res, _) = pull_collect("org/tiny-GGUF", None, &opts).await;
    let err = res.unwrap_err();
    assert!(matches!(err, ModelsError::Unauthorized(_)), "{err}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");

    opts.token = Some("secret".into());
    let (res, _) = pull_collect("org/tiny-GGUF", Some("nope.gguf"), &opts).await;
    let err = res.unwrap_err();
    assert!(matches!(err, ModelsError::MissingFile { .. }), "{err}");
    let (res, _) = pull_collect("org/absent", None, &opts).await;
    let err = res.unwrap_err();
    assert!(matches!(err, ModelsError::RepoNotFound { .. }), "{err}");
    let (res, _) = pull_collect("org/tiny-GGUF", Some("tiny-Q2_K.gguf"), &opts).await;
    assert_eq!(res.unwrap().card.quantization.as_deref(), Some("Q2_K"));
}

#[tokio::test]
async fn removing_models_frees_their_files() {
    let hub = HubFixture::start(vec![gguf_repo(None), dir_repo()]);
    let home = temp("rm");
    let opts = options(&hub, &home);
    for (spec, file) in [
        ("org/tiny-GGUF", Some("tiny-Q4_0.gguf")),
        ("org/tiny-GGUF", Some("tiny-Q2_K.gguf")),
        ("org/tiny-mlx", None),
    ] {
        pull_collect(spec, file, &opts).await.0.unwrap();
    }
    let lib = &opts.library;
    let ids: Vec<String> = lib.list().into_iter().map(|m| m.id).collect();
    assert_eq!(
        ids,
        [
            "org/tiny-GGUF/tiny-Q2_K.gguf",
            "org/tiny-GGUF/tiny-Q4_0.gguf",
            "org/tiny-mlx"
        ]
    );
    // Two GGUF files: the repo id alone is ambiguous.
    assert!(lib.find("org/tiny-GGUF").is_none());
    let freed = lib.remove("org/tiny-GGUF/tiny-Q4_0.gguf").unwrap();
    assert!(freed > 1 << 20);
    assert_eq!(
        lib.find("org/tiny-GGUF").unwrap().id,
        "org/tiny-GGUF/tiny-Q2_K.gguf"
    );
    lib.remove("org/tiny-GGUF").unwrap();
    lib.remove("org/tiny-mlx").unwrap();
    assert!(lib.list().is_empty());
    assert_eq!(std::fs::read_dir(lib.hub_dir.clone()).unwrap().count(), 0);
    assert!(matches!(
        lib.remove("org/tiny-mlx"),
        Err(ModelsError::NotFound(_))
    ));
}
