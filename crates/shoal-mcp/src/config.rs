//! `mcp.json`: the MCP servers a chat may use, in the layout Cursor, Claude
//! Desktop and VS Code share, so a file copied from one of them works here.
//!
//! ```json
//! {"mcpServers": {
//!   "everything": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-everything"],
//!                  "env": {"DEBUG": "1"}},
//!   "remote": {"url": "http://127.0.0.1:3001/mcp", "headers": {"Authorization": "Bearer …"}},
//!   "off": {"command": "x", "disabled": true}
//! }}
//! ```
//!
//! `alwaysAllow` (Cline's key) lists the server's tools the user allowed for
//! good: the chat runs them without asking. Keys other tools add
//! (`timeout`, …) are kept through a rewrite but not acted on; a server
//! needs exactly one of `command` or `url`, and a name that can prefix a
//! tool name the model sees.
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A whole `mcp.json`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct McpFile {
    #[serde(rename = "mcpServers", default)]
    pub servers: BTreeMap<String, ServerSpec>,
    /// Whatever else the file holds, written back unchanged.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// One server: a command to start (stdio) or a URL to reach (Streamable HTTP).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// The only variables the command sees besides `PATH` and `HOME`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub headers: BTreeMap<String, String>,
    /// Listed but not started, and its tools not offered.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disabled: bool,
    /// Only these of its tools are offered and may be called (unset: all).
    #[serde(
        rename = "enabledTools",
        default,
        skip_serializing_if = "Option::is_none"
    )]
    pub enabled_tools: Option<Vec<String>>,
    /// Tools the user allowed for good ("Always allow"): kept here, beside
    /// the server, so every window and client of this server sees the
    /// answer, not only the browser that gave it.
    #[serde(rename = "alwaysAllow", default, skip_serializing_if = "Vec::is_empty")]
    pub always_allow: Vec<String>,
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// How a server is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    Stdio,
    Http,
}

impl ServerSpec {
    /// Whether `other` runs the same server: everything but the user's
    /// answers (`alwaysAllow`) is the same, so a change of answers never
    /// restarts it.
    pub fn same_server(&self, other: &ServerSpec) -> bool {
        let answers = |s: &ServerSpec| ServerSpec {
            always_allow: Vec::new(),
            ..s.clone()
        };
        answers(self) == answers(other)
    }

    /// Stdio or HTTP; [`McpFile::check`] has made sure it is one of them.
    pub fn transport(&self) -> Transport {
        if self.url.is_some() {
            Transport::Http
        } else {
            Transport::Stdio
        }
    }
}

/// Why an `mcp.json` cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a valid mcp.json: {source}")]
    Parse {
        path: String,
        source: serde_json::Error,
    },
    #[error("MCP server '{name}': {why}")]
    Server { name: String, why: String },
}

/// Longest server name: it prefixes each of its tools' names, and OpenAI's
/// function names stop at 64 characters.
pub const MAX_NAME: usize = 24;

impl McpFile {
    /// Parses `text` (named `origin` in errors) and checks it.
    pub fn parse(text: &str, origin: &str) -> Result<Self, ConfigError> {
        let file: McpFile = serde_json::from_str(text).map_err(|source| ConfigError::Parse {
            path: origin.to_string(),
            source,
        })?;
        file.check()?;
        Ok(file)
    }

    /// Reads `path`; a missing file is an empty list of servers.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        match std::fs::read_to_string(path) {
            Ok(text) => Self::parse(&text, &path.display().to_string()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Self::default()),
            Err(source) => Err(ConfigError::Read {
                path: path.to_path_buf(),
                source,
            }),
        }
    }

    /// Writes the file whole or not at all (a temporary file, then a
    /// rename), readable by its owner only: it may hold tokens in `env`
    /// and `headers`.
    pub fn save(&self, path: &Path) -> Result<(), ConfigError> {
        let err = |source| ConfigError::Write {
            path: path.to_path_buf(),
            source,
        };
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(err)?;
        }
        let text = serde_json::to_string_pretty(self).map_err(|e| err(std::io::Error::other(e)))?;
        let tmp = path.with_extension(format!("json.tmp{}", std::process::id()));
        {
            let mut opts = std::fs::OpenOptions::new();
            opts.write(true).create(true).truncate(true);
            #[cfg(unix)]
            std::os::unix::fs::OpenOptionsExt::mode(&mut opts, 0o600);
            let mut f = opts.open(&tmp).map_err(err)?;
            std::io::Write::write_all(&mut f, text.as_bytes()).map_err(err)?;
            f.sync_all().map_err(err)?;
        }
        std::fs::rename(&tmp, path).map_err(|e| {
            let _ = std::fs::remove_file(&tmp);
            err(e)
        })
    }

    /// Each server names exactly one way to reach it, by a name its tools
    /// can be called by.
    pub fn check(&self) -> Result<(), ConfigError> {
        for (name, spec) in &self.servers {
            let bad = |why: &str| ConfigError::Server {
                name: name.clone(),
                why: why.to_string(),
            };
            if name.is_empty()
                || name.len() > MAX_NAME
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            {
                return Err(bad(&format!(
                    "a name is 1 to {MAX_NAME} letters, digits, '-' or '_'"
                )));
            }
            if name.contains("__") {
                return Err(bad(
                    "a name may not hold '__', which separates it from a tool's name",
                ));
            }
            match (&spec.command, &spec.url) {
                (Some(_), Some(_)) => return Err(bad("give either 'command' or 'url', not both")),
                (None, None) => {
                    return Err(bad("give 'command' (stdio) or 'url' (Streamable HTTP)"))
                }
                (Some(c), None) if c.trim().is_empty() => return Err(bad("'command' is empty")),
                (None, Some(u)) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                    return Err(bad("'url' must start with http:// or https://"))
                }
                _ => {}
            }
            if spec.url.is_some() && (!spec.args.is_empty() || !spec.env.is_empty()) {
                return Err(bad("'args' and 'env' belong to a command, not a URL"));
            }
            if spec.command.is_some() && !spec.headers.is_empty() {
                return Err(bad("'headers' belong to a URL, not a command"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursor_files_parse_and_keep_their_other_keys() {
        let text = r#"{"mcpServers": {
            "everything": {"command": "npx", "args": ["-y", "pkg"], "env": {"A": "1"}, "alwaysAllow": ["echo"]},
            "web": {"type": "http", "url": "http://127.0.0.1:1/mcp", "headers": {"X": "y"}},
            "off": {"command": "x", "disabled": true, "enabledTools": ["a"]}
        }, "inputs": []}"#;
        let f = McpFile::parse(text, "mcp.json").expect("valid");
        assert_eq!(f.servers.len(), 3);
        assert_eq!(f.servers["everything"].transport(), Transport::Stdio);
        assert_eq!(f.servers["web"].transport(), Transport::Http);
        assert!(f.servers["off"].disabled);
        assert_eq!(f.servers["off"].enabled_tools, Some(vec!["a".to_string()]));
        let back: serde_json::Value = serde_json::to_value(&f).expect("json");
        assert_eq!(back["mcpServers"]["everything"]["alwaysAllow"][0], "echo");
        assert_eq!(back["mcpServers"]["web"]["type"], "http");
        assert_eq!(back["inputs"], serde_json::json!([]));
    }

    #[test]
    fn bad_servers_say_which_and_why() {
        for (body, says) in [
            (r#"{"a": {}}"#, "give 'command'"),
            (r#"{"a": {"command": "x", "url": "http://h"}}"#, "not both"),
            (r#"{"a": {"url": "ftp://h"}}"#, "http://"),
            (r#"{"a b": {"command": "x"}}"#, "letters"),
            (r#"{"a__b": {"command": "x"}}"#, "'__'"),
            (
                r#"{"a": {"url": "http://h", "args": ["x"]}}"#,
                "belong to a command",
            ),
            (r#"{"a": {"command": " "}}"#, "empty"),
        ] {
            let text = format!(r#"{{"mcpServers": {body}}}"#);
            let e = McpFile::parse(&text, "mcp.json")
                .expect_err(body)
                .to_string();
            assert!(e.contains(says), "{body}: {e}");
        }
        let e = McpFile::parse("{", "mcp.json")
            .expect_err("torn")
            .to_string();
        assert!(e.starts_with("mcp.json: not a valid mcp.json"), "{e}");
    }

    #[test]
    fn saving_is_whole_and_private_and_a_missing_file_is_empty() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("sub").join("mcp.json");
        assert_eq!(McpFile::load(&path).expect("missing"), McpFile::default());
        let f = McpFile::parse(r#"{"mcpServers": {"a": {"command": "x"}}}"#, "t").expect("ok");
        f.save(&path).expect("save");
        assert_eq!(McpFile::load(&path).expect("load"), f);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
            assert_eq!(mode & 0o777, 0o600);
        }
        let left: Vec<_> = std::fs::read_dir(path.parent().expect("dir"))
            .expect("list")
            .collect();
        assert_eq!(left.len(), 1, "no temporary file is left");
    }
}
