//! LAN discovery over mDNS / DNS-SD: each node announces `_shoal._tcp` with
//! its id and API port, and contacts the nodes it sees. Finding a node is
//! not trusting it: it still has to answer a signed heartbeat.
use std::sync::{Arc, Weak};
use std::time::Duration;

use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};

use crate::membership::Cluster;

pub const SERVICE: &str = "_shoal._tcp.local.";

/// Announces this node and feeds discovered ones to the cluster. Failures
/// (no multicast on this network) are logged; static peers still work.
pub fn start(cluster: &Arc<Cluster>) {
    let Some(addr) = cluster.node().address() else {
        tracing::warn!("mDNS off: the API address is not known yet");
        return;
    };
    let daemon = match ServiceDaemon::new() {
        Ok(d) => d,
        Err(e) => {
            tracing::warn!(error = %e, "mDNS unavailable; use --peer");
            return;
        }
    };
    let id = cluster.node().identity().id.clone();
    let host = format!("shoal-{id}.local.");
    let info = ServiceInfo::new(
        SERVICE,
        &id,
        &host,
        "",
        addr.port(),
        &[("id", id.as_str())][..],
    )
    .map(ServiceInfo::enable_addr_auto);
    match info.map(|i| daemon.register(i)) {
        Ok(Ok(())) => {}
        Ok(Err(e)) | Err(e) => tracing::warn!(error = %e, "mDNS announce failed"),
    }
    let events = match daemon.browse(SERVICE) {
        Ok(r) => r,
        Err(e) => {
            tracing::warn!(error = %e, "mDNS browse failed");
            return;
        }
    };
    let weak: Weak<Cluster> = Arc::downgrade(cluster);
    let spawned = std::thread::Builder::new()
        .name("shoal-mdns".into())
        .spawn(move || {
            // The daemon lives as long as this thread.
            let _daemon = daemon;
            loop {
                let event = events.recv_timeout(Duration::from_secs(1));
                let Some(cluster) = weak.upgrade() else { break };
                let Ok(ServiceEvent::ServiceResolved(found)) = event else {
                    continue;
                };
                if found.get_property_val_str("id") == Some(id.as_str()) {
                    continue;
                }
                for ip in found.get_addresses_v4() {
                    let peer = format!("{ip}:{}", found.get_port());
                    tracing::debug!(%peer, "found by mDNS");
                    cluster.consider(peer);
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "mDNS thread not started");
    }
}
