//! LAN discovery over mDNS / DNS-SD: each node announces `_shoal._tcp` with
//! its id and API port, and contacts the nodes it sees. Finding a node is
//! not trusting it: it still has to answer a signed heartbeat.
use std::net::SocketAddr;
use std::time::Duration;

use mdns_sd::{ServiceDaemon, ServiceEvent, ServiceInfo};

pub const SERVICE: &str = "_shoal._tcp.local.";

/// Announces node `id` at `addr` and hands each node it sees to `found`
/// (`Some(host:port)`; `None` after a quiet second), for as long as `found`
/// returns true (the cluster is alive). Failures (no multicast on this network) are logged; static
/// peers still work.
pub fn start(
    id: String,
    addr: Option<SocketAddr>,
    found: impl Fn(Option<String>) -> bool + Send + 'static,
) {
    let Some(addr) = addr else {
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
    let spawned = std::thread::Builder::new()
        .name("shoal-mdns".into())
        .spawn(move || {
            // The daemon lives as long as this thread.
            let _daemon = daemon;
            loop {
                let event = events.recv_timeout(Duration::from_secs(1));
                let Ok(ServiceEvent::ServiceResolved(seen)) = event else {
                    // A quiet second: stop once the cluster is gone.
                    if found(None) {
                        continue;
                    }
                    break;
                };
                if seen.get_property_val_str("id") == Some(id.as_str()) {
                    continue;
                }
                for ip in seen.get_addresses_v4() {
                    let peer = format!("{ip}:{}", seen.get_port());
                    tracing::debug!(%peer, "found by mDNS");
                    if !found(Some(peer)) {
                        return;
                    }
                }
            }
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "mDNS thread not started");
    }
}
