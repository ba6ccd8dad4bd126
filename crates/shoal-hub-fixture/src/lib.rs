//! A Hugging Face hub lookalike on loopback for tests: the listing API
//! (`/api/models/{repo}/revision/{rev}?blobs=true`) and the resolve path
//! (`/{repo}/resolve/{rev}/{file}`) with the headers the hub sends (commit,
//! ETag / linked ETag, content range) and byte ranges. It can cut transfers
//! after a number of bytes, serve corrupted bytes, and require a token, and it
//! logs every request so tests can see what a client asked for.
use std::net::SocketAddr;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::{Json, Router};
use futures::StreamExt as _;
use sha2::Digest;

/// One file of a fixture repository.
#[derive(Clone)]
pub struct FixtureFile {
    pub name: String,
    pub bytes: Arc<Vec<u8>>,
    /// Listed with an LFS sha256 (weights) rather than only a git blob id.
    pub lfs: bool,
}

impl FixtureFile {
    pub fn new(name: &str, bytes: Vec<u8>, lfs: bool) -> FixtureFile {
        FixtureFile {
            name: name.into(),
            bytes: Arc::new(bytes),
            lfs,
        }
    }

    fn sha256(&self) -> String {
        hex::encode(sha2::Sha256::digest(self.bytes.as_slice()))
    }

    fn git_oid(&self) -> String {
        let mut h = sha1::Sha1::new();
        h.update(format!("blob {}\0", self.bytes.len()).as_bytes());
        h.update(self.bytes.as_slice());
        hex::encode(h.finalize())
    }
}

#[derive(Clone)]
pub struct FixtureRepo {
    pub id: String,
    pub commit: String,
    pub files: Vec<FixtureFile>,
    /// Requests without `Authorization: Bearer <token>` get 401.
    pub token: Option<String>,
}

/// One request the fixture answered.
#[derive(Debug, Clone, PartialEq)]
pub struct Logged {
    pub path: String,
    /// Bytes asked for (first and last, inclusive), when the request had a range.
    pub range: Option<(u64, u64)>,
    pub status: u16,
}

struct Shared {
    repos: Vec<FixtureRepo>,
    /// Body bytes still served before connections are cut (negative: never).
    budget: AtomicI64,
    corrupt: Mutex<Vec<String>>,
    log: Mutex<Vec<Logged>>,
}

/// A running fixture hub; stops when dropped.
pub struct HubFixture {
    pub endpoint: String,
    shared: Arc<Shared>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl HubFixture {
    pub fn start(repos: Vec<FixtureRepo>) -> HubFixture {
        let shared = Arc::new(Shared {
            repos,
            budget: AtomicI64::new(-1),
            corrupt: Mutex::new(Vec::new()),
            log: Mutex::new(Vec::new()),
        });
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind fixture hub");
        let addr: SocketAddr = listener.local_addr().expect("fixture address");
        listener.set_nonblocking(true).expect("nonblocking");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let app = Router::new()
            .route("/api/models", get(search))
            .route("/api/models/{org}/{name}/revision/{rev}", get(listing))
            .route("/{org}/{name}/resolve/{rev}/{*file}", get(resolve))
            .with_state(shared.clone());
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("fixture runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = stopped.await;
                    })
                    .await;
            });
        });
        HubFixture {
            endpoint: format!("http://{addr}"),
            shared,
            stop: Some(stop),
        }
    }

    /// Cuts every transfer once `bytes` more body bytes have gone out
    /// (`None`: never cut).
    pub fn cut_after(&self, bytes: Option<u64>) {
        let v = bytes.map_or(-1, |b| b as i64);
        self.shared.budget.store(v, Ordering::SeqCst);
    }

    /// Serves `file` with its first byte flipped (same length, wrong hash).
    pub fn corrupt(&self, file: &str) {
        if let Ok(mut c) = self.shared.corrupt.lock() {
            c.push(file.to_string());
        }
    }

    pub fn heal(&self) {
        if let Ok(mut c) = self.shared.corrupt.lock() {
            c.clear();
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> Vec<Logged> {
        self.shared
            .log
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }
}

impl Drop for HubFixture {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

impl Shared {
    fn log(&self, path: String, range: Option<(u64, u64)>, status: StatusCode) {
        if let Ok(mut l) = self.log.lock() {
            l.push(Logged {
                path,
                range,
                status: status.as_u16(),
            });
        }
    }

    /// The repo, if the revision names it and the caller may read it.
    fn repo(&self, id: &str, rev: &str, headers: &HeaderMap) -> Result<&FixtureRepo, StatusCode> {
        let repo = self
            .repos
            .iter()
            .find(|r| r.id == id && (rev == "main" || rev == r.commit))
            .ok_or(StatusCode::NOT_FOUND)?;
        if let Some(token) = &repo.token {
            let given = headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok());
            if given != Some(&format!("Bearer {token}")) {
                return Err(StatusCode::UNAUTHORIZED);
            }
        }
        Ok(repo)
    }
}

async fn listing(
    State(s): State<Arc<Shared>>,
    Path((org, name, rev)): Path<(String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let id = format!("{org}/{name}");
    let path = format!("/api/models/{id}/revision/{rev}");
    let repo = match s.repo(&id, &rev, &headers) {
        Ok(r) => r,
        Err(status) => {
            s.log(path, None, status);
            return (
                status,
                Json(serde_json::json!({"error": "Repository not found"})),
            )
                .into_response();
        }
    };
    let siblings: Vec<serde_json::Value> = repo
        .files
        .iter()
        .map(|f| {
            let mut v = serde_json::json!({
                "rfilename": f.name, "size": f.bytes.len(), "blobId": f.git_oid(),
            });
            if f.lfs {
                v["lfs"] = serde_json::json!({
                    "sha256": f.sha256(), "size": f.bytes.len(), "pointerSize": 134,
                });
            }
            v
        })
        .collect();
    s.log(path, None, StatusCode::OK);
    Json(serde_json::json!({"id": repo.id, "sha": repo.commit, "siblings": siblings}))
        .into_response()
}

/// `/api/models?search=…&limit=…`: the repositories whose id contains the
/// search text, ignoring case (tokened repositories too, as the hub lists
/// private ones to their owner), with the tags the hub gives a GGUF repo.
async fn search(
    State(s): State<Arc<Shared>>,
    axum::extract::Query(q): axum::extract::Query<std::collections::HashMap<String, String>>,
) -> Response {
    let text = q
        .get("search")
        .map(|t| t.to_lowercase())
        .unwrap_or_default();
    let limit = q
        .get("limit")
        .and_then(|l| l.parse().ok())
        .unwrap_or(usize::MAX);
    let found: Vec<serde_json::Value> = s
        .repos
        .iter()
        .filter(|r| r.id.to_lowercase().contains(&text))
        .take(limit)
        .map(|r| {
            let gguf = r.files.iter().any(|f| f.name.ends_with(".gguf"));
            let tags: Vec<&str> = if gguf { vec!["gguf"] } else { vec![] };
            serde_json::json!({"id": r.id, "modelId": r.id, "downloads": 0, "likes": 0, "tags": tags})
        })
        .collect();
    s.log(format!("/api/models?search={text}"), None, StatusCode::OK);
    Json(found).into_response()
}

/// `bytes=a-b` (b inclusive, clamped to the file) or `bytes=a-`.
fn parse_range(headers: &HeaderMap, len: u64) -> Option<(u64, u64)> {
    let v = headers.get(header::RANGE)?.to_str().ok()?;
    let (a, b) = v.strip_prefix("bytes=")?.split_once('-')?;
    let start: u64 = a.parse().ok()?;
    let end: u64 = if b.is_empty() {
        len.saturating_sub(1)
    } else {
        b.parse::<u64>().ok()?.min(len.saturating_sub(1))
    };
    (start <= end && start < len).then_some((start, end))
}

async fn resolve(
    State(s): State<Arc<Shared>>,
    Path((org, name, rev, file)): Path<(String, String, String, String)>,
    headers: HeaderMap,
) -> Response {
    let id = format!("{org}/{name}");
    let path = format!("/{id}/resolve/{rev}/{file}");
    let repo = match s.repo(&id, &rev, &headers) {
        Ok(r) => r,
        Err(status) => {
            s.log(path, None, status);
            return status.into_response();
        }
    };
    let Some(f) = repo.files.iter().find(|f| f.name == file) else {
        s.log(path, None, StatusCode::NOT_FOUND);
        return (StatusCode::NOT_FOUND, [("x-error-code", "EntryNotFound")]).into_response();
    };
    let len = f.bytes.len() as u64;
    let range = parse_range(&headers, len);
    let mut body = f.bytes.as_slice().to_vec();
    let corrupt = s
        .corrupt
        .lock()
        .map(|c| c.contains(&f.name))
        .unwrap_or(false);
    if corrupt {
        if let Some(b) = body.first_mut() {
            *b ^= 0xff;
        }
    }
    let (status, start, end) = match range {
        Some((a, b)) => (StatusCode::PARTIAL_CONTENT, a, b),
        None => (StatusCode::OK, 0, len.saturating_sub(1)),
    };
    s.log(path, range, status);
    let part = if len == 0 {
        Vec::new()
    } else {
        body[start as usize..=end as usize].to_vec()
    };
    let etag = if f.lfs { f.sha256() } else { f.git_oid() };
    let mut resp = Response::builder()
        .status(status)
        .header("x-repo-commit", &repo.commit)
        .header(header::ETAG, format!("\"{etag}\""))
        .header(header::ACCEPT_RANGES, "bytes")
        .header(header::CONTENT_RANGE, format!("bytes {start}-{end}/{len}"));
    if f.lfs {
        resp = resp.header("x-linked-etag", format!("\"{etag}\""));
    }
    let shared = s.clone();
    let pieces: Vec<bytes::Bytes> = part
        .chunks(16 << 10)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    // Each piece draws on the cut budget; once it runs out the stream
    // errors and the connection drops mid-body, as a flaky network would.
    let stream = futures::stream::iter(pieces).map(move |piece| {
        let want = piece.len() as i64;
        let budget = shared.budget.load(Ordering::SeqCst);
        if budget < 0 {
            return Ok(piece);
        }
        if budget >= want {
            shared.budget.fetch_sub(want, Ordering::SeqCst);
            Ok(piece)
        } else {
            shared.budget.store(0, Ordering::SeqCst);
            Err(std::io::Error::other("connection cut by the fixture"))
        }
    });
    resp.body(Body::from_stream(stream))
        .unwrap_or_else(|_| StatusCode::INTERNAL_SERVER_ERROR.into_response())
}

/// A GGUF file with the header metadata a card reads and tensors of the given
/// shapes (no weight data: only the header is ever read from it).
pub fn gguf_bytes(arch: &str, file_type: u32, context: u32, tensors: &[(&str, &[u64])]) -> Vec<u8> {
    fn text(out: &mut Vec<u8>, s: &str) {
        out.extend((s.len() as u64).to_le_bytes());
        out.extend(s.as_bytes());
    }
    let mut g = b"GGUF".to_vec();
    g.extend(3u32.to_le_bytes());
    g.extend((tensors.len() as u64).to_le_bytes());
    g.extend(4u64.to_le_bytes());
    text(&mut g, "general.architecture");
    g.extend(8u32.to_le_bytes());
    text(&mut g, arch);
    text(&mut g, &format!("{arch}.context_length"));
    g.extend(4u32.to_le_bytes());
    g.extend(context.to_le_bytes());
    // An array of strings, as a tokenizer's vocabulary is stored.
    text(&mut g, "tokenizer.ggml.tokens");
    g.extend(9u32.to_le_bytes());
    g.extend(8u32.to_le_bytes());
    g.extend(2u64.to_le_bytes());
    text(&mut g, "a");
    text(&mut g, "b");
    text(&mut g, "general.file_type");
    g.extend(4u32.to_le_bytes());
    g.extend(file_type.to_le_bytes());
    for (name, dims) in tensors {
        text(&mut g, name);
        g.extend((dims.len() as u32).to_le_bytes());
        for d in *dims {
            g.extend(d.to_le_bytes());
        }
        g.extend(2u32.to_le_bytes());
        g.extend(0u64.to_le_bytes());
    }
    g
}

/// A safetensors file holding zeroed tensors `(name, dtype, shape)`.
pub fn safetensors_bytes(tensors: &[(&str, &str, &[u64])]) -> Vec<u8> {
    let mut header = serde_json::Map::new();
    header.insert("__metadata__".into(), serde_json::json!({"format": "mlx"}));
    let mut offset = 0u64;
    for (name, dtype, shape) in tensors {
        let width = match *dtype {
            "F32" | "U32" => 4,
            "F16" | "BF16" => 2,
            _ => 1,
        };
        let len = shape.iter().product::<u64>() * width;
        header.insert(
            name.to_string(),
            serde_json::json!({"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + len]}),
        );
        offset += len;
    }
    let header = serde_json::Value::Object(header).to_string();
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header.as_bytes());
    out.extend(vec![0u8; offset as usize]);
    out
}
