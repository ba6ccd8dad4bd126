//! `GET /metrics`: Prometheus (OpenMetrics text) counters and histograms of
//! what the server did, fed from the same completion records as the ledger,
//! plus gauges read from the engine at scrape time.
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Mutex;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    dialect: String,
    /// In the dialect's own words (`stop`, `end_turn`, `incomplete:max_output_tokens`, `cancelled` …).
    finish_reason: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TokenLabels {
    dialect: String,
    /// `prompt`, `cached`, `completion` or `reasoning`.
    kind: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TierLabels {
    /// `ram` or `disk`.
    tier: String,
    stat: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DraftLabels {
    dialect: String,
    /// `accepted` (kept: completion tokens that took no step of their own)
    /// or `rejected` (checked and dropped).
    outcome: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DialectLabels {
    dialect: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabels {
    model: String,
}

fn ttft_histogram() -> Histogram {
    // 5 ms … ~82 s.
    Histogram::new(exponential_buckets(0.005, 2.0, 15))
}

fn rate_histogram() -> Histogram {
    // 0.5 … ~2000 tokens/s.
    Histogram::new(exponential_buckets(0.5, 2.0, 13))
}

/// The server's metrics.
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    tokens: Family<TokenLabels, Counter>,
    ttft: Family<DialectLabels, Histogram, fn() -> Histogram>,
    decode_rate: Family<DialectLabels, Histogram, fn() -> Histogram>,
    drafts: Family<DraftLabels, Counter>,
    embedded: Family<DialectLabels, Counter>,
    images: Family<DialectLabels, Counter>,
    queued: Gauge,
    in_flight: Gauge,
    model_loaded: Family<ModelLabels, Gauge>,
    model_memory: Family<ModelLabels, Gauge>,
    prefix_cache_bytes: Gauge,
    cache_hit_ratio: Gauge<f64, AtomicU64>,
    cache_tiers: Family<TierLabels, Gauge>,
    /// Serialises scrapes (gauges are set, then the registry encoded).
    scrape: Mutex<()>,
}

/// Registers `metric` under `name` and hands back the handle the server
/// updates (metrics share their state with their clones).
fn register<M: prometheus_client::registry::Metric + Clone>(
    registry: &mut Registry,
    name: &str,
    help: &str,
    metric: M,
) -> M {
    registry.register(name, help, metric.clone());
    metric
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("shoal");
        let requests = register(
            &mut r,
            "requests",
            "Requests served, by API dialect and finish reason (per choice)",
            Family::<RequestLabels, Counter>::default(),
        );
        let tokens = register(
            &mut r,
            "tokens",
            "Tokens by kind: prompt (all of it), cached (prompt tokens reused from the prefix cache), completion, reasoning (part of completion)",
            Family::<TokenLabels, Counter>::default(),
        );
        let ttft = register(
            &mut r,
            "time_to_first_token_seconds",
            "Time from submission to the first generated token (queue wait included)",
            Family::new_with_constructor(ttft_histogram as fn() -> Histogram),
        );
        let decode_rate = register(
            &mut r,
            "decode_tokens_per_second",
            "Decode speed of each request",
            Family::new_with_constructor(rate_histogram as fn() -> Histogram),
        );
        let drafts = register(
            &mut r,
            "draft_tokens",
            "Speculative decoding's draft tokens checked by the model, by outcome (never counted as completion tokens)",
            Family::<DraftLabels, Counter>::default(),
        );
        let embedded = register(
            &mut r,
            "embedding_inputs",
            "Inputs embedded, by API dialect (their tokens count as prompt tokens)",
            Family::<DialectLabels, Counter>::default(),
        );
        let images = register(
            &mut r,
            "image_inputs",
            "Images in generation prompts, by API dialect (their positions count as prompt tokens of kind image too)",
            Family::<DialectLabels, Counter>::default(),
        );
        let queued = register(
            &mut r,
            "queue_depth",
            "Requests waiting to start",
            Gauge::default(),
        );
        let in_flight = register(
            &mut r,
            "requests_in_flight",
            "Requests being prefilled or decoded",
            Gauge::default(),
        );
        let model_loaded = register(
            &mut r,
            "model_loaded",
            "1 for each loaded model",
            Family::<ModelLabels, Gauge>::default(),
        );
        let model_memory = register(
            &mut r,
            "model_memory_bytes",
            "Memory each loaded model holds: weights, reserved KV and llama.cpp's buffers (as /v1/models memory_bytes)",
            Family::<ModelLabels, Gauge>::default(),
        );
        let prefix_cache_bytes = register(
            &mut r,
            "prefix_cache_bytes",
            "Bytes held by the prefix cache",
            Gauge::default(),
        );
        let cache_hit_ratio = register(
            &mut r,
            "prefix_cache_hit_ratio",
            "Share of all prompt tokens served from the prefix cache since start",
            Gauge::<f64, AtomicU64>::default(),
        );
        let cache_tiers = register(
            &mut r,
            "prefix_cache",
            "The prefix cache's tiers since start, by tier (ram, disk) and stat: hits, misses, evictions, and on disk bytes_read, bytes_written, writes, bad_entries (torn or corrupted, removed), write_errors, bytes, entries and blocks held, blocks_written and blocks_shared (found on disk for a prefix another entry holds)",
            Family::<TierLabels, Gauge>::default(),
        );
        Metrics {
            cache_tiers,
            registry: r,
            requests,
            tokens,
            ttft,
            decode_rate,
            drafts,
            embedded,
            images,
            queued,
            in_flight,
            model_loaded,
            model_memory,
            prefix_cache_bytes,
            cache_hit_ratio,
            scrape: Mutex::new(()),
        }
    }

    /// Counts the inputs of one answered embedding request (the request and
    /// its tokens are counted by [`Metrics::observe`] like any other).
    pub fn observe_embedded(&self, dialect: &str, inputs: usize) {
        self.embedded
            .get_or_create(&DialectLabels {
                dialect: dialect.to_string(),
            })
            .inc_by(inputs as u64);
    }

    /// Counts one finished request: its choices' finish reasons (dialect
    /// words), the tokens each choice cost the engine (a prompt shared by
    /// `n` choices was run `n` times) and each choice's timings.
    pub fn observe(&self, entry: &crate::ledger::LedgerEntry) {
        let dialect = entry.dialect.ledger_name();
        let completions = &entry.completions;
        for f in &entry.finish_reasons() {
            self.requests
                .get_or_create(&RequestLabels {
                    dialect: dialect.to_string(),
                    finish_reason: f.clone(),
                })
                .inc();
        }
        let add = |kind: &str, n: usize| {
            self.tokens
                .get_or_create(&TokenLabels {
                    dialect: dialect.to_string(),
                    kind: kind.to_string(),
                })
                .inc_by(n as u64);
        };
        let mut work = shoal_engine::Usage::default();
        for c in completions {
            work += c.usage;
        }
        add("prompt", work.prompt_tokens);
        add("cached", work.cached_tokens);
        add("cached_disk", work.cached_disk_tokens);
        add("cache_write", work.cache_write_tokens);
        add("completion", work.completion_tokens);
        add("reasoning", work.reasoning_tokens);
        add("image", work.image_tokens);
        if work.images > 0 {
            self.images
                .get_or_create(&DialectLabels {
                    dialect: dialect.to_string(),
                })
                .inc_by(work.images as u64);
        }
        let checked: usize = completions.iter().map(|c| c.timings.draft_tokens).sum();
        let kept: usize = completions.iter().map(|c| c.timings.draft_accepted).sum();
        if checked > 0 {
            for (outcome, n) in [
                ("accepted", kept),
                ("rejected", checked.saturating_sub(kept)),
            ] {
                self.drafts
                    .get_or_create(&DraftLabels {
                        dialect: dialect.to_string(),
                        outcome: outcome.to_string(),
                    })
                    .inc_by(n as u64);
            }
        }
        let labels = DialectLabels {
            dialect: dialect.to_string(),
        };
        for c in completions.iter().filter(|c| c.usage.completion_tokens > 0) {
            self.ttft
                .get_or_create(&labels)
                .observe(c.timings.ttft_ms / 1000.0);
            if c.timings.decode_tokens_per_s.is_finite() && c.timings.decode_tokens_per_s > 0.0 {
                self.decode_rate
                    .get_or_create(&labels)
                    .observe(c.timings.decode_tokens_per_s);
            }
        }
    }

    /// The exposition text, with the engine's gauges read now.
    /// The text exposition, with the gauges read from the pool's models now.
    pub fn render(&self, pool: &crate::pool::ModelPool) -> Result<String, std::fmt::Error> {
        let _one = self.scrape.lock().unwrap_or_else(|p| p.into_inner());
        let engines = pool.loaded();
        let sum = |f: fn(&shoal_engine::EngineStats) -> &std::sync::atomic::AtomicU64| -> u64 {
            engines.iter().map(|e| f(&e.stats).load(Relaxed)).sum()
        };
        self.queued.set(sum(|s| &s.queued) as i64);
        self.in_flight.set(sum(|s| &s.running) as i64);
        self.prefix_cache_bytes
            .set(sum(|s| &s.prefix_cache_bytes) as i64);
        let prompt = sum(|s| &s.prompt_tokens);
        let cached = sum(|s| &s.cached_tokens);
        self.cache_hit_ratio.set(if prompt == 0 {
            0.0
        } else {
            cached as f64 / prompt as f64
        });
        let tier = |tier: &str, stat: &str, v: u64| {
            self.cache_tiers
                .get_or_create(&TierLabels {
                    tier: tier.to_string(),
                    stat: stat.to_string(),
                })
                .set(v as i64);
        };
        tier("ram", "hits", sum(|s| &s.ram_hits));
        tier("ram", "misses", sum(|s| &s.ram_misses));
        tier("ram", "evictions", sum(|s| &s.ram_evictions));
        tier("ram", "bytes", sum(|s| &s.prefix_cache_bytes));
        if let Some(d) = pool.disk_cache() {
            let d = d.summary();
            for (stat, v) in [
                ("hits", d.hits),
                ("misses", d.misses),
                ("evictions", d.evictions),
                ("bytes_read", d.bytes_read),
                ("bytes_written", d.bytes_written),
                ("writes", d.writes),
                ("bad_entries", d.bad_entries),
                ("write_errors", d.write_errors),
                ("bytes", d.bytes),
                ("entries", d.entries as u64),
                ("blocks", d.blocks as u64),
                ("blocks_written", d.blocks_written),
                ("blocks_shared", d.blocks_shared),
            ] {
                tier("disk", stat, v);
            }
        }
        // Models unloaded since the last scrape drop to 0.
        self.model_loaded.clear();
        self.model_memory.clear();
        for e in &engines {
            let model = ModelLabels {
                model: e.model.id.clone(),
            };
            self.model_loaded.get_or_create(&model).set(1);
            self.model_memory
                .get_or_create(&model)
                .set(e.model.resident_bytes() as i64);
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)?;
        Ok(out)
    }
}
