//! Cluster control messages are signed with the shared secret: an
//! HMAC-SHA256 over the method, path, a timestamp, the sender's id and
//! address and the body's hash. A node without the secret cannot join,
//! read status or submit work; a captured request stops working after
//! `MAX_SKEW`.
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

pub const NODE_HEADER: &str = "x-shoal-node";
pub const ADDR_HEADER: &str = "x-shoal-addr";
pub const TIME_HEADER: &str = "x-shoal-time";
pub const SIGNATURE_HEADER: &str = "x-shoal-signature";

/// How far a signed request's clock may be from ours, in seconds.
pub const MAX_SKEW: u64 = 30;

/// Who signed a request and from where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Signed {
    pub node: String,
    /// The sender's API address (`host:port`).
    pub addr: String,
    pub time: u64,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum AuthError {
    #[error("missing {0} header")]
    Missing(&'static str),
    #[error("the request's clock is {0} s away from ours")]
    Stale(u64),
    #[error("bad signature: the cluster secret differs")]
    BadSignature,
}

/// The shared secret, kept out of `Debug` output.
#[derive(Clone)]
pub struct Secret(Vec<u8>);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(..)")
    }
}

fn now_secs() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl Secret {
    pub fn new(s: &str) -> Secret {
        Secret(s.as_bytes().to_vec())
    }

    fn mac(&self, method: &str, path: &str, who: &Signed, body: &[u8]) -> Hmac<Sha256> {
        // Any key length is accepted by HMAC.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.0)
            .unwrap_or_else(|_| unreachable!("HMAC takes keys of any length"));
        let text = format!(
            "{method}\n{path}\n{}\n{}\n{}\n{}",
            who.time,
            who.node,
            who.addr,
            hex::encode(Sha256::digest(body))
        );
        mac.update(text.as_bytes());
        mac
    }

    /// The headers to send with a request.
    pub fn sign(
        &self,
        method: &str,
        path: &str,
        node: &str,
        addr: &str,
        body: &[u8],
    ) -> Vec<(&'static str, String)> {
        let who = Signed {
            node: node.into(),
            addr: addr.into(),
            time: now_secs(),
        };
        let sig = hex::encode(self.mac(method, path, &who, body).finalize().into_bytes());
        vec![
            (NODE_HEADER, who.node),
            (ADDR_HEADER, who.addr),
            (TIME_HEADER, who.time.to_string()),
            (SIGNATURE_HEADER, sig),
        ]
    }

    /// Checks a request's signature (in constant time) and freshness.
    pub fn verify(
        &self,
        method: &str,
        path: &str,
        header: impl Fn(&str) -> Option<String>,
        body: &[u8],
    ) -> Result<Signed, AuthError> {
        let get = |h: &'static str| header(h).ok_or(AuthError::Missing(h));
        let who = Signed {
            node: get(NODE_HEADER)?,
            addr: get(ADDR_HEADER)?,
            time: get(TIME_HEADER)?
                .parse()
                .map_err(|_| AuthError::Missing(TIME_HEADER))?,
        };
        let skew = now_secs().abs_diff(who.time);
        if skew > MAX_SKEW {
            return Err(AuthError::Stale(skew));
        }
        let sig = hex::decode(get(SIGNATURE_HEADER)?).map_err(|_| AuthError::BadSignature)?;
        self.mac(method, path, &who, body)
            .verify_slice(&sig)
            .map_err(|_| AuthError::BadSignature)?;
        Ok(who)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lookup<'a>(h: &'a [(&'static str, String)]) -> impl Fn(&str) -> Option<String> + 'a {
        move |name| h.iter().find(|(k, _)| *k == name).map(|(_, v)| v.clone())
    }

    #[test]
    fn signatures_check_secret_path_body_and_sender() {
        let s = Secret::new("shared");
        let h = s.sign("GET", "/v1/cluster/status", "n1", "127.0.0.1:1", b"");
        let who = s
            .verify("GET", "/v1/cluster/status", lookup(&h), b"")
            .unwrap();
        assert_eq!(
            (who.node.as_str(), who.addr.as_str()),
            ("n1", "127.0.0.1:1")
        );
        let bad = Err(AuthError::BadSignature);
        assert_eq!(
            Secret::new("other").verify("GET", "/v1/cluster/status", lookup(&h), b""),
            bad
        );
        assert_eq!(s.verify("GET", "/v1/instances", lookup(&h), b""), bad);
        assert_eq!(s.verify("GET", "/v1/cluster/status", lookup(&h), b"x"), bad);
        let mut forged = h.clone();
        forged[1].1 = "10.0.0.9:1".into();
        assert_eq!(
            s.verify("GET", "/v1/cluster/status", lookup(&forged), b""),
            bad
        );
        let mut old = h.clone();
        old[2].1 = (now_secs() - 3600).to_string();
        assert!(matches!(
            s.verify("GET", "/v1/cluster/status", lookup(&old), b""),
            Err(AuthError::Stale(_))
        ));
        assert_eq!(
            s.verify("GET", "/", |_| None, b""),
            Err(AuthError::Missing(NODE_HEADER))
        );
    }
}
