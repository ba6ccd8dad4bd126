//! Helpers shared by the `shoal` binary's end-to-end test files: isolated
//! commands, servers that stop with the test, and minimal HTTP/1.1 calls.
#![allow(dead_code)] // each test file uses its own share of these

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use serde_json::Value;

pub fn shoal() -> Command {
    Command::new(env!("CARGO_BIN_EXE_shoal"))
}

/// Settings a developer's shell may carry; the config tests set their own.
const SETTING_VARS: &[&str] = &[
    "SHOAL_CONFIG",
    "SHOAL_HOST",
    "SHOAL_PORT",
    "SHOAL_QUEUE",
    "SHOAL_DB",
    "SHOAL_LOG_PROMPTS",
    "SHOAL_LOG_FORMAT",
    "SHOAL_MODEL",
    "SHOAL_MODEL_ID",
    "SHOAL_PREFIX_CACHE_MB",
    "SHOAL_BLOCK",
    "SHOAL_BLOCK_REGEX",
    "SHOAL_MEMORY_BUDGET_MB",
    "SHOAL_IDLE_UNLOAD_SECS",
    "SHOAL_API_KEYS",
    "SHOAL_USAGE_RETENTION_DAYS",
    "SHOAL_USAGE_RETENTION_ROWS",
    "HF_ENDPOINT",
    "HF_TOKEN",
];

/// Clears the settings a shell may carry from `cmd` and points its config,
/// data and model library at `dir`, so only what a test passes counts.
pub fn isolate(cmd: &mut Command, dir: &Path) {
    for v in SETTING_VARS {
        cmd.env_remove(v);
    }
    let xdg = dir.join("xdg");
    std::fs::create_dir_all(&xdg).expect("mkdir");
    cmd.env("XDG_CONFIG_HOME", xdg);
    // The default conversation store lands here, not in the user's home.
    cmd.env("XDG_DATA_HOME", dir.join("xdg-data"));
    // So does the model library.
    cmd.env("HF_HOME", dir.join("hf-home"));
}

/// `shoal`, isolated in `dir`.
pub fn shoal_isolated(dir: &Path) -> Command {
    let mut cmd = shoal();
    isolate(&mut cmd, dir);
    cmd
}

pub fn temp_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("shoal-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("mkdir");
    dir
}

#[path = "../../../shoal-engine/tests/common/fixtures.rs"]
mod fixtures;
#[allow(unused_imports)] // not every test file uses a fixture
pub use fixtures::*;

/// The backend servers started by these tests run the default GGUF on:
/// `SHOAL_BACKEND` passes through to them (`make test` runs the suites on
/// each backend); `auto` sends a GGUF to llama.cpp.
pub fn gguf_backend() -> &'static str {
    match std::env::var("SHOAL_BACKEND").as_deref() {
        Ok("mlx") => "mlx",
        _ if cfg!(target_os = "macos") => "mlx",
        _ => "llama",
    }
}

/// Runs `cmd` and returns (success, stdout, stderr).
pub fn output(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().expect("run shoal");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Kills the server when the test ends, passing or not.
pub struct Server(pub Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `shoal serve` (arguments from `args`) and waits for its listening
/// line; returns the guard that stops it and its address.
pub fn start_server(dir: &Path, args: impl FnOnce(&mut Command)) -> (Server, String) {
    let mut cmd = shoal_isolated(dir);
    args(&mut cmd);
    spawn_server(cmd, dir)
}

/// Spawns a prepared server command (logging to `dir/stderr.log`) and waits
/// for its listening line.
pub fn spawn_server(mut cmd: Command, dir: &Path) -> (Server, String) {
    let log = dir.join("stderr.log");
    let child = cmd
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).expect("log"))
        .spawn()
        .expect("spawn shoal serve");
    let mut server = Server(child);
    let stdout = server.0.stdout.take().expect("stdout");
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line).expect("read");
    let addr = line
        .split("http://")
        .nth(1)
        .and_then(|rest| rest.split_whitespace().next())
        .unwrap_or_else(|| {
            panic!(
                "no listening line: {line:?}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            )
        })
        .to_owned();
    (server, addr)
}

/// One HTTP/1.1 request (the server closes after the response); returns the
/// status line's code, the head and the body.
pub fn request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, String)],
    body: Option<&str>,
) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(120)))
        .expect("timeout");
    let mut extra: String = headers
        .iter()
        .map(|(k, v)| format!("{k}: {v}\r\n"))
        .collect();
    if let Some(b) = body {
        extra.push_str(&format!(
            "Content-Type: application/json\r\nContent-Length: {}\r\n",
            b.len()
        ));
    }
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\n{extra}Connection: close\r\n\r\n{}",
        body.unwrap_or("")
    )
    .expect("send");
    let mut response = String::new();
    stream.read_to_string(&mut response).expect("read");
    let (head, body) = response.split_once("\r\n\r\n").expect("HTTP response");
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status");
    (status, head.to_string(), body.to_string())
}

/// A POST with a JSON body answered with a sized JSON body.
pub fn post_json(addr: &str, path: &str, body: &str) -> (u16, Value) {
    post_json_with(addr, path, body, &[])
}

pub fn post_json_with(
    addr: &str,
    path: &str,
    body: &str,
    headers: &[(&str, String)],
) -> (u16, Value) {
    let (status, head, body) = request(addr, "POST", path, headers, Some(body));
    assert!(
        !head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked"),
        "expected a sized body: {head}"
    );
    (status, serde_json::from_str(&body).expect("JSON body"))
}

/// A GET returning the JSON body.
pub fn get_json(addr: &str, path: &str) -> Value {
    let (_, _, body) = request(addr, "GET", path, &[], None);
    serde_json::from_str(&body).expect("JSON body")
}

/// A GET with extra headers; returns the status and the JSON body.
pub fn get_with(addr: &str, path: &str, headers: &[(&str, String)]) -> (u16, Value) {
    let (status, _, body) = request(addr, "GET", path, headers, None);
    (status, serde_json::from_str(&body).unwrap_or(Value::Null))
}

/// Reads `read` every 250 ms until `done` holds of it or 120 s pass (a hang guard); returns
/// the last reading.
pub fn poll_until<T>(read: impl Fn() -> T, done: impl Fn(&T) -> bool) -> T {
    // Only a hang guard: each wait ends on the state it waits for.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let got = read();
        if done(&got) || std::time::Instant::now() > deadline {
            return got;
        }
        std::thread::sleep(std::time::Duration::from_millis(250));
    }
}

/// Waits (up to 120 s) for a server's log file to contain `needle`; fails
/// with the log and `why` otherwise.
pub fn wait_for_log(log: &Path, needle: &str, why: &str) {
    let text = poll_until(
        || std::fs::read_to_string(log).unwrap_or_default(),
        |text| text.contains(needle),
    );
    assert!(text.contains(needle), "{why}: {text}");
}

/// Polls a node list (`list` returns one) until `done` holds or 120 s pass.
pub fn poll_nodes(list: impl Fn() -> Vec<Value>, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    poll_until(list, |n| done(n))
}

/// Polls `addr`'s node list until `done` holds (or 120 s pass); returns it.
pub fn wait_nodes(addr: &str, done: impl Fn(&[Value]) -> bool) -> Vec<Value> {
    poll_nodes(
        || {
            get_json(addr, "/v1/cluster/nodes")["nodes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        },
        done,
    )
}
