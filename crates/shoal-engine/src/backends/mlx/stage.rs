//! Which weights a pipeline stage keeps. One rule for every file format:
//! each format only says which part of the model a tensor name belongs to.
use std::ops::Range;

/// The part of a model a weight belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Part {
    Embedding,
    Block(usize),
    FinalNorm,
    Output,
    /// Anything else (e.g. rope frequencies): every stage keeps it.
    Other,
}

/// A stage running `layers` of a model of `num_layers`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Span {
    pub layers: Range<usize>,
    pub num_layers: usize,
    /// The output projection is the embedding table.
    pub tied_output: bool,
}

impl Span {
    pub fn first(&self) -> bool {
        self.layers.start == 0
    }

    pub fn last(&self) -> bool {
        self.layers.end == self.num_layers
    }

    /// The embedding table: the first stage embeds tokens, the last uses
    /// it as a tied output projection.
    pub fn needs_embedding(&self) -> bool {
        self.first() || (self.last() && self.tied_output)
    }

    pub fn keeps(&self, part: Part) -> bool {
        match part {
            Part::Embedding => self.needs_embedding(),
            Part::FinalNorm | Part::Output => self.last(),
            Part::Block(i) => self.layers.contains(&i),
            Part::Other => true,
        }
    }
}

/// How a file format names the parts: the block prefix (followed by the
/// block number and a dot) and the prefixes of the other named parts.
struct Naming {
    block: &'static str,
    parts: [(&'static str, Part); 3],
}

const HF: Naming = Naming {
    block: "model.layers.",
    parts: [
        ("model.embed_tokens.", Part::Embedding),
        ("model.norm.", Part::FinalNorm),
        ("lm_head.", Part::Output),
    ],
};

const GGUF: Naming = Naming {
    block: "blk.",
    parts: [
        ("token_embd.", Part::Embedding),
        ("output_norm.", Part::FinalNorm),
        ("output.", Part::Output),
    ],
};

fn part(name: &str, naming: &Naming) -> Part {
    let block = name
        .strip_prefix(naming.block)
        .and_then(|rest| rest.split('.').next()?.parse().ok());
    if let Some(i) = block {
        return Part::Block(i);
    }
    naming
        .parts
        .iter()
        .find(|(prefix, _)| name.starts_with(prefix))
        .map_or(Part::Other, |&(_, part)| part)
}

/// Hugging Face / MLX names (`model.layers.N.…`).
pub fn hf_part(name: &str) -> Part {
    part(name, &HF)
}

/// llama.cpp GGUF names (`blk.N.…`).
pub fn gguf_part(name: &str) -> Part {
    part(name, &GGUF)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(layers: Range<usize>, tied_output: bool) -> Span {
        Span {
            layers,
            num_layers: 30,
            tied_output,
        }
    }

    #[test]
    fn names_map_to_the_same_parts_in_both_formats() {
        for (hf, gguf, part) in [
            (
                "model.embed_tokens.weight",
                "token_embd.weight",
                Part::Embedding,
            ),
            (
                "model.layers.12.mlp.up_proj.weight",
                "blk.12.ffn_up.weight",
                Part::Block(12),
            ),
            ("model.norm.weight", "output_norm.weight", Part::FinalNorm),
            ("lm_head.weight", "output.weight", Part::Output),
            (
                "model.rotary_emb.inv_freq",
                "rope_freqs.weight",
                Part::Other,
            ),
        ] {
            assert_eq!(hf_part(hf), part, "{hf}");
            assert_eq!(gguf_part(gguf), part, "{gguf}");
        }
    }

    #[test]
    fn each_stage_keeps_its_blocks_and_only_the_ends_it_needs() {
        let (first, middle, last) = (span(0..10, true), span(10..20, true), span(20..30, true));
        assert!(first.keeps(Part::Embedding) && !first.keeps(Part::Output));
        assert!(!middle.keeps(Part::Embedding) && !middle.keeps(Part::FinalNorm));
        assert!(last.keeps(Part::Embedding) && last.keeps(Part::Output));
        assert!(
            !span(20..30, false).keeps(Part::Embedding),
            "untied: no table"
        );
        assert!(middle.keeps(Part::Block(10)) && !middle.keeps(Part::Block(20)));
        assert!([&first, &middle, &last]
            .iter()
            .all(|s| s.keeps(Part::Other)));
        let whole = span(0..30, false);
        assert!(whole.keeps(Part::Embedding) && whole.keeps(Part::Output));
    }
}
