//! Response metadata. A fixed set of keys belongs to the provider: its stop
//! reason and every `token_usage_` figure. They are captured into a typed
//! struct (one field per key, so an unknown key does not compile), and the
//! same list drives both clearing them from caller metadata and writing them.
use serde_json::Value;

/// Caller or stored metadata: string keys, JSON values.
pub use shoal_store::Metadata;

/// Declares [`ProviderMeta`] and [`RESERVED_KEYS`] from one field list.
macro_rules! provider_meta {
    ($( $(#[$doc:meta])* $field:ident : $ty:ty ),* $(,)?) => {
        /// What the provider said about a response piece. `None` means the
        /// provider did not report it (missing, null, empty or non-numeric).
        #[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
        pub struct ProviderMeta {
            $( $(#[$doc])* #[serde(default, skip_serializing_if = "Option::is_none")] pub $field: Option<$ty>, )*
        }

        /// Every reserved key (all `token_usage_` keys are reserved too).
        pub const RESERVED_KEYS: &[&str] = &[ $( stringify!($field) ),* ];

        impl ProviderMeta {
            /// The reported values under their reserved keys.
            pub fn to_map(&self) -> Metadata {
                let mut m = Metadata::new();
                $( if let Some(v) = &self.$field { m.insert(stringify!($field).to_string(), serde_json::json!(v)); } )*
                m
            }
        }
    };
}

provider_meta! {
    /// Chat Completions / Completions `finish_reason`.
    finish_reason: String,
    /// Responses `status` (`completed`, `incomplete`, `failed`, …).
    status: String,
    /// Responses `incomplete_details.reason`.
    incomplete_reason: String,
    /// Anthropic `stop_reason`.
    stop_reason: String,
    /// Anthropic `stop_sequence` (the matched string).
    stop_sequence: String,
    /// Every prompt token, cached or not.
    token_usage_prompt_tokens: u64,
    token_usage_completion_tokens: u64,
    token_usage_total_tokens: u64,
    /// Prompt tokens read from the provider's cache.
    token_usage_cached_tokens: u64,
    /// Prompt tokens written to the provider's cache (Anthropic).
    token_usage_cache_creation_tokens: u64,
    token_usage_reasoning_tokens: u64,
    /// Anthropic `input_tokens` as sent (it excludes cached tokens).
    token_usage_input_tokens: u64,
    /// Cost from the configured price table, computed after usage capture.
    response_cost_usd: f64,
}

/// Whether `key` belongs to the provider.
pub fn is_reserved(key: &str) -> bool {
    key.starts_with("token_usage_") || RESERVED_KEYS.contains(&key)
}

/// The metadata a response piece stores: the request's metadata without any
/// reserved key, then what the provider reported.
pub fn merge(request: &Metadata, provider: &ProviderMeta) -> Metadata {
    let mut m: Metadata = request
        .iter()
        .filter(|(k, _)| !is_reserved(k))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    m.extend(provider.to_map());
    m
}

/// A count as reported: a non-negative integer, or absent. Strings, floats
/// with fractions, negatives and nulls are "not reported", never 0.
pub fn count(v: Option<&Value>) -> Option<u64> {
    match v? {
        Value::Number(n) => n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0)
                .map(|f| f as u64)
        }),
        _ => None,
    }
}

/// A non-empty string as reported, or absent.
pub fn text(v: Option<&Value>) -> Option<String> {
    v?.as_str().filter(|s| !s.is_empty()).map(str::to_string)
}

/// Per-million-token prices for one model.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Price of cached prompt tokens; defaults to the input price.
    pub cached_input_per_mtok: Option<f64>,
}

impl ProviderMeta {
    /// Fills `response_cost_usd` from usage, if prompt and completion counts were reported.
    pub fn price(&mut self, p: &Price) {
        let (Some(prompt), Some(completion)) = (
            self.token_usage_prompt_tokens,
            self.token_usage_completion_tokens,
        ) else {
            return;
        };
        let cached = self.token_usage_cached_tokens.unwrap_or(0).min(prompt);
        let cached_price = p.cached_input_per_mtok.unwrap_or(p.input_per_mtok);
        let cost = ((prompt - cached) as f64 * p.input_per_mtok
            + cached as f64 * cached_price
            + completion as f64 * p.output_per_mtok)
            / 1e6;
        self.response_cost_usd = Some(cost);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reserved_keys_are_cleared_and_rewritten_from_one_list() {
        let mut req = Metadata::new();
        for k in RESERVED_KEYS {
            req.insert(k.to_string(), json!("forged"));
        }
        req.insert("token_usage_anything".into(), json!(1));
        req.insert("run".into(), json!("r1"));
        let merged = merge(&req, &ProviderMeta::default());
        assert_eq!(merged.len(), 1, "{merged:?}");
        assert_eq!(merged["run"], "r1");
        let p = ProviderMeta {
            finish_reason: Some("stop".into()),
            token_usage_prompt_tokens: Some(3),
            ..Default::default()
        };
        let merged = merge(&req, &p);
        assert_eq!(merged["finish_reason"], "stop");
        assert_eq!(merged["token_usage_prompt_tokens"], 3);
        assert_eq!(merged.len(), 3);
        assert!(RESERVED_KEYS.iter().all(|k| is_reserved(k)));
    }

    #[test]
    fn odd_values_are_absent_not_zero() {
        assert_eq!(count(Some(&json!(5))), Some(5));
        assert_eq!(count(Some(&json!(5.0))), Some(5));
        for odd in [
            json!(null),
            json!("5"),
            json!(-1),
            json!(1.5),
            json!({}),
            json!(""),
        ] {
            assert_eq!(count(Some(&odd)), None, "{odd}");
        }
        assert_eq!(count(None), None);
        assert_eq!(text(Some(&json!(""))), None);
        assert_eq!(text(Some(&json!(3))), None);
    }

    #[test]
    fn cost_uses_cached_price() {
        let mut p = ProviderMeta {
            token_usage_prompt_tokens: Some(1_000_000),
            token_usage_cached_tokens: Some(500_000),
            token_usage_completion_tokens: Some(1_000_000),
            ..Default::default()
        };
        p.price(&Price {
            input_per_mtok: 2.0,
            output_per_mtok: 8.0,
            cached_input_per_mtok: Some(0.5),
        });
        assert_eq!(p.response_cost_usd, Some(1.0 + 0.25 + 8.0));
    }
}
