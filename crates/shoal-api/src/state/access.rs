//! The access rules as data: the API keys with their limits, the allowed
//! origins and the request-size bounds ([`Access`]), and the keys' recent
//! requests ([`Limits`]). The middleware that applies them is the module above.
use axum::http::{header, HeaderMap};
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

use crate::error::{ApiError, ErrorKind};

/// Origins of the desktop app's webview, allowed by default.
pub const APP_ORIGINS: &[&str] = &[
    "tauri://localhost",
    "http://tauri.localhost",
    "https://tauri.localhost",
];

/// One API key: its name (what the ledger records), the SHA-256 digest of
/// the key, and its optional limits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Key {
    pub name: String,
    digest: [u8; 32],
    /// Prompt plus completion tokens per UTC day.
    pub tokens_per_day: Option<u64>,
    pub requests_per_minute: Option<u32>,
}

impl Key {
    /// Reads a key as configured: `KEY`, or `NAME=KEY` with optional
    /// `;tokens_per_day=N` and `;requests_per_minute=N` after it. A key with
    /// no name is named after its digest (`key-1a2b3c4d`), never after itself.
    pub fn parse(spec: &str) -> Result<Key, String> {
        let mut parts = spec.split(';');
        let head = parts.next().unwrap_or_default();
        let named = head
            .split_once('=')
            .filter(|(name, key)| is_name(name) && !key.is_empty());
        let (name, key) = match named {
            Some((name, key)) => (Some(name), key),
            None => (None, head),
        };
        if key.is_empty() {
            return Err("an API key may not be empty".into());
        }
        let digest: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        let mut k = Key {
            name: name.map_or_else(|| format!("key-{}", hex(&digest[..4])), str::to_owned),
            digest,
            tokens_per_day: None,
            requests_per_minute: None,
        };
        for part in parts {
            let (limit, value) = part
                .split_once('=')
                .ok_or_else(|| format!("key {}: {part:?} is not LIMIT=N", k.name))?;
            let bad = |e: std::num::ParseIntError| format!("key {}: {limit}: {e}", k.name);
            match limit.trim() {
                "tokens_per_day" => k.tokens_per_day = Some(value.trim().parse().map_err(bad)?),
                "requests_per_minute" => {
                    k.requests_per_minute = Some(value.trim().parse().map_err(bad)?)
                }
                other => {
                    return Err(format!(
                        "key {}: unknown limit {other:?} (tokens_per_day or requests_per_minute)",
                        k.name
                    ))
                }
            }
        }
        Ok(k)
    }

    /// The spec with the key itself hidden, for printing settings.
    pub fn redacted(spec: &str) -> String {
        match Key::parse(spec) {
            Ok(k) => {
                let limits: String = spec.split(';').skip(1).map(|p| format!(";{p}")).collect();
                format!("{}=(set){limits}", k.name)
            }
            Err(_) => "(set)".into(),
        }
    }
}

fn is_name(s: &str) -> bool {
    (1..=64).contains(&s.len())
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// Access rules and request limits.
#[derive(Clone, Debug)]
pub struct Access {
    keys: Vec<Key>,
    /// Browser origins besides the server's own.
    pub origins: Vec<String>,
    /// Most messages one request may carry.
    pub max_messages: usize,
    /// Most tools one request may offer.
    pub max_tools: usize,
    /// Largest request body accepted (413 above it).
    pub max_body_bytes: usize,
    /// Longest a request may run; then it stops with a timeout error that
    /// still carries its usage (`None`: no limit).
    pub request_timeout: Option<std::time::Duration>,
    /// How long a stream may go without data before it sends its dialect's
    /// heartbeat (`None`: never; see `run::StreamRender::heartbeat`).
    pub stream_heartbeat: Option<std::time::Duration>,
    /// With keys, whether a request may reuse prefixes that another key's
    /// requests cached (off: each key's prefixes are its own).
    pub share_cache_across_keys: bool,
    /// What one request's images may be.
    pub images: shoal_engine::vision::ImageLimits,
    /// Whether an image given by an http(s) address is fetched for the client.
    pub fetch_image_urls: bool,
    /// Bytes of images one stored conversation may keep.
    pub max_chat_image_bytes: usize,
}

impl Default for Access {
    fn default() -> Self {
        Access {
            keys: Vec::new(),
            origins: APP_ORIGINS.iter().map(|s| s.to_string()).collect(),
            max_messages: 2048,
            max_tools: 256,
            max_body_bytes: 32 << 20,
            request_timeout: Some(std::time::Duration::from_secs(600)),
            stream_heartbeat: Some(std::time::Duration::from_secs(5)),
            share_cache_across_keys: false,
            images: shoal_engine::vision::ImageLimits::default(),
            fetch_image_urls: false,
            max_chat_image_bytes: 64 << 20,
        }
    }
}

impl Access {
    /// Requires one of `keys` on every API request (none: open, loopback
    /// only). Each is a [`Key::parse`] spec.
    pub fn with_keys(mut self, keys: &[String]) -> Result<Self, String> {
        self.keys = keys
            .iter()
            .filter(|k| !k.is_empty())
            .map(|k| Key::parse(k))
            .collect::<Result<_, _>>()?;
        let mut names: Vec<&str> = self.keys.iter().map(|k| k.name.as_str()).collect();
        names.sort_unstable();
        if let Some(w) = names.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("two API keys are named {}", w[0]));
        }
        Ok(self)
    }

    pub fn keys(&self) -> &[Key] {
        &self.keys
    }

    pub fn requires_key(&self) -> bool {
        !self.keys.is_empty()
    }

    /// The prefix-cache salt of a request made with the key named `client`:
    /// a key's own when keys keep their prefixes apart, else 0 (shared).
    pub fn cache_salt(&self, client: Option<&str>) -> u64 {
        match client {
            Some(name) if self.requires_key() && !self.share_cache_across_keys => {
                let d = sha2::Sha256::digest(name.as_bytes());
                u64::from_le_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]) | 1
            }
            _ => 0,
        }
    }

    /// The key `given` is, if any. Every key is compared in full, as
    /// SHA-256 digests so that the comparison's time does not depend on the
    /// keys' lengths either.
    pub(crate) fn key_for(&self, given: &[u8]) -> Option<&Key> {
        let given = Sha256::digest(given);
        self.keys.iter().fold(None, |found, k| {
            let hit = bool::from(k.digest.as_slice().ct_eq(given.as_slice()));
            if hit {
                Some(k)
            } else {
                found
            }
        })
    }

    /// The server's own origin (its Host) or a listed one.
    pub(crate) fn origin_ok(&self, origin: &str, headers: &HeaderMap) -> bool {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        let own = !host.is_empty()
            && (origin == format!("http://{host}") || origin == format!("https://{host}"));
        own || self.origins.iter().any(|o| o == origin || o == "*")
    }
}

/// Per-key request times, for `requests_per_minute`.
#[derive(Debug, Default)]
pub struct Limits {
    recent: std::sync::Mutex<
        std::collections::HashMap<String, std::collections::VecDeque<std::time::Instant>>,
    >,
}

impl Limits {
    /// Admits a request made with `key`, or refuses it with a 429 naming the
    /// limit and when to retry. The day's tokens are the ledger's (prompt
    /// plus completion, UTC day); a refused request counts toward neither.
    pub fn admit(&self, key: &Key, ledger: &crate::ledger::Ledger) -> Result<(), ApiError> {
        let limited = |message: String, retry_after_secs: u64| {
            ApiError::new(ErrorKind::RateLimited { retry_after_secs }, message)
                .with_code("rate_limit_exceeded")
        };
        if let Some(quota) = key.tokens_per_day {
            let (used, day_left) = ledger.tokens_today(&key.name)?;
            if used >= quota {
                return Err(limited(
                    format!(
                        "API key {} has used {used} of its {quota} tokens for today (UTC)",
                        key.name
                    ),
                    day_left,
                ));
            }
        }
        if let Some(rpm) = key.requests_per_minute {
            let now = std::time::Instant::now();
            let minute = std::time::Duration::from_secs(60);
            let mut recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
            let times = recent.entry(key.name.clone()).or_default();
            while times
                .front()
                .is_some_and(|t| now.duration_since(*t) >= minute)
            {
                times.pop_front();
            }
            if let Some(first) = times.front().filter(|_| times.len() >= rpm as usize) {
                let wait = minute.saturating_sub(now.duration_since(*first));
                return Err(limited(
                    format!(
                        "API key {} is over its limit of {rpm} requests per minute",
                        key.name
                    ),
                    wait.as_secs() + 1,
                ));
            }
            times.push_back(now);
        }
        Ok(())
    }

    /// Requests `name` made in the last minute.
    pub fn last_minute(&self, name: &str) -> usize {
        let now = std::time::Instant::now();
        let recent = self.recent.lock().unwrap_or_else(|p| p.into_inner());
        recent.get(name).map_or(0, |times| {
            times
                .iter()
                .filter(|t| now.duration_since(**t) < std::time::Duration::from_secs(60))
                .count()
        })
    }
}
