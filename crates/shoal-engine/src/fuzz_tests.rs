//! Structured fuzzing of the parts that see untrusted text: stop sequences,
//! the tool-call parser, the incremental detokenizer and the chat-template
//! renderer (a model file's template is untrusted too). Properties, not
//! just "no panic": what streams out equals what a one-shot computation
//! gives. `PROPTEST_CASES` sets the number of cases (`make fuzz` runs many);
//! failures proptest finds are kept in `proptest-regressions/` and replayed
//! first on every run.
use proptest::prelude::*;

use crate::detok::IncrementalDecoder;
use crate::stop::StopMatcher;
use crate::template::{ChatMessage, ChatTemplate};
use crate::tools::{ToolOut, ToolParser, ToolSyntax};

/// Text from a small alphabet (with multi-byte characters) so stop
/// sequences and markers actually occur.
fn text(max: usize) -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "é", "😀", "\n", " ", "<", ">", "ab"]),
        0..max,
    )
    .prop_map(|v| v.concat())
}

/// `text` cut into pieces at arbitrary character boundaries.
fn chunks(s: &str, cuts: &[usize]) -> Vec<String> {
    let chars: Vec<char> = s.chars().collect();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (chars.len() + 1)).collect();
    points.push(0);
    points.push(chars.len());
    points.sort_unstable();
    points.dedup();
    points
        .windows(2)
        .map(|w| chars[w[0]..w[1]].iter().collect())
        .collect()
}

proptest! {
    #[test]
    fn stop_matcher_streams_what_a_one_shot_search_finds(
        stops in prop::collection::vec(text(4), 0..4),
        full in text(40),
        cuts in prop::collection::vec(any::<usize>(), 0..12),
    ) {
        let mut m = StopMatcher::new(stops.clone());
        let mut out = String::new();
        let mut matched = None;
        for piece in chunks(&full, &cuts) {
            let step = m.push(&piece);
            out.push_str(&step.emit);
            if step.matched.is_some() {
                matched = step.matched;
                break;
            }
        }
        if matched.is_none() {
            let last = m.flush();
            out.push_str(&last.emit);
            matched = last.matched;
        }
        let earliest = stops
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| full.find(s.as_str()))
            .min();
        match earliest {
            Some(at) => {
                prop_assert_eq!(&out, &full[..at]);
                let i = matched.expect("a stop sequence occurs but none matched");
                prop_assert!(full[at..].starts_with(stops[i].as_str()));
            }
            None => {
                prop_assert_eq!(&out, &full);
                prop_assert!(matched.is_none());
            }
        }
    }

    #[test]
    fn tool_parser_gives_the_same_calls_however_the_text_is_cut(
        name in "[a-z_]{1,8}",
        arg in "[a-zA-Z0-9 é]{0,12}",
        before in text(10),
        after in text(10),
        hermes in any::<bool>(),
        cuts in prop::collection::vec(any::<usize>(), 0..10),
    ) {
        let pick = || if hermes { ToolSyntax::Hermes } else { ToolSyntax::Llama3Json };
        let call = pick().render_call(&name, &serde_json::json!({"q": arg}));
        let reply = if hermes { format!("{before}{call}{after}") } else { call.clone() };
        let run = |pieces: Vec<String>| {
            let mut p = ToolParser::new(pick());
            let mut out = Vec::new();
            for piece in pieces {
                out.extend(p.push(&piece));
            }
            out.extend(p.finish());
            out
        };
        let summary = |outs: Vec<ToolOut>| {
            let mut text = String::new();
            let mut calls: Vec<(String, String)> = Vec::new();
            for o in outs {
                match o {
                    ToolOut::Text(t) => text.push_str(&t),
                    ToolOut::Start { name, .. } => calls.push((name, String::new())),
                    ToolOut::Args { index, delta } => calls[index].1.push_str(&delta),
                }
            }
            (text, calls)
        };
        let whole = summary(run(vec![reply.clone()]));
        let cut = summary(run(chunks(&reply, &cuts)));
        prop_assert_eq!(&cut, &whole);
        prop_assert_eq!(whole.1.len(), 1, "the call was not found in {:?}", reply);
        prop_assert_eq!(&whole.1[0].0, &name);
        let args: serde_json::Value = serde_json::from_str(&whole.1[0].1).expect("arguments are JSON");
        prop_assert_eq!(&args["q"], &serde_json::json!(arg));
    }

    #[test]
    fn tool_parser_survives_any_text(
        pieces in prop::collection::vec(
            prop::sample::select(vec![
                "<tool_call>", "</tool_call>", "{", "}", "\"name\"", ":", "\"", "\\", ",",
                "\"arguments\"", "\"parameters\"", "x", " ", "\n", "é", "<tool", "_call>",
            ]),
            0..30,
        ),
        hermes in any::<bool>(),
    ) {
        let syntax = if hermes { ToolSyntax::Hermes } else { ToolSyntax::Llama3Json };
        let mut p = ToolParser::new(syntax);
        let mut starts = 0;
        let mut outs = Vec::new();
        for piece in &pieces {
            outs.extend(p.push(piece));
        }
        outs.extend(p.finish());
        for o in &outs {
            match o {
                ToolOut::Start { index, .. } => {
                    prop_assert_eq!(*index, starts);
                    starts += 1;
                }
                ToolOut::Args { index, .. } => prop_assert!(*index < starts),
                ToolOut::Text(_) => {}
            }
        }
        prop_assert_eq!(p.calls(), starts);
    }

    #[test]
    fn detokenizer_streams_what_a_whole_decode_gives(
        ids in prop::collection::vec(0u32..49152, 0..40),
        skip_special in any::<bool>(),
    ) {
        static TOK: std::sync::OnceLock<tokenizers::Tokenizer> = std::sync::OnceLock::new();
        let tok = TOK.get_or_init(crate::tokenizer::testdata::gguf_tokenizer);
        let mut d = IncrementalDecoder::new(skip_special);
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&d.push(tok, id).expect("push"));
        }
        out.push_str(&d.flush(tok).expect("flush"));
        let whole = tok.decode(&ids, skip_special).expect("decode");
        prop_assert_eq!(out, whole);
    }

    #[test]
    fn templates_render_or_fail_cleanly(
        parts in prop::collection::vec(
            prop::sample::select(vec![
                "{% for m in messages %}", "{% endfor %}", "{{ m.content }}", "{{ m['role'] }}",
                "{% if add_generation_prompt %}", "{% endif %}", "{% else %}", "{{", "}}", "{%",
                "%}", "{{ raise_exception('no') }}", "{{ messages[0].content|tojson }}",
                "{% for i in range(1000) %}{% for j in range(1000) %}x{% endfor %}{% endfor %}",
                "{{ 'x' * 100000 }}", "{% set n = namespace(a=1) %}", "{{ n.a }}", "{{ loop.index }}",
                "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}", "text", "\n", "{# c #}",
                "{{ bos_token }}", "{{ strftime_now('%Y') }}", "{{ messages|length }}",
            ]),
            0..12,
        ),
        contents in prop::collection::vec(text(12), 0..4),
        generation in any::<bool>(),
    ) {
        let source = parts.concat();
        let Ok(t) = ChatTemplate::new(&source, Some("<s>".into()), Some("</s>".into())) else {
            return Ok(());
        };
        let messages: Vec<ChatMessage> = contents
            .iter()
            .enumerate()
            .map(|(i, c)| ChatMessage::new(if i % 2 == 0 { "user" } else { "assistant" }, c.clone()))
            .collect();
        // Ok or Err both do; fuel bounds the work (see the test below).
        let _ = t.render(&messages, generation, &serde_json::Map::new());
    }
}

/// Templates that would run for hours or recurse without end stop with an
/// error instead.
#[test]
fn hostile_templates_end_with_an_error() {
    for source in [
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "{% macro f(x) %}{{ f(x) }}{% endmacro %}{{ f(1) }}",
    ] {
        let t = ChatTemplate::new(source, None, None).expect("compiles");
        let err = t.render(&[], true, &serde_json::Map::new());
        assert!(err.is_err(), "{source} rendered");
    }
}
