//! A cluster of hosts on a network of their own: each node runs in a network
//! namespace made here (veth pairs on one bridge, `ip netns`), so nodes find
//! each other by mDNS over a real multicast link and the pipeline's MLX ring
//! crosses interfaces, not loopback. Needs root and iproute2 (`make test`
//! installs it).
#![cfg(target_os = "linux")]

mod common;

use std::process::Command;

use common::*;
use serde_json::{json, Value};

const KEY: &str = "sk-netns-test";

fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .expect("run `ip` (iproute2)");
    assert!(
        out.status.success(),
        "ip {}: {} (this test needs root to make network namespaces)",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Namespaces and links made by one test; removed when it ends.
struct Net {
    prefix: String,
    subnet: String,
    namespaces: Vec<String>,
}

impl Net {
    /// A bridge in namespace `<prefix>sw`, with this (root) namespace on it
    /// at `.254` so the test can reach every host.
    fn new() -> Net {
        let id = std::process::id() % 10_000;
        let prefix = format!("shl{id}");
        let subnet = format!("10.231.{}", id % 250);
        let mut net = Net {
            prefix: prefix.clone(),
            subnet,
            namespaces: vec![],
        };
        let sw = format!("{prefix}sw");
        ip(&["netns", "add", &sw]);
        net.namespaces.push(sw.clone());
        ip(&["-n", &sw, "link", "add", "br0", "type", "bridge"]);
        ip(&["-n", &sw, "link", "set", "br0", "up"]);
        let (h0, h1) = (format!("{prefix}h0"), format!("{prefix}h1"));
        ip(&["link", "add", &h0, "type", "veth", "peer", "name", &h1]);
        ip(&["link", "set", &h1, "netns", &sw]);
        ip(&["-n", &sw, "link", "set", &h1, "master", "br0", "up"]);
        let me = format!("{}.254/24", net.subnet);
        ip(&["addr", "add", &me, "dev", &h0]);
        ip(&["link", "set", &h0, "up"]);
        net
    }

    /// A host `n` (1..250) on the bridge; returns its namespace and address.
    fn host(&mut self, n: u8) -> (String, String) {
        let p = &self.prefix;
        let ns = format!("{p}n{n}");
        let sw = format!("{p}sw");
        let (a, b) = (format!("{p}n{n}a"), format!("{p}n{n}b"));
        ip(&["netns", "add", &ns]);
        self.namespaces.push(ns.clone());
        ip(&["link", "add", &a, "type", "veth", "peer", "name", &b]);
        ip(&["link", "set", &a, "netns", &ns]);
        ip(&["link", "set", &b, "netns", &sw]);
        ip(&["-n", &sw, "link", "set", &b, "master", "br0", "up"]);
        let addr = format!("{}.{n}", self.subnet);
        ip(&["-n", &ns, "addr", "add", &format!("{addr}/24"), "dev", &a]);
        ip(&["-n", &ns, "link", "set", &a, "up"]);
        ip(&["-n", &ns, "link", "set", "lo", "up"]);
        (ns, addr)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["link", "del", &format!("{}h0", self.prefix)])
            .output();
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "del", ns]).output();
        }
    }
}

/// `shoal serve` inside namespace `ns` on `addr`, with mDNS on and no peers.
fn node(ns: &str, addr: &str, secret: &str) -> (Server, String) {
    let dir = temp_dir(&format!("netns-{ns}"));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(env!("CARGO_BIN_EXE_shoal"));
    isolate(&mut cmd, &dir);
    cmd.args(["serve", "--host", addr, "--port", "8421", "--api-key", KEY])
        .args(["--prefix-cache-mb", "0", "--cluster-secret", secret])
        // The model is split by layers below, which runs on MLX's ring.
        .args(["--backend", "mlx"])
        .arg("--model")
        .arg(gguf());
    spawn_server(cmd, &dir)
}

fn auth() -> [(&'static str, String); 1] {
    [("Authorization", format!("Bearer {KEY}"))]
}

fn nodes_of(addr: &str) -> Vec<Value> {
    let (status, v) = get_with(addr, "/v1/cluster/nodes", &auth());
    assert_eq!(status, 200, "{v}");
    v["nodes"].as_array().cloned().unwrap_or_default()
}

fn self_id(addr: &str) -> String {
    nodes_of(addr)
        .iter()
        .find(|n| n["self"] == true)
        .and_then(|n| n["id"].as_str())
        .expect("the answering node")
        .to_string()
}

/// Two hosts with the cluster secret find each other by mDNS alone and run
/// one model split over both exactly as one host runs it; a third host with
/// the wrong secret is seen on the network but never let in.
#[test]
fn hosts_on_a_network_discover_each_other_and_split_a_model() {
    let mut net = Net::new();
    let (ns_a, ip_a) = net.host(1);
    let (ns_b, ip_b) = net.host(2);
    let (ns_c, ip_c) = net.host(3);
    let (_a, a) = node(&ns_a, &ip_a, "reef");
    let (_b, b) = node(&ns_b, &ip_b, "reef");
    let (_c, c) = node(&ns_c, &ip_c, "wrong");
    assert_eq!(a, format!("{ip_a}:8421"));
    let (a_id, b_id, c_id) = (self_id(&a), self_id(&b), self_id(&c));

    // Discovery: no --peer anywhere, so only mDNS can have done this.
    let both = |n: &[Value]| n.len() == 2 && n.iter().all(|x| x["status"] == "online");
    for (addr, other, other_addr) in [(&a, &b_id, &b), (&b, &a_id, &a)] {
        let seen = poll_nodes(|| nodes_of(addr), both);
        assert_eq!(seen.len(), 2, "{addr} sees {seen:?}");
        let peer = seen
            .iter()
            .find(|n| n["id"] == other.as_str())
            .unwrap_or_else(|| panic!("{addr} does not see {other}: {seen:?}"));
        assert_eq!(peer["address"], other_addr.as_str());
    }
    // The stranger announced itself too, yet neither side took the other in.
    assert!(nodes_of(&a).iter().all(|n| n["id"] != c_id.as_str()));
    let c_view = nodes_of(&c);
    assert_eq!(c_view.len(), 1, "{c_view:?}");
    // They did meet: the stranger refused the members' signed calls.
    let c_log = std::env::temp_dir().join(format!(
        "shoal-cli-netns-{ns_c}-{}/stderr.log",
        std::process::id()
    ));
    wait_for_log(
        &c_log,
        "the cluster secret differs",
        "the members never reached the stranger",
    );
    assert!(nodes_of(&a).iter().all(|n| n["id"] != c_id.as_str()));

    // A pipeline over both hosts: the MLX ring between namespaces.
    let model = shoal::id_from_path(&gguf());
    let ask = json!({"model": model, "max_tokens": 12, "temperature": 0,
                     "messages": [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]})
    .to_string();
    let (status, single) = post_json_with(&a, "/v1/chat/completions", &ask, &auth());
    assert_eq!(status, 200, "{single}");
    let (status, inst) = post_json_with(
        &a,
        "/v1/instances",
        &json!({"model": model, "nodes": [a_id, b_id], "sharding": "pipeline"}).to_string(),
        &auth(),
    );
    assert_eq!(status, 200, "{inst}");
    assert_eq!(inst["status"], "ready", "{inst}");
    let (status, split) = post_json_with(&a, "/v1/chat/completions", &ask, &auth());
    assert_eq!(status, 200, "{split}");
    assert_eq!(
        split["choices"][0]["message"],
        single["choices"][0]["message"]
    );
    assert_eq!(split["usage"], single["usage"]);
    assert_eq!(
        split["choices"][0]["finish_reason"],
        single["choices"][0]["finish_reason"]
    );

    // Any host lists the instance and can remove it, not only the one that
    // placed it.
    let (status, on_b) = get_with(&b, "/v1/instances", &auth());
    assert_eq!(status, 200, "{on_b}");
    assert_eq!(on_b["data"][0]["id"], inst["id"], "{on_b}");
    let id = inst["id"].as_str().expect("instance id");
    let (status, _, body) = request(&b, "DELETE", &format!("/v1/instances/{id}"), &auth(), None);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"deleted\":true"), "{body}");
    let (_, on_a) = get_with(&a, "/v1/instances", &auth());
    assert_eq!(on_a["data"], json!([]), "{on_a}");
    let (status, _, body) = request(&b, "DELETE", &format!("/v1/instances/{id}"), &auth(), None);
    assert_eq!(status, 404, "{body}");
}
