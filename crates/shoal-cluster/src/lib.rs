//! Cluster membership and node status: this node's identity and live
//! figures (`status`), signed control messages (`auth`), heartbeats that
//! keep the peer list (`membership`) and LAN discovery (`discovery`).
pub mod auth;
pub mod discovery;
pub mod identity;
pub mod membership;
pub mod status;

pub use auth::{AuthError, Secret, Signed};
pub use identity::NodeIdentity;
pub use membership::{
    Cluster, ClusterEvent, ClusterOptions, PeerAddress, StatusReply, STATUS_PATH,
};
pub use status::{memory_now, LocalNode, ModelLoad, NodeStatus, Requests};
