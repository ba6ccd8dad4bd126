//! Live status of the local node, sampled in the background so a status
//! request never waits for a CPU measurement.
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use sysinfo::{CpuRefreshKind, MemoryRefreshKind, RefreshKind, System};

use crate::identity::NodeIdentity;

/// A model a node holds.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelLoad {
    pub id: String,
    /// Weights plus the KV state the model holds.
    pub memory_bytes: u64,
    /// The engine it runs on (`mlx` or `llama`); empty from nodes that
    /// predate the field.
    #[serde(default)]
    pub backend: String,
}

/// Requests a node is working on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Requests {
    pub in_flight: u64,
    pub queued: u64,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cpu {
    pub model: String,
    pub cores: usize,
    pub usage_percent: f32,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Memory {
    pub total_bytes: u64,
    pub used_bytes: u64,
}

/// One node as `GET /v1/cluster/nodes` reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub id: String,
    pub name: String,
    /// The node's API address, once it listens.
    pub address: Option<String>,
    #[serde(rename = "self")]
    pub is_self: bool,
    /// `online` or `unreachable`.
    pub status: String,
    pub os: String,
    pub cpu: Cpu,
    pub memory: Memory,
    /// GPU or other accelerator, where known.
    pub accelerator: Option<String>,
    /// MLX backend in use (`cpu` or `metal`).
    pub backend: String,
    pub models: Vec<ModelLoad>,
    pub requests: Requests,
    pub last_seen_ms: u64,
}

struct Sample {
    cpu_percent: f32,
    total: u64,
    used: u64,
}

/// The local node: identity, address and a background sampler.
pub struct LocalNode {
    identity: NodeIdentity,
    address: Mutex<Option<SocketAddr>>,
    backend: String,
    os: String,
    cpu_model: String,
    cores: usize,
    sample: Arc<Mutex<Sample>>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// RAM now: (total, available to a new allocation) in bytes, read fresh so
/// a load decision sees memory freed a moment ago.
pub fn memory_now() -> (u64, u64) {
    let mut sys = System::new_with_specifics(
        RefreshKind::nothing().with_memory(MemoryRefreshKind::nothing().with_ram()),
    );
    sys.refresh_memory();
    (sys.total_memory(), sys.available_memory())
}

fn refresh_kind() -> RefreshKind {
    RefreshKind::nothing()
        .with_cpu(CpuRefreshKind::nothing().with_cpu_usage())
        .with_memory(MemoryRefreshKind::nothing().with_ram())
}

impl LocalNode {
    /// Starts sampling CPU and memory once a second on a background thread
    /// (it stops when the node is dropped).
    pub fn start(identity: NodeIdentity, backend: &str) -> Arc<Self> {
        let mut sys = System::new_with_specifics(refresh_kind());
        sys.refresh_specifics(refresh_kind());
        let cpu_model = sys
            .cpus()
            .first()
            .map(|c| c.brand().trim().to_string())
            .filter(|b| !b.is_empty())
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let os = format!(
            "{} {}",
            System::name().unwrap_or_else(|| std::env::consts::OS.to_string()),
            System::os_version().unwrap_or_default()
        )
        .trim()
        .to_string();
        let sample = Arc::new(Mutex::new(Sample {
            cpu_percent: sys.global_cpu_usage(),
            total: sys.total_memory(),
            used: sys.used_memory(),
        }));
        let node = Arc::new(LocalNode {
            identity,
            address: Mutex::new(None),
            backend: backend.to_string(),
            os,
            cpu_model,
            cores: sys.cpus().len(),
            sample: sample.clone(),
        });
        let weak = Arc::downgrade(&node);
        let spawned = std::thread::Builder::new()
            .name("shoal-node-status".into())
            .spawn(move || {
                while weak.strong_count() > 0 {
                    std::thread::sleep(Duration::from_secs(1));
                    sys.refresh_specifics(refresh_kind());
                    let mut s = sample.lock().unwrap_or_else(|p| p.into_inner());
                    s.cpu_percent = sys.global_cpu_usage();
                    s.total = sys.total_memory();
                    s.used = sys.used_memory();
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "node status sampler not started; figures stay at their first reading");
        }
        node
    }

    /// Records the address the API listens on.
    pub fn set_address(&self, addr: SocketAddr) {
        *self.address.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
    }

    pub fn identity(&self) -> &NodeIdentity {
        &self.identity
    }

    /// The API address, once listening.
    pub fn address(&self) -> Option<SocketAddr> {
        *self.address.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// This node's status now.
    pub fn status(&self, models: Vec<ModelLoad>, requests: Requests) -> NodeStatus {
        let s = self.sample.lock().unwrap_or_else(|p| p.into_inner());
        let address = self
            .address
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .map(|a| a.to_string());
        NodeStatus {
            id: self.identity.id.clone(),
            name: self.identity.name.clone(),
            address,
            is_self: true,
            status: "online".into(),
            os: self.os.clone(),
            cpu: Cpu {
                model: self.cpu_model.clone(),
                cores: self.cores,
                usage_percent: s.cpu_percent,
            },
            memory: Memory {
                total_bytes: s.total,
                used_bytes: s.used,
            },
            accelerator: accelerator(&self.backend),
            backend: self.backend.clone(),
            models,
            requests,
            last_seen_ms: now_ms(),
        }
    }
}

/// What computes, as far as this process can tell.
fn accelerator(backend: &str) -> Option<String> {
    (backend == "metal" || backend == "gpu").then(|| "Apple GPU (Metal)".to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_has_live_figures_and_serialises_in_api_shape() {
        let node = LocalNode::start(NodeIdentity::ephemeral(), "cpu");
        node.set_address("127.0.0.1:8421".parse().expect("addr"));
        let s = node.status(
            vec![ModelLoad {
                id: "m".into(),
                memory_bytes: 42,
                backend: "llama".into(),
            }],
            Requests {
                in_flight: 1,
                queued: 2,
            },
        );
        assert!(s.memory.total_bytes > 0 && s.memory.used_bytes > 0);
        assert!(s.memory.used_bytes <= s.memory.total_bytes);
        assert!(s.cpu.cores > 0);
        let v = serde_json::to_value(&s).expect("json");
        assert_eq!(v["self"], true);
        assert_eq!(v["address"], "127.0.0.1:8421");
        assert_eq!(v["requests"]["queued"], 2);
        assert_eq!(v["models"][0]["memory_bytes"], 42);
        assert_eq!(v["models"][0]["backend"], "llama");
        assert_eq!(v["backend"], "cpu");
        assert!(v["last_seen_ms"].as_u64().is_some_and(|t| t > 0));
    }
}
