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

impl NodeIdentity {
    /// The identity stored in `dir/node-id`, created on first use.
    pub fn load_or_create(dir: &Path) -> Result<Self, IdentityError> {
        let path = dir.join("node-id");
        let io = |source| IdentityError::Io {
            path: path.clone(),
            source,
        };
        let id = match std::fs::read_to_string(&path) {
            Ok(s) if s.trim().len() >= 8 => s.trim().to_string(),
            Ok(_) | Err(_) => {
                std::fs::create_dir_all(dir).map_err(io)?;
                let id = new_id();
                std::fs::write(&path, format!("{id}\n")).map_err(io)?;
                id
            }
        };
        Ok(NodeIdentity {
            id,
            name: host_name(),
        })
    }

    /// The persisted identity in the platform config directory, or a fresh
    /// one for this process if that directory cannot be used.
    pub fn for_this_machine() -> Self {
        let dir =
            directories::ProjectDirs::from("", "", "shoal").map(|d| d.config_dir().to_path_buf());
        match dir.map(|d| Self::load_or_create(&d)) {
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
}
