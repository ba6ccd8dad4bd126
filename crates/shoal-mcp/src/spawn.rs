//! Starting a stdio MCP server from inside a process that runs a model.
//!
//! The server runs in Shoal's own process, beside engine threads and
//! OpenBLAS's thread pool. `fork(2)` there runs OpenBLAS's fork handler,
//! which waits for its worker threads and can wait forever while an engine
//! uses them: the request that starts the server hangs. Rust's `Command`
//! spawns with `posix_spawn` (no fork handlers) unless something forces a
//! fork: a program named by a bare name while the child gets a `PATH` of
//! its own is one. So the program is looked up here, in the `PATH` the
//! child will see, and spawned by its full path; the child leads a process
//! group of its own, so stopping it (a hang, a changed entry, shutdown)
//! also stops what it started (`npx` runs the server as its own child).
use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::process::{ChildStderr, ChildStdin, ChildStdout};

use crate::config::ServerSpec;

/// A running stdio server; dropping it kills its process group.
pub(crate) struct ServerProcess {
    child: tokio::process::Child,
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        #[cfg(unix)]
        if let Some(pid) = self.child.id().and_then(|p| i32::try_from(p).ok()) {
            // SAFETY: kill(2) with a negative pid signals the process group
            // the child leads (it was spawned with `process_group(0)`); no
            // memory is shared with the callee.
            unsafe {
                libc::kill(-pid, libc::SIGKILL);
            }
        }
        let _ = self.child.start_kill();
    }
}

/// The server's pipes, for the transport and for its error output.
pub(crate) struct Pipes {
    pub stdout: ChildStdout,
    pub stdin: ChildStdin,
    pub stderr: ChildStderr,
}

/// Starts `spec`'s command with only `PATH`, `HOME` and the entry's `env`.
pub(crate) fn spawn(spec: &ServerSpec) -> Result<(ServerProcess, Pipes), String> {
    let program = spec.command.as_deref().unwrap_or_default();
    let mut env: Vec<(OsString, OsString)> = ["PATH", "HOME"]
        .into_iter()
        .filter_map(|k| std::env::var_os(k).map(|v| (k.into(), v)))
        .collect();
    for (k, v) in &spec.env {
        env.retain(|(old, _)| old.as_os_str() != OsStr::new(k));
        env.push((k.into(), v.into()));
    }
    let path = env
        .iter()
        .find(|(k, _)| k.as_os_str() == OsStr::new("PATH"))
        .map(|(_, v)| v.clone());
    let cwd = spec.cwd.clone();
    let full = find_program(program, path.as_deref(), cwd.as_deref())
        .ok_or_else(|| format!("cannot start '{program}': not found in its PATH"))?;
    let mut cmd = tokio::process::Command::new(&full);
    cmd.args(&spec.args)
        .env_clear()
        .envs(env)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    #[cfg(unix)]
    cmd.process_group(0);
    if let Some(dir) = &cwd {
        cmd.current_dir(dir);
    }
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("cannot start '{program}': {e}"))?;
    let (Some(stdout), Some(stdin), Some(stderr)) =
        (child.stdout.take(), child.stdin.take(), child.stderr.take())
    else {
        return Err(format!("cannot start '{program}': its pipes are missing"));
    };
    Ok((
        ServerProcess { child },
        Pipes {
            stdout,
            stdin,
            stderr,
        },
    ))
}

/// `program` as a path to run: as given when it names a path (relative to
/// `cwd`), else the first executable file of that name in `path`.
fn find_program(program: &str, path: Option<&OsStr>, cwd: Option<&Path>) -> Option<PathBuf> {
    if program.contains('/') {
        let p = Path::new(program);
        let p = match cwd {
            Some(dir) if p.is_relative() => dir.join(p),
            _ => p.to_path_buf(),
        };
        return is_executable(&p).then_some(p);
    }
    std::env::split_paths(path?)
        .map(|dir| dir.join(program))
        .find(|p| is_executable(p))
}

fn is_executable(p: &Path) -> bool {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
    }
    #[cfg(not(unix))]
    {
        p.is_file()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn programs_are_found_in_the_childs_path_or_taken_as_paths() {
        let dir = tempfile::tempdir().expect("tmp");
        let tool = dir.path().join("tool");
        std::fs::write(&tool, "#!/bin/sh\n").expect("write");
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").expect("write");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        let path = std::env::join_paths(["/nonexistent", dir.path().to_str().expect("utf-8")])
            .expect("join");
        assert_eq!(find_program("tool", Some(&path), None), Some(tool.clone()));
        assert_eq!(
            find_program("plain", Some(&path), None),
            None,
            "not executable"
        );
        assert_eq!(find_program("tool", None, None), None, "no PATH");
        assert_eq!(
            find_program("./tool", None, Some(dir.path())),
            Some(dir.path().join("./tool"))
        );
        assert_eq!(
            find_program(tool.to_str().expect("utf-8"), None, None),
            Some(tool)
        );
    }
}
