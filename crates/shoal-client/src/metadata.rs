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
    /// Of the prompt tokens, those images took (OpenAI-style
    /// `image_tokens`, Ollama's `prompt_eval_image_count`), where reported.
    token_usage_image_tokens: u64,
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

/// Per-million-token prices for one model: the recorder's providers file
/// and the server's `[prices.MODEL]` both read this shape. A key not listed
/// here is an error, so a misspelt price is not silently a different bill.
#[derive(Clone, Debug, PartialEq, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    /// Price of cached prompt tokens; defaults to the input price.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_input_per_mtok: Option<f64>,
}

/// What tokens cost at a [`Price`], per kind (no currency: the prices'
/// own). Sums of costs add up field by field.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Cost {
    /// The prompt tokens not read from cache.
    pub input: f64,
    pub cached_input: f64,
    /// Completion tokens, reasoning included.
    pub output: f64,
}

impl Cost {
    pub fn total(&self) -> f64 {
        self.input + self.cached_input + self.output
    }

    /// As an API reports it: each part and the total.
    pub fn to_json(&self) -> Value {
        serde_json::json!({"input": self.input, "cached_input": self.cached_input,
                           "output": self.output, "total": self.total()})
    }
}

impl std::ops::AddAssign for Cost {
    fn add_assign(&mut self, o: Cost) {
        self.input += o.input;
        self.cached_input += o.cached_input;
        self.output += o.output;
    }
}

impl Price {
    /// The cost of a usage: `cached` of the `prompt` tokens at the cached
    /// price (the input price if none is set), the rest of the prompt at the
    /// input price, every completion token (reasoning is part of them) at
    /// the output price. Cached counts over the prompt are taken as the
    /// whole prompt.
    pub fn cost(&self, prompt: u64, cached: u64, completion: u64) -> Cost {
        let cached = cached.min(prompt);
        let per = |tokens: u64, price: f64| tokens as f64 * price / 1e6;
        Cost {
            input: per(prompt - cached, self.input_per_mtok),
            cached_input: per(
                cached,
                self.cached_input_per_mtok.unwrap_or(self.input_per_mtok),
            ),
            output: per(completion, self.output_per_mtok),
        }
    }
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
        let cached = self.token_usage_cached_tokens.unwrap_or(0);
        self.response_cost_usd = Some(p.cost(prompt, cached, completion).total());
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

    #[test]
    fn cost_splits_cached_input_and_output() {
        let p = Price {
            input_per_mtok: 3.0,
            output_per_mtok: 15.0,
            cached_input_per_mtok: Some(0.3),
        };
        // 2,000 prompt tokens (500 cached), 1,000 completion tokens.
        let c = p.cost(2_000, 500, 1_000);
        let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
        assert!(close(c.input, 1_500.0 * 3.0 / 1e6), "{c:?}");
        assert!(close(c.cached_input, 500.0 * 0.3 / 1e6), "{c:?}");
        assert!(close(c.output, 1_000.0 * 15.0 / 1e6), "{c:?}");
        assert!(close(c.total(), 0.0045 + 0.00015 + 0.015), "{c:?}");
        // No cached price: cached tokens cost what input does.
        let flat = Price {
            cached_input_per_mtok: None,
            ..p.clone()
        };
        let c = flat.cost(2_000, 500, 0);
        assert!(close(c.cached_input, 500.0 * 3.0 / 1e6), "{c:?}");
        assert!(close(c.input + c.cached_input, 2_000.0 * 3.0 / 1e6));
        // A cached count over the prompt is the whole prompt, never negative input.
        let c = p.cost(100, 250, 0);
        assert_eq!(c.input, 0.0);
        assert!(close(c.cached_input, 100.0 * 0.3 / 1e6), "{c:?}");
        // Sums add part by part.
        let mut sum = Cost::default();
        sum += p.cost(1_000_000, 0, 0);
        sum += p.cost(0, 0, 1_000_000);
        assert_eq!((sum.input, sum.output, sum.total()), (3.0, 15.0, 18.0));
        let v = sum.to_json();
        assert_eq!(v["total"], 18.0);
        assert_eq!(v["cached_input"], 0.0);
    }

    #[test]
    fn a_misspelt_price_key_is_an_error() {
        let ok: Price =
            serde_json::from_value(json!({"input_per_mtok": 1.0, "output_per_mtok": 2.0})).unwrap();
        assert_eq!(ok.cached_input_per_mtok, None);
        let bad = serde_json::from_value::<Price>(
            json!({"input_per_mtok": 1.0, "output_per_mtok": 2.0, "cached_input_per_mtk": 0.1}),
        );
        assert!(bad.is_err());
    }
}
