//! The cluster's records and addresses, below every handler: a placed
//! [`Instance`], the shard processes this node runs ([`Shards`]), where a
//! passed-on request goes ([`Upstream`]) and the paths of the control routes
//! nodes call on each other.
use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::response::Response;
use shoal_cluster::Cluster;

/// Marks a request one node forwarded to another, so it is never forwarded again.
pub const FORWARDED_HEADER: &str = "x-shoal-forwarded";

/// The control route through which nodes read each other's ledger rows
/// (attribution of forwarded requests, `scope=cluster`); served by `usage.rs`.
pub const PEER_USAGE_PATH: &str = "/v1/cluster/usage";

/// Control routes a node calls on another to place or drop a model.
pub(crate) const LOAD_PATH: &str = "/v1/cluster/load";
pub(crate) const UNLOAD_PATH: &str = "/v1/cluster/unload";

/// Control routes a node calls on another to read or drop the instances it placed.
pub const INSTANCES_PATH: &str = "/v1/cluster/instances";
pub const INSTANCE_REMOVE_PATH: &str = "/v1/cluster/instances/remove";

/// Control routes of pipeline shards (prepare a ring address, start, stop).
pub const PREPARE_PATH: &str = "/v1/cluster/shard/prepare";
pub const START_PATH: &str = "/v1/cluster/shard/start";
pub const STOP_PATH: &str = "/v1/cluster/shard/stop";

/// A model placed on a node by `POST /v1/instances`.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Instance {
    pub id: String,
    pub model: String,
    pub sharding: String,
    pub nodes: Vec<String>,
    /// The node requests for the model go to.
    pub entry: String,
    pub created: u64,
    /// Each node's layers, `[first, end)`, in rank order (pipelines).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<(usize, usize)>,
}

/// A running `shoal shard` process of an instance.
pub struct ShardProc {
    pub(crate) child: tokio::process::Child,
    /// Rank 0: the address of its API.
    pub addr: Option<String>,
    /// Read through this pipe; closing it ends the shard.
    pub(crate) _stdin: Option<tokio::process::ChildStdin>,
}

impl ShardProc {
    pub fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }
}

pub type Shards = Arc<Mutex<HashMap<String, ShardProc>>>;

/// A request that never reached its upstream (the connection was refused),
/// so it is safe to serve elsewhere; `answer` is the error to send if not.
pub struct NotSent {
    pub error: reqwest::Error,
    pub answer: Response,
}

/// Where a request is passed on to, and what tells that it has failed.
pub struct Upstream {
    /// `host:port` of the API that answers.
    pub addr: String,
    /// Names it in error messages.
    pub what: String,
    /// Sign the request as this cluster (peers); `None` for a local shard.
    pub signer: Option<Arc<Cluster>>,
    /// Copy the peer's record of the request here once it has answered.
    pub ledger: Option<Arc<crate::ledger::Ledger>>,
    /// For a local pipeline stage: the nodes that ran the request (the
    /// stage process knows nothing of who asked; the copy says it).
    pub ran_on: Option<String>,
    /// Checked twice a second while an answer streams: `Some(reason)` ends it.
    pub watch: Box<dyn Fn() -> Option<String> + Send + Sync>,
}
