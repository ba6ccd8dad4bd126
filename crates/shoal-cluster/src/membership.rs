//! Who is in the cluster. Every second a node sends a signed heartbeat to
//! each address it knows (static `--peer`s, nodes found by mDNS, peers its
//! peers named, nodes that contacted it); the answer is the peer's status
//! and its own peer list. A peer silent for `unreachable_after` is marked
//! unreachable, and removed after `remove_after`. Changes go out as
//! [`ClusterEvent`]s for `/v1/cluster/events`.
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::auth::{Secret, Signed};
use crate::status::{LocalNode, NodeStatus};

/// The control route heartbeats call.
pub const STATUS_PATH: &str = "/v1/cluster/status";

#[derive(Clone, Debug)]
pub struct ClusterOptions {
    pub secret: Secret,
    /// API addresses (`host:port`) to contact from the start.
    pub peers: Vec<String>,
    /// Announce and find nodes with mDNS / DNS-SD on the LAN.
    pub mdns: bool,
    pub heartbeat: Duration,
    pub unreachable_after: Duration,
    pub remove_after: Duration,
}

impl ClusterOptions {
    pub fn new(secret: &str, peers: Vec<String>) -> ClusterOptions {
        ClusterOptions {
            secret: Secret::new(secret),
            peers,
            mdns: true,
            heartbeat: Duration::from_secs(1),
            unreachable_after: Duration::from_secs(3),
            remove_after: Duration::from_secs(20),
        }
    }
}

/// What a heartbeat answer carries.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatusReply {
    pub node: NodeStatus,
    pub peers: Vec<PeerAddress>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeerAddress {
    pub id: String,
    pub address: String,
}

/// A change in the cluster, as `/v1/cluster/events` streams it.
#[derive(Clone, Debug, Serialize)]
pub struct ClusterEvent {
    /// `joined`, `updated`, `unreachable` or `removed`.
    pub kind: &'static str,
    pub node: NodeStatus,
}

struct Peer {
    address: String,
    status: NodeStatus,
    last_seen: Instant,
    unreachable: bool,
}

/// This node's view of the cluster.
pub struct Cluster {
    opts: ClusterOptions,
    node: Arc<LocalNode>,
    peers: Mutex<BTreeMap<String, Peer>>,
    /// Addresses to try besides known peers' (static, discovered, gossiped).
    candidates: Mutex<BTreeSet<String>>,
    events: tokio::sync::broadcast::Sender<ClusterEvent>,
    client: reqwest::Client,
    /// Addresses already warned about for speaking with this node's id.
    twins: Mutex<BTreeSet<String>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Cluster {
    /// Joins: starts heartbeats (and mDNS) on the current tokio runtime.
    /// The node's API address must be set first.
    pub fn start(node: Arc<LocalNode>, opts: ClusterOptions) -> Arc<Cluster> {
        let (events, _) = tokio::sync::broadcast::channel(256);
        let cluster = Arc::new(Cluster {
            candidates: Mutex::new(opts.peers.iter().cloned().collect()),
            opts,
            node,
            peers: Mutex::new(BTreeMap::new()),
            twins: Mutex::new(BTreeSet::new()),
            events,
            client: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .unwrap_or_default(),
        });
        if cluster.opts.mdns {
            let weak = Arc::downgrade(&cluster);
            crate::discovery::start(
                cluster.node.identity().id.clone(),
                cluster.node.address(),
                move |peer| {
                    let Some(cluster) = weak.upgrade() else {
                        return false;
                    };
                    if let Some(peer) = peer {
                        cluster.consider(peer);
                    }
                    true
                },
            );
        }
        let weak = Arc::downgrade(&cluster);
        tokio::spawn(heartbeats(weak));
        cluster
    }

    pub fn secret(&self) -> &Secret {
        &self.opts.secret
    }

    pub fn node(&self) -> &Arc<LocalNode> {
        &self.node
    }

    fn own_address(&self) -> String {
        self.node
            .address()
            .map(|a| a.to_string())
            .unwrap_or_default()
    }

    /// Adds an address to contact (mDNS, gossip).
    pub fn consider(&self, address: String) {
        if address != self.own_address() {
            lock(&self.candidates).insert(address);
        }
    }

    /// A node proved it has the secret: contact it from now on (this is how
    /// a node joins: its first heartbeat makes it known here).
    pub fn heard_from(&self, who: &Signed) {
        if who.node != self.node.identity().id {
            self.consider(who.addr.clone());
        } else if who.addr != self.own_address() {
            self.twin(&who.addr);
        }
    }

    /// Another process answers to this node's id: say so once per address,
    /// since the two can never see each other as peers.
    fn twin(&self, address: &str) {
        if lock(&self.twins).insert(address.to_string()) {
            tracing::warn!(
                id = %self.node.identity().id,
                other = %address,
                own = %self.own_address(),
                "another node has this node's id, so neither lists the other; \
                 give each its own config directory (the id lives in its node-id file)"
            );
        }
    }

    /// Peers as `/v1/cluster/nodes` lists them.
    pub fn peers(&self) -> Vec<NodeStatus> {
        lock(&self.peers)
            .values()
            .map(|p| {
                let mut s = p.status.clone();
                s.is_self = false;
                s.status = if p.unreachable {
                    "unreachable"
                } else {
                    "online"
                }
                .into();
                s
            })
            .collect()
    }

    /// Known peers' ids and addresses (for heartbeat answers).
    pub fn peer_addresses(&self) -> Vec<PeerAddress> {
        lock(&self.peers)
            .iter()
            .filter(|(_, p)| !p.unreachable)
            .map(|(id, p)| PeerAddress {
                id: id.clone(),
                address: p.address.clone(),
            })
            .collect()
    }

    /// The API address of a reachable peer.
    pub fn address_of(&self, id: &str) -> Option<String> {
        lock(&self.peers)
            .get(id)
            .filter(|p| !p.unreachable)
            .map(|p| p.address.clone())
    }

    pub fn subscribe(&self) -> tokio::sync::broadcast::Receiver<ClusterEvent> {
        self.events.subscribe()
    }

    /// A signed POST of `body` as JSON, given up after `timeout`: every
    /// control call between nodes is one.
    pub fn post_json(
        &self,
        address: &str,
        path: &str,
        body: &impl Serialize,
        timeout: Duration,
    ) -> reqwest::RequestBuilder {
        let bytes = serde_json::to_vec(body).unwrap_or_default();
        self.signed(reqwest::Method::POST, address, path, bytes)
            .header("content-type", "application/json")
            .timeout(timeout)
    }

    /// A signed request to a peer's control route.
    pub fn signed(
        &self,
        method: reqwest::Method,
        address: &str,
        path: &str,
        body: Vec<u8>,
    ) -> reqwest::RequestBuilder {
        let id = &self.node.identity().id;
        let mut req = self
            .client
            .request(method.clone(), format!("http://{address}{path}"));
        for (k, v) in self
            .opts
            .secret
            .sign(method.as_str(), path, id, &self.own_address(), &body)
        {
            req = req.header(k, v);
        }
        req.body(body)
    }

    fn emit(&self, kind: &'static str, mut node: NodeStatus) {
        node.is_self = false;
        node.status = if kind == "unreachable" || kind == "removed" {
            "unreachable".into()
        } else {
            "online".into()
        };
        let _ = self.events.send(ClusterEvent { kind, node });
    }

    /// One heartbeat round.
    async fn beat(&self) {
        let own = self.own_address();
        let mut targets: BTreeSet<String> = lock(&self.candidates).clone();
        targets.extend(lock(&self.peers).values().map(|p| p.address.clone()));
        targets.remove(&own);
        let calls = targets.into_iter().map(|addr| async move {
            let reply = self
                .signed(reqwest::Method::GET, &addr, STATUS_PATH, Vec::new())
                .send()
                .await;
            let reply = match reply {
                Ok(r) if r.status().is_success() => r.json::<StatusReply>().await.ok(),
                Ok(r) => {
                    tracing::debug!(peer = %addr, status = %r.status(), "heartbeat refused");
                    None
                }
                Err(_) => None,
            };
            (addr, reply)
        });
        let replies = futures::future::join_all(calls).await;
        let self_id = self.node.identity().id.clone();
        for (addr, reply) in replies {
            let Some(reply) = reply else { continue };
            if reply.node.id == self_id {
                // A --peer that points back at this node, or another process
                // with the same id.
                if reply
                    .node
                    .address
                    .as_deref()
                    .is_some_and(|a| a != self.own_address())
                {
                    self.twin(&addr);
                }
                lock(&self.candidates).remove(&addr);
                continue;
            }
            for p in &reply.peers {
                if p.id != self_id && !lock(&self.peers).contains_key(&p.id) {
                    self.consider(p.address.clone());
                }
            }
            let id = reply.node.id.clone();
            let mut peers = lock(&self.peers);
            let kind = match peers.get(&id) {
                None => "joined",
                Some(p) if p.unreachable => "joined",
                Some(_) => "updated",
            };
            peers.insert(
                id,
                Peer {
                    address: addr,
                    status: reply.node.clone(),
                    last_seen: Instant::now(),
                    unreachable: false,
                },
            );
            drop(peers);
            if kind == "joined" {
                tracing::info!(peer = %reply.node.id, name = %reply.node.name, "node joined");
            }
            self.emit(kind, reply.node);
        }
        self.expire();
    }

    /// Marks silent peers unreachable, then removes them.
    fn expire(&self) {
        let mut gone = Vec::new();
        let mut lost = Vec::new();
        {
            let mut peers = lock(&self.peers);
            peers.retain(|_, p| {
                let silent = p.last_seen.elapsed();
                if silent >= self.opts.remove_after {
                    gone.push((p.address.clone(), p.status.clone()));
                    return false;
                }
                if silent >= self.opts.unreachable_after && !p.unreachable {
                    p.unreachable = true;
                    lost.push(p.status.clone());
                }
                true
            });
        }
        for s in lost {
            tracing::warn!(peer = %s.id, name = %s.name, "node unreachable");
            self.emit("unreachable", s);
        }
        for (addr, s) in gone {
            // Only static peers are retried after removal.
            if !self.opts.peers.contains(&addr) {
                lock(&self.candidates).remove(&addr);
            }
            tracing::warn!(peer = %s.id, "node removed");
            self.emit("removed", s);
        }
    }
}

async fn heartbeats(cluster: Weak<Cluster>) {
    let period = match cluster.upgrade() {
        Some(c) => c.opts.heartbeat,
        None => return,
    };
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let Some(c) = cluster.upgrade() else { break };
        c.beat().await;
    }
}
