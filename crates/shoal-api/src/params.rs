//! Request checks the dialects share: ranges, token limits, stop strings,
//! and the OpenAI sampling parameters, so every endpoint accepts and refuses
//! the same values with the same words.
use std::collections::BTreeMap;

use serde::Deserialize;
use shoal_engine::SamplingParams;

use crate::body::OneOrMany;
use crate::error::ApiError;

/// Checks a value against an inclusive range, naming the parameter.
pub fn check_range<T: PartialOrd + std::fmt::Display + Copy>(
    name: &str,
    v: Option<T>,
    lo: T,
    hi: T,
) -> Result<(), ApiError> {
    match v {
        Some(x) if !(x >= lo && x <= hi) => Err(ApiError::param(
            name,
            format!("'{name}' must be between {lo} and {hi}, got {x}"),
        )),
        _ => Ok(()),
    }
}

/// `max_tokens`-style limits: at least 1. A limit past what the context
/// window leaves is a cap, not an error: the reply then runs until the
/// window is full and says so (`FinishReason::ContextWindow`).
pub fn check_max_tokens(name: &str, v: Option<i64>) -> Result<Option<usize>, ApiError> {
    match v {
        None => Ok(None),
        Some(x) if x < 1 => Err(ApiError::param(
            name,
            format!("'{name}' must be at least 1, got {x}"),
        )),
        Some(x) => Ok(Some(usize::try_from(x).unwrap_or(usize::MAX))),
    }
}

/// Stop strings: at most 4, as OpenAI allows.
pub fn check_stop(stop: Option<OneOrMany<String>>) -> Result<Vec<String>, ApiError> {
    let stops = stop.map(OneOrMany::into_vec).unwrap_or_default();
    if stops.len() > 4 {
        return Err(ApiError::param(
            "stop",
            format!("at most 4 stop sequences are allowed, got {}", stops.len()),
        ));
    }
    Ok(stops.into_iter().filter(|s| !s.is_empty()).collect())
}

/// Sampling parameters shared by Chat Completions and Completions, checked
/// in one place so both endpoints accept and refuse the same values.
#[derive(Debug, Deserialize)]
pub struct OpenAiSampling {
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Token id (as a string, as OpenAI sends it) → additive bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
    /// Beyond OpenAI's fields, as vLLM and llama-server take them (0 turns
    /// top_k and min_p off; 1 the repetition penalty).
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
}

impl OpenAiSampling {
    /// Choices per prompt.
    pub fn n(&self) -> usize {
        self.n.unwrap_or(1) as usize
    }

    /// Validates the ranges and builds the engine's parameters; what the
    /// request leaves out comes from the model's `defaults`.
    pub fn params(
        &self,
        defaults: &SamplingParams,
        top_logprobs: Option<usize>,
    ) -> Result<SamplingParams, ApiError> {
        check_range("temperature", self.temperature, 0.0, 2.0)?;
        check_range("top_p", self.top_p, 0.0, 1.0)?;
        if self.top_p == Some(0.0) {
            return Err(ApiError::param("top_p", "'top_p' must be greater than 0"));
        }
        check_range("n", self.n, 1, 16)?;
        check_range("presence_penalty", self.presence_penalty, -2.0, 2.0)?;
        check_range("frequency_penalty", self.frequency_penalty, -2.0, 2.0)?;
        check_range("top_k", self.top_k, 0, i64::from(u32::MAX))?;
        check_range("min_p", self.min_p, 0.0, 1.0)?;
        check_range("repetition_penalty", self.repetition_penalty, 0.0, 100.0)?;
        if self.repetition_penalty == Some(0.0) {
            return Err(ApiError::param(
                "repetition_penalty",
                "'repetition_penalty' must be greater than 0",
            ));
        }
        let logit_bias = self.logit_bias()?;
        Ok(SamplingParams {
            temperature: self.temperature.unwrap_or(defaults.temperature),
            top_p: self.top_p.unwrap_or(defaults.top_p),
            seed: self.seed.map(|s| s as u64),
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            top_k: self.top_k.map_or(defaults.top_k, |k| k as usize),
            min_p: self.min_p.unwrap_or(defaults.min_p),
            repetition_penalty: self
                .repetition_penalty
                .unwrap_or(defaults.repetition_penalty),
            top_logprobs,
            logit_bias,
            ..defaults.clone()
        })
    }

    /// Keys must be token ids; ids past the vocabulary are refused by the engine at submit.
    fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        map.iter()
            .map(|(key, &bias)| {
                let id = key.trim().parse::<u32>().map_err(|_| {
                    ApiError::param(
                        "logit_bias",
                        format!("'logit_bias' keys must be token ids, got {key:?}"),
                    )
                })?;
                check_range("logit_bias", Some(bias), -100.0, 100.0)?;
                Ok((id, bias))
            })
            .collect()
    }
}
