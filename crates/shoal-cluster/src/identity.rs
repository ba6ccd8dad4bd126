//! A node's stable identity: a random id kept in the platform config
//! directory (so it survives restarts) and a friendly name (the host name).
use std::path::{Path, PathBuf};

use rand::Rng;
use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeIdentity {
    pub id: String,
    pub name: String,
}

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("node identity file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

fn new_id() -> String {
    let mut rng = rand::rng();
    (0..16)
        .map(|_| format!("{:02x}", rng.random::<u8>()))
        .collect()
}

fn host_name() -> String {
    sysinfo::System::host_name().unwrap_or_else(|| "localhost".into())
}

/// The most processes on one machine (sharing a config directory) that get
/// an identity of their own that lasts; beyond that a process gets a fresh one.
const SLOTS: usize = 64;

/// Identity files this process holds locked until it exits, so no other
/// process on the machine claims the same one.
static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());

impl NodeIdentity {
    /// The identity stored in `dir/node-id`, created on first use.
    pub fn load_or_create(dir: &Path) -> Result<Self, IdentityError> {
        Self::read_or_write(&dir.join("node-id"), dir)
    }

    fn read_or_write(path: &Path, dir: &Path) -> Result<Self, IdentityError> {
        let io = |source| IdentityError::Io {
            path: path.to_path_buf(),
            source,
        };
        let id = match std::fs::read_to_string(path) {
            Ok(s) if s.trim().len() >= 8 => s.trim().to_string(),
            Ok(_) | Err(_) => {
                std::fs::create_dir_all(dir).map_err(io)?;
                let id = new_id();
                std::fs::write(path, format!("{id}\n")).map_err(io)?;
                id
            }
        };
        Ok(NodeIdentity {
            id,
            name: host_name(),
        })
    }

    /// The first identity in `dir` no other running process holds:
    /// `node-id`, else `node-id.2`, `node-id.3`, … Each is kept locked for
    /// the life of this process, so two servers on one machine (one config
    /// directory) are two nodes, and each gets the same id again when
    /// restarted in the same order.
    pub fn claim(dir: &Path) -> Result<Self, IdentityError> {
        std::fs::create_dir_all(dir).map_err(|source| IdentityError::Io {
            path: dir.to_path_buf(),
            source,
        })?;
        for slot in 1..=SLOTS {
            let name = match slot {
                1 => "node-id".to_string(),
                n => format!("node-id.{n}"),
            };
            let lock_path = dir.join(format!("{name}.lock"));
            let lock = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&lock_path)
                .map_err(|source| IdentityError::Io {
                    path: lock_path.clone(),
                    source,
                })?;
            match lock.try_lock() {
                Ok(()) => {
                    let id = Self::read_or_write(&dir.join(&name), dir)?;
                    HELD.lock().unwrap_or_else(|p| p.into_inner()).push(lock);
                    return Ok(id);
                }
                Err(std::fs::TryLockError::WouldBlock) => continue,
                Err(std::fs::TryLockError::Error(source)) => {
                    return Err(IdentityError::Io {
                        path: lock_path,
                        source,
                    })
                }
            }
        }
        tracing::warn!(
            slots = SLOTS,
            "every node identity here is in use; using a fresh one"
        );
        Ok(Self::ephemeral())
    }

    /// This process's identity in the platform config directory (see
    /// [`NodeIdentity::claim`]), or a fresh one if that directory cannot be used.
    pub fn for_this_machine() -> Self {
        let dir =
            directories::ProjectDirs::from("", "", "shoal").map(|d| d.config_dir().to_path_buf());
        match dir.map(|d| Self::claim(&d)) {
            Some(Ok(id)) => id,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "node identity not persisted");
                Self::ephemeral()
            }
            None => Self::ephemeral(),
        }
    }

    pub fn ephemeral() -> Self {
        NodeIdentity {
            id: new_id(),
            name: host_name(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_survives_a_restart() {
        let dir = std::env::temp_dir().join(format!("shoal-node-{}", new_id()));
        let a = NodeIdentity::load_or_create(&dir).expect("create");
        let b = NodeIdentity::load_or_create(&dir).expect("reload");
        assert_eq!(a, b);
        assert_eq!(a.id.len(), 32);
        std::fs::remove_dir_all(&dir).ok();
    }

    /// Claims within one process stand for claims by several processes: an
    /// identity file's lock is held by the open file, so a second claim on
    /// the same directory cannot take the first one's slot.
    #[test]
    fn two_claims_on_one_directory_get_two_identities() {
        let dir = std::env::temp_dir().join(format!("shoal-node-{}", new_id()));
        let first = NodeIdentity::claim(&dir).expect("first");
        let second = NodeIdentity::claim(&dir).expect("second");
        assert_ne!(first.id, second.id);
        assert_eq!(
            std::fs::read_to_string(dir.join("node-id"))
                .expect("slot 1")
                .trim(),
            first.id
        );
        assert_eq!(
            std::fs::read_to_string(dir.join("node-id.2"))
                .expect("slot 2")
                .trim(),
            second.id
        );
        std::fs::remove_dir_all(&dir).ok();
    }
}
