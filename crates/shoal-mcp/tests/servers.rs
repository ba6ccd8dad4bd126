//! The hub against the reference MCP server from npm
//! (`@modelcontextprotocol/server-everything`, installed in `tests/mcp` by
//! `make setup`), over stdio and Streamable HTTP: tools and their read-only
//! hints, calls, the environment a stdio server sees, cut results, a call
//! past the timeout, a server that dies, and a changed configuration.
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use shoal_mcp::{Limits, McpError, McpFile, McpHub};

/// The reference server's entry point.
fn everything() -> PathBuf {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp/node_modules/@modelcontextprotocol/server-everything/dist/index.js");
    assert!(
        p.exists(),
        "{} is missing: `make setup` installs tests/mcp (npm ci)",
        p.display()
    );
    p
}

/// A hub whose one server, `every`, is the reference server over stdio,
/// started with `env`.
async fn stdio_hub(env: Value, limits: Limits) -> McpHub {
    let file = McpFile::parse(
        &json!({"mcpServers": {"every": {
            "command": "node",
            "args": [everything(), "stdio"],
            "env": env,
        }}})
        .to_string(),
        "test",
    )
    .expect("valid");
    let hub = McpHub::open(None, limits);
    hub.set_config(file).await.expect("set");
    hub
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_tools_calls_env_and_cut_results() {
    let hub = stdio_hub(
        json!({"SHOAL_TEST_GIVEN": "yes"}),
        Limits {
            timeout: Duration::from_secs(60),
            max_result_chars: 40,
            ..Limits::default()
        },
    )
    .await;
    let servers = hub.servers().await;
    assert_eq!(servers.len(), 1);
    assert_eq!(servers[0].state, "ready", "{servers:?}");
    let tools = hub.tools().await;
    assert_eq!(servers[0].tools, tools.len());
    let echo = tools.iter().find(|t| t.name == "echo").expect("echo");
    assert_eq!(echo.function, "every__echo");
    assert!(echo.read_only, "echo says readOnlyHint");
    assert_eq!(echo.input_schema["properties"]["message"]["type"], "string");
    let gzip = tools
        .iter()
        .find(|t| t.name == "gzip-file-as-resource")
        .expect("gzip");
    assert!(!gzip.read_only, "gzip says it is not read-only");

    let out = hub
        .call("every", "echo", json!({"message": "hi"}))
        .await
        .expect("echo");
    assert_eq!(out.content, "Echo: hi");
    assert!(!out.is_error && !out.truncated);
    assert_eq!(out.chars, 8);

    // A stdio server sees PATH, HOME and what its entry gives, nothing else.
    let out = hub
        .call("every", "get-env", Value::Null)
        .await
        .expect("env");
    assert!(
        out.truncated,
        "the environment is longer than 40 characters"
    );
    assert!(out.content.contains("[… cut: 40 of"), "{}", out.content);
    let full = stdio_hub(json!({"SHOAL_TEST_GIVEN": "yes"}), Limits::default()).await;
    let out = full
        .call("every", "get-env", Value::Null)
        .await
        .expect("env");
    let env: Value = serde_json::from_str(&out.content).expect("env is JSON");
    let mut keys: Vec<&str> = env
        .as_object()
        .expect("object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    keys.retain(|k| !["PATH", "HOME"].contains(k));
    assert_eq!(keys, ["SHOAL_TEST_GIVEN"], "{env}");

    // A tool's own error reaches the caller as a result, not a failure.
    let out = hub
        .call("every", "get-sum", json!({"a": "x", "b": 1}))
        .await
        .expect("a tool error is a result");
    assert!(out.is_error, "{out:?}");
    let e = hub
        .call("every", "no-such-tool", Value::Null)
        .await
        .expect_err("unknown tool");
    assert!(matches!(e, McpError::UnknownTool { .. }), "{e}");
    full.shutdown().await;
    hub.shutdown().await;
}

/// The reference filesystem server from npm, given `dir` as the one folder it may touch.
fn filesystem_file(dir: &std::path::Path) -> McpFile {
    let index = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/mcp/node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(
        index.exists(),
        "{} is missing: `make setup` installs tests/mcp",
        index.display()
    );
    McpFile::parse(
        &json!({"mcpServers": {"files": {"command": "node", "args": [index, dir]}}}).to_string(),
        "test",
    )
    .expect("valid")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_filesystem_server_reads_and_writes_its_folder_only() {
    let dir = tempfile::tempdir().expect("tmp");
    std::fs::write(dir.path().join("notes.txt"), "shoal was here").expect("write");
    let hub = McpHub::open(None, Limits::default());
    hub.set_config(filesystem_file(dir.path()))
        .await
        .expect("set");
    let tools = hub.tools().await;
    let hint = |name: &str| {
        tools
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no {name}: {tools:?}"))
            .read_only
    };
    // Its own hints: reading changes nothing, writing does.
    assert!(hint("read_text_file") && hint("list_allowed_directories"));
    assert!(!hint("write_file"));
    let inside = dir.path().join("notes.txt");
    let out = hub
        .call("files", "read_text_file", json!({"path": inside}))
        .await
        .expect("read");
    assert!(!out.is_error, "{out:?}");
    assert_eq!(out.content.trim(), "shoal was here");
    let written = dir.path().join("new.txt");
    let out = hub
        .call(
            "files",
            "write_file",
            json!({"path": written, "content": "from a tool"}),
        )
        .await
        .expect("write");
    assert!(!out.is_error, "{out:?}");
    assert_eq!(
        std::fs::read_to_string(&written).expect("the file is there"),
        "from a tool"
    );
    // Outside its folder: the tool's own refusal, as a result the model reads.
    let out = hub
        .call("files", "read_text_file", json!({"path": "/etc/hostname"}))
        .await
        .expect("a refusal is a result");
    assert!(out.is_error, "{out:?}");
    assert!(out.content.contains("denied"), "{}", out.content);
    hub.shutdown().await;
}

/// `fragile.mjs`: a server whose tools crash, hang, or count the calls
/// its process answered.
async fn fragile_hub(timeout: Duration) -> McpHub {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/fragile.mjs");
    let file = McpFile::parse(
        &json!({"mcpServers": {"fragile": {"command": "node", "args": [script]}}}).to_string(),
        "test",
    )
    .expect("valid");
    let hub = McpHub::open(
        None,
        Limits {
            timeout,
            ..Limits::default()
        },
    );
    hub.set_config(file).await.expect("set");
    hub
}

async fn calls(hub: &McpHub) -> String {
    hub.call("fragile", "calls", Value::Null)
        .await
        .expect("calls")
        .content
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_call_times_out_and_a_dead_server_starts_again() {
    // The call timeout is the feature under test (`hang` never answers, so
    // it always runs out); it is long enough that the ordinary calls around
    // it never brush it on a loaded machine.
    let hub = fragile_hub(Duration::from_secs(20)).await;
    assert_eq!(calls(&hub).await, "1");
    assert_eq!(calls(&hub).await, "2", "one process answers both");

    // A call that never ends: an error that says so, and the server stopped.
    let e = hub
        .call("fragile", "hang", json!({"note": "forever"}))
        .await
        .expect_err("times out");
    assert!(matches!(e, McpError::Timeout { secs: 20, .. }), "{e}");
    assert!(e.to_string().contains("did not answer within 20 s"), "{e}");
    assert_eq!(
        calls(&hub).await,
        "1",
        "a new process answers after the timeout"
    );

    // A server that dies mid-call: an error naming it, with its last words;
    // the next call starts it again.
    let e = hub
        .call("fragile", "crash", Value::Null)
        .await
        .expect_err("dies");
    assert!(matches!(e, McpError::Failed { .. }), "{e}");
    assert!(e.to_string().contains("'fragile'"), "{e}");
    assert_eq!(
        calls(&hub).await,
        "1",
        "a new process answers after the crash"
    );
    hub.shutdown().await;
}

/// The tools the user allowed for good, by name.
async fn allowed(hub: &McpHub) -> Vec<String> {
    let mut v: Vec<String> = hub
        .tools()
        .await
        .into_iter()
        .filter(|t| t.always_allow)
        .map(|t| t.name)
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn always_allow_answers_are_kept_in_the_file_without_a_restart() {
    let dir = tempfile::tempdir().expect("tmp");
    let path = dir.path().join("mcp.json");
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../tests/mcp/fragile.mjs");
    std::fs::write(
        &path,
        json!({"mcpServers": {"fragile": {"command": "node", "args": [script]}}}).to_string(),
    )
    .expect("write");
    let hub = McpHub::open(Some(path.clone()), Limits::default());
    assert_eq!(calls(&hub).await, "1");
    assert!(allowed(&hub).await.is_empty());
    // Two answers given at once both stay.
    let (a, b) = tokio::join!(
        hub.always_allow("fragile", "calls", true),
        hub.always_allow("fragile", "crash", true)
    );
    a.and(b).expect("allow");
    assert_eq!(allowed(&hub).await, ["calls", "crash"]);
    let saved: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    assert_eq!(
        saved["mcpServers"]["fragile"]["alwaysAllow"],
        json!(["calls", "crash"])
    );
    // The server was not restarted for it: the same process counts on.
    assert_eq!(calls(&hub).await, "2");
    assert_eq!(hub.summary().running, 1);
    hub.always_allow("fragile", "crash", false)
        .await
        .expect("take back");
    assert_eq!(allowed(&hub).await, ["calls"]);
    let e = hub
        .always_allow("nope", "x", true)
        .await
        .expect_err("unknown server");
    assert!(matches!(e, McpError::UnknownServer(_)), "{e}");
    assert_eq!(hub.forget_always_allow().await.expect("forget"), 1);
    assert!(allowed(&hub).await.is_empty());
    // A hub opened on the file later reads the answers it holds.
    hub.always_allow("fragile", "calls", true)
        .await
        .expect("allow");
    let again = McpHub::open(Some(path), Limits::default());
    assert_eq!(allowed(&again).await, ["calls"]);
    assert_eq!(calls(&hub).await, "3");
    again.shutdown().await;
    hub.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streamable_http_servers_and_a_changed_configuration() {
    // The reference server over Streamable HTTP on a free port.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let mut server = tokio::process::Command::new("node")
        .arg(everything())
        .arg("streamableHttp")
        .env("PORT", port.to_string())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("node");
    let err = server.stderr.take().expect("stderr");
    let mut lines = tokio::io::AsyncBufReadExt::lines(tokio::io::BufReader::new(err));
    loop {
        let line = lines
            .next_line()
            .await
            .expect("read")
            .expect("server exited");
        if line.contains("listening on port") {
            break;
        }
    }
    let hub = McpHub::open(None, Limits::default());
    let file = |url: &str| {
        McpFile::parse(
            &json!({"mcpServers": {"web": {"url": url, "headers": {"X-Test": "1"}}}}).to_string(),
            "test",
        )
        .expect("valid")
    };
    hub.set_config(file(&format!("http://127.0.0.1:{port}/mcp")))
        .await
        .expect("set");
    let servers = hub.servers().await;
    assert_eq!(servers[0].state, "ready", "{servers:?}");
    assert_eq!(
        serde_json::to_value(&servers[0]).expect("json")["transport"],
        "http"
    );
    let out = hub
        .call("web", "echo", json!({"message": "over http"}))
        .await
        .expect("echo");
    assert_eq!(out.content, "Echo: over http");

    // `enabledTools` offers only those tools, and only they may be called.
    let url = format!("http://127.0.0.1:{port}/mcp");
    let only_echo = McpFile::parse(
        &json!({"mcpServers": {"web": {"url": url, "enabledTools": ["echo"]}}}).to_string(),
        "test",
    )
    .expect("valid");
    hub.set_config(only_echo).await.expect("set");
    let names: Vec<String> = hub.tools().await.into_iter().map(|t| t.name).collect();
    assert_eq!(names, ["echo"]);
    let e = hub
        .call("web", "get-sum", json!({"a": 1, "b": 2}))
        .await
        .expect_err("not enabled");
    assert!(matches!(e, McpError::UnknownTool { .. }), "{e}");

    // A changed entry stops the old connection; a bad one changes nothing.
    let bad = McpFile::parse(r#"{"mcpServers": {}}"#, "t").map(|mut f| {
        f.servers.insert("bad name".into(), Default::default());
        f
    });
    let e = hub.set_config(bad.expect("parsed")).await.expect_err("bad");
    assert!(e.to_string().contains("'bad name'"), "{e}");
    assert_eq!(hub.config().servers.len(), 1);
    hub.set_config(file("http://127.0.0.1:9/mcp"))
        .await
        .expect("set");
    let servers = hub.servers().await;
    assert_eq!(servers[0].state, "failed", "{servers:?}");
    assert!(servers[0].error.is_some());
    let _ = server.kill().await;
}
