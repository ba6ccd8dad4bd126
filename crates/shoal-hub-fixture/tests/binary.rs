//! The `shoal-hub-fixture` binary as the SDK, UI and desktop suites start it: folders
//! given as `ORG/NAME=DIR` are listed and served byte for byte, weights as LFS files.
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};

use sha2::Digest;

/// Kills the fixture when the test ends, passed or not.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A plain HTTP/1.1 GET (the fixture closes the connection after the reply): status and body.
fn get(endpoint: &str, path: &str) -> (u16, Vec<u8>) {
    let host = endpoint.trim_start_matches("http://");
    let mut stream = TcpStream::connect(host).expect("connect to the fixture");
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n"
    )
    .expect("send");
    let mut reply = Vec::new();
    stream.read_to_end(&mut reply).expect("read the reply");
    let split = reply
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a header block");
    let head = String::from_utf8_lossy(&reply[..split]).into_owned();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("a status");
    let mut body = reply[split + 4..].to_vec();
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        body = unchunk(&body);
    }
    (status, body)
}

fn unchunk(mut raw: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    loop {
        let line_end = raw
            .windows(2)
            .position(|w| w == b"\r\n")
            .expect("a chunk size line");
        let size = usize::from_str_radix(
            std::str::from_utf8(&raw[..line_end]).expect("hex").trim(),
            16,
        )
        .expect("a chunk size");
        if size == 0 {
            return out;
        }
        out.extend_from_slice(&raw[line_end + 2..line_end + 2 + size]);
        raw = &raw[line_end + 4 + size..];
    }
}

#[test]
fn serves_a_folder_as_a_repository() {
    let dir = std::env::temp_dir().join(format!("shoal-hub-fixture-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let weights: Vec<u8> = (0..5000u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(dir.join("tiny.gguf"), &weights).expect("write weights");
    std::fs::write(dir.join("config.json"), b"{\"model_type\": \"llama\"}").expect("write config");

    let mut child = Command::new(env!("CARGO_BIN_EXE_shoal-hub-fixture"))
        .arg(format!("test/Tiny={}", dir.display()))
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the fixture");
    let mut first = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut first)
        .expect("its first line");
    let _running = Running(child);
    let endpoint = first
        .trim()
        .rsplit(' ')
        .next()
        .expect("the endpoint")
        .to_string();
    assert!(endpoint.starts_with("http://127.0.0.1:"), "{first}");

    let (status, listing) = get(&endpoint, "/api/models/test/Tiny/revision/main?blobs=true");
    assert_eq!(status, 200);
    let listing: serde_json::Value = serde_json::from_slice(&listing).expect("JSON listing");
    let siblings = listing["siblings"].as_array().expect("siblings");
    let gguf = siblings
        .iter()
        .find(|s| s["rfilename"] == "tiny.gguf")
        .expect("the weights are listed");
    assert_eq!(
        gguf["lfs"]["sha256"],
        hex::encode(sha2::Sha256::digest(&weights))
    );
    assert_eq!(gguf["size"], weights.len());
    let config = siblings
        .iter()
        .find(|s| s["rfilename"] == "config.json")
        .expect("the config is listed");
    assert!(config.get("lfs").is_none_or(|l| l.is_null()), "{config}");

    let (status, body) = get(&endpoint, "/test/Tiny/resolve/main/tiny.gguf");
    assert_eq!(status, 200);
    assert_eq!(body, weights);
    let (status, _) = get(&endpoint, "/test/Tiny/resolve/main/absent.bin");
    assert_eq!(status, 404);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_malformed_argument_is_a_usage_error() {
    let out = Command::new(env!("CARGO_BIN_EXE_shoal-hub-fixture"))
        .arg("no-equals-sign")
        .output()
        .expect("run the fixture");
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("usage: shoal-hub-fixture"));
}
