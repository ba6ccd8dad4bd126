//! Cluster membership and node status. Today a cluster of one: this node's
//! identity and live figures (CPU, memory, models, requests), in the shape
//! `GET /v1/cluster/nodes` serves and the UI shows. Discovery, heartbeats
//! and peers join here later without changing that shape.
pub mod identity;
pub mod status;

pub use identity::NodeIdentity;
pub use status::{memory_now, LocalNode, ModelLoad, NodeStatus, Requests};
