//! The sampling settings a model's authors ship with it, applied wherever a
//! request leaves a parameter out (an explicit value always wins).
//!
//! Read from `generation_config.json` in a Hugging Face / MLX directory and
//! from the `general.sampling.*` keys of a GGUF. Some authors publish their
//! settings only in the model card, and GGUFs converted before those keys
//! existed carry none: for such a GGUF, [`CARDS`] gives the card's values,
//! matched on the file's own `general.organization` and `general.basename`
//! (keys the file names still win). Anything left keeps Shoal's own
//! default (the OpenAI API's: temperature 1, top_p 1, no top-k, min-p or
//! repetition penalty). Each value says where it came from, for
//! `/v1/models` and the UI.
use std::path::Path;

use serde::Serialize;
use serde_json::Value;

use crate::sampler::SamplingParams;

/// Where a default came from, when the model named none.
pub const SHOAL_DEFAULT: &str = "shoal default";

/// A model family's sampling settings as its authors' model card gives them.
pub struct Card {
    /// `general.organization` of the family's GGUFs.
    pub organization: &'static str,
    /// `general.basename` of the family's GGUFs.
    pub basename: &'static str,
    pub temperature: f32,
    pub top_p: f32,
    /// Where the values are written, as `/v1/models` names the source.
    pub source: &'static str,
}

/// Families whose GGUFs carry no sampling keys but whose cards recommend
/// settings. SmolLM2 (the default model) at temperature 1 wanders off
/// topic; its card samples at 0.2 with top_p 0.9.
pub const CARDS: &[Card] = &[Card {
    organization: "HuggingFaceTB",
    basename: "smollm2",
    temperature: 0.2,
    top_p: 0.9,
    source: "model card (HuggingFaceTB/SmolLM2)",
}];

/// A value and where it came from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Sourced<T: Written> {
    #[serde(serialize_with = "as_written")]
    pub value: T,
    pub source: String,
}

/// A default as it is written down. An `f32` such as 0.2 goes out as 0.2,
/// not as the 0.20000000298023224 a widening to `f64` would send (every
/// client reads JSON numbers as doubles).
pub trait Written {
    fn written(&self) -> serde_json::Number;
}

impl Written for f32 {
    fn written(&self) -> serde_json::Number {
        // The shortest decimal that reads back as this f32, read as an f64.
        let x: f64 = self.to_string().parse().unwrap_or(f64::from(*self));
        serde_json::Number::from_f64(x).unwrap_or_else(|| serde_json::Number::from(0))
    }
}

impl Written for usize {
    fn written(&self) -> serde_json::Number {
        serde_json::Number::from(*self as u64)
    }
}

fn as_written<T: Written, S: serde::Serializer>(v: &T, s: S) -> Result<S::Ok, S::Error> {
    serde::Serialize::serialize(&v.written(), s)
}

/// The model's sampling defaults.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SamplingDefaults {
    pub temperature: Sourced<f32>,
    pub top_p: Sourced<f32>,
    pub top_k: Sourced<usize>,
    pub min_p: Sourced<f32>,
    pub repetition_penalty: Sourced<f32>,
}

impl Default for SamplingDefaults {
    fn default() -> Self {
        let p = SamplingParams::default();
        let shoal = |v| Sourced {
            value: v,
            source: SHOAL_DEFAULT.to_string(),
        };
        SamplingDefaults {
            temperature: shoal(p.temperature),
            top_p: shoal(p.top_p),
            top_k: Sourced {
                value: p.top_k,
                source: SHOAL_DEFAULT.to_string(),
            },
            min_p: shoal(p.min_p),
            repetition_penalty: shoal(p.repetition_penalty),
        }
    }
}

impl SamplingDefaults {
    /// The defaults of the model at `path` (a directory or a GGUF file). A
    /// file that cannot be read gives Shoal's defaults: loading reports it.
    pub fn read(path: &Path) -> Self {
        let mut d = SamplingDefaults::default();
        if path.is_dir() {
            let file = path.join("generation_config.json");
            let Some(cfg) = std::fs::read(&file)
                .ok()
                .and_then(|b| serde_json::from_slice::<Value>(&b).ok())
            else {
                return d;
            };
            let num = |k: &str| cfg.get(k).and_then(Value::as_f64);
            // HF samples only with do_sample; greedy otherwise, whatever the temperature.
            let greedy = cfg.get("do_sample").and_then(Value::as_bool) == Some(false);
            let src = "generation_config.json";
            d.set_f32(
                |d| &mut d.temperature,
                if greedy {
                    Some(0.0)
                } else {
                    num("temperature")
                },
                src,
            );
            d.set_f32(|d| &mut d.top_p, num("top_p"), src);
            d.set_f32(|d| &mut d.min_p, num("min_p"), src);
            d.set_f32(
                |d| &mut d.repetition_penalty,
                num("repetition_penalty"),
                src,
            );
            d.set_top_k(num("top_k"), src);
        } else if let Ok(h) = shoal_gguf::Header::read(path) {
            let family = |k: &str| h.string(k).map(str::to_ascii_lowercase);
            let (org, base) = (family("general.organization"), family("general.basename"));
            if let Some(card) = CARDS.iter().find(|c| {
                org.as_deref() == Some(&c.organization.to_ascii_lowercase())
                    && base.as_deref() == Some(c.basename)
            }) {
                d.set_f32(
                    |d| &mut d.temperature,
                    Some(card.temperature.into()),
                    card.source,
                );
                d.set_f32(|d| &mut d.top_p, Some(card.top_p.into()), card.source);
            }
            let key = |k: &str| {
                let full = format!("general.sampling.{k}");
                h.float(&full).map(|v| (v, full))
            };
            if let Some((v, src)) = key("temp") {
                d.set_f32(|d| &mut d.temperature, Some(v), &src);
            }
            if let Some((v, src)) = key("top_p") {
                d.set_f32(|d| &mut d.top_p, Some(v), &src);
            }
            if let Some((v, src)) = key("min_p") {
                d.set_f32(|d| &mut d.min_p, Some(v), &src);
            }
            if let Some((v, src)) = key("penalty_repeat") {
                d.set_f32(|d| &mut d.repetition_penalty, Some(v), &src);
            }
            if let Some((v, src)) = key("top_k") {
                d.set_top_k(Some(v), &src);
            }
        }
        d
    }

    /// Sets a float default if `v` is a usable value for it.
    fn set_f32(
        &mut self,
        field: impl Fn(&mut Self) -> &mut Sourced<f32>,
        v: Option<f64>,
        source: &str,
    ) {
        if let Some(v) = v.filter(|v| v.is_finite() && *v >= 0.0) {
            *field(self) = Sourced {
                value: v as f32,
                source: source.to_string(),
            };
        }
    }

    fn set_top_k(&mut self, v: Option<f64>, source: &str) {
        if let Some(v) = v.filter(|v| v.is_finite() && *v >= 0.0) {
            self.top_k = Sourced {
                value: v as usize,
                source: source.to_string(),
            };
        }
    }

    /// The engine's parameters for a request that sets none of these.
    pub fn params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature.value,
            top_p: self.top_p.value.clamp(f32::MIN_POSITIVE, 1.0),
            top_k: self.top_k.value,
            min_p: self.min_p.value.min(1.0),
            repetition_penalty: self.repetition_penalty.value.max(f32::MIN_POSITIVE),
            ..SamplingParams::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shoal_gguf::testing::{write_gguf, MetaValue};

    fn dir(name: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("shoal-defaults-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    }

    #[test]
    fn generation_config_sets_what_it_names_and_nothing_else() {
        let d = dir("hf");
        std::fs::write(
            d.join("generation_config.json"),
            r#"{"do_sample": true, "temperature": 0.2, "top_p": 0.9, "top_k": 20,
                "repetition_penalty": 1.05, "max_new_tokens": 512}"#,
        )
        .expect("write");
        let s = SamplingDefaults::read(&d);
        assert_eq!(
            (s.temperature.value, s.temperature.source.as_str()),
            (0.2, "generation_config.json")
        );
        assert_eq!(s.top_p.value, 0.9);
        assert_eq!(s.top_k.value, 20);
        assert_eq!(s.repetition_penalty.value, 1.05);
        assert_eq!(
            (s.min_p.value, s.min_p.source.as_str()),
            (0.0, SHOAL_DEFAULT)
        );
        let p = s.params();
        assert_eq!((p.temperature, p.top_p, p.top_k), (0.2, 0.9, 20));
        // do_sample false means greedy, whatever the temperature says.
        std::fs::write(
            d.join("generation_config.json"),
            r#"{"do_sample": false, "temperature": 0.7}"#,
        )
        .expect("write");
        assert_eq!(SamplingDefaults::read(&d).temperature.value, 0.0);
        // No file, or a broken one: Shoal's defaults.
        std::fs::write(d.join("generation_config.json"), "{not json").expect("write");
        assert_eq!(SamplingDefaults::read(&d), SamplingDefaults::default());
    }

    #[test]
    fn gguf_sampling_keys_are_read_with_their_names() {
        let d = dir("gguf");
        let p = write_gguf(
            &d.join("m.gguf"),
            &[
                ("general.architecture", MetaValue::Str("llama")),
                ("general.sampling.temp", MetaValue::F32(0.3)),
                ("general.sampling.top_k", MetaValue::U32(40)),
            ],
        );
        let s = SamplingDefaults::read(&p);
        assert_eq!(s.temperature.value, 0.3);
        assert_eq!(s.temperature.source, "general.sampling.temp");
        assert_eq!(
            (s.top_k.value, s.top_k.source.as_str()),
            (40, "general.sampling.top_k")
        );
        assert_eq!(s.top_p.source, SHOAL_DEFAULT);
    }

    #[test]
    fn a_family_whose_card_recommends_settings_gets_them_unless_the_file_says_otherwise() {
        let d = dir("card");
        let write = |name: &str, meta: &[(&str, MetaValue)]| write_gguf(&d.join(name), meta);
        let smol = [
            ("general.architecture", MetaValue::Str("llama")),
            ("general.organization", MetaValue::Str("HuggingFaceTB")),
            ("general.basename", MetaValue::Str("SmolLM2")),
        ];
        let s = SamplingDefaults::read(&write("smol.gguf", &smol));
        let card = "model card (HuggingFaceTB/SmolLM2)";
        assert_eq!(
            (s.temperature.value, s.temperature.source.as_str()),
            (0.2, card)
        );
        assert_eq!((s.top_p.value, s.top_p.source.as_str()), (0.9, card));
        assert_eq!(s.top_k.source, SHOAL_DEFAULT);
        // The file's own key wins over the card.
        let own = [
            ("general.architecture", MetaValue::Str("llama")),
            ("general.organization", MetaValue::Str("HuggingFaceTB")),
            ("general.basename", MetaValue::Str("SmolLM2")),
            ("general.sampling.temp", MetaValue::F32(0.6)),
        ];
        let s = SamplingDefaults::read(&write("own.gguf", &own));
        assert_eq!(s.temperature.value, 0.6);
        assert_eq!(s.temperature.source, "general.sampling.temp");
        assert_eq!(s.top_p.source, card);
        // Another organization's file of the same name is not the family.
        let other = [
            ("general.architecture", MetaValue::Str("llama")),
            ("general.organization", MetaValue::Str("Someone")),
            ("general.basename", MetaValue::Str("smollm2")),
        ];
        let s = SamplingDefaults::read(&write("other.gguf", &other));
        assert_eq!(s, SamplingDefaults::default());
    }
}
