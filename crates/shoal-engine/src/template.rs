//! Chat templates rendered the way Hugging Face `apply_chat_template` renders them, so prompts
//! match what the model saw in training.
use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use minijinja::value::Kwargs;
use minijinja::{Environment, Error, ErrorKind, Value};
use serde::{Deserialize, Serialize};

use crate::error::{EngineError, Result};

const TEMPLATE_NAME: &str = "chat_template";

/// Template instructions one render may run.
const TEMPLATE_FUEL: u64 = 20_000_000;

/// One chat turn as seen by the template (`message['role']`, `message['content']`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    pub content: String,
}

impl ChatMessage {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// How the model writes a call.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolSyntax {
    /// Hermes / Qwen: `<tool_call>\n{"name": …, "arguments": {…}}\n</tool_call>`.
    Hermes,
    /// Llama 3: the reply is one bare `{"name": …, "parameters": {…}}` object.
    Llama3Json,
}

impl ToolSyntax {
    /// Picks the syntax a chat template was trained on; templates without
    /// tool support get Hermes, which the server then explains in the prompt.
    pub fn for_template(source: &str) -> Self {
        if source.contains("<tool_call>") {
            ToolSyntax::Hermes
        } else if source.contains("<|python_tag|>") || source.contains("\"parameters\"") {
            ToolSyntax::Llama3Json
        } else {
            ToolSyntax::Hermes
        }
    }
}

/// A compiled chat template plus the special tokens it may reference.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    source: String,
    caps: Capabilities,
}

/// What a model's chat template can do, decided once when it loads: the
/// server, the CLI and `/v1/models` read these instead of the template text.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Capabilities {
    /// The model has a chat template (a base model may ship none; then only
    /// raw completions work).
    pub chat: bool,
    /// The template has a thinking switch of its own (`enable_thinking`
    /// around a `<think>` section); other models are asked to think by the
    /// server opening the section after the generation prompt.
    pub thinking: bool,
    /// The template lays out an offered `tools` list itself; otherwise the
    /// server describes the tools in a system message.
    pub tools: bool,
    /// How the model writes a tool call.
    pub tool_syntax: ToolSyntax,
    /// Replies come in harmony's channels (gpt-oss): reasoning is the
    /// `analysis` channel, tool calls are `commentary` messages.
    pub harmony: bool,
    /// The template renders a system message's text, in a turn of its own or
    /// folded into the first user turn as Gemma's does (some refuse one with
    /// an exception, some drop it).
    pub system_role: bool,
    /// The model can reason: its template's thinking switch, harmony's
    /// analysis channel, or a `</think>` token of its own vocabulary (the
    /// server then opens the section). A model without any of these
    /// answers a request for reasoning as it would any other.
    pub reasoning: bool,
    /// The model reads images (a GGUF with its projector; set by the
    /// loader, never by the template).
    pub vision: bool,
}

impl Capabilities {
    /// A model without a chat template.
    pub const NONE: Capabilities = Capabilities {
        chat: false,
        thinking: false,
        tools: false,
        tool_syntax: ToolSyntax::Hermes,
        harmony: false,
        system_role: false,
        reasoning: false,
        vision: false,
    };
}

/// Carries the message of `raise_exception` through minijinja so it can be reported verbatim.
#[derive(Debug)]
struct RaisedException(String);

impl std::fmt::Display for RaisedException {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for RaisedException {}

impl ChatTemplate {
    /// The template text.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// What the template can do.
    pub fn capabilities(&self) -> Capabilities {
        self.caps
    }

    /// Compiles `source` with the same whitespace rules and helpers as transformers.
    pub fn new(source: &str, bos_token: Option<String>, eos_token: Option<String>) -> Result<Self> {
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_keep_trailing_newline(false);
        // A hostile template (a model file is untrusted input) must not spin
        // the server: real templates use a tiny fraction of this.
        env.set_fuel(Some(TEMPLATE_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(template_error)?;
        let mut t = Self {
            source: source.to_owned(),
            env,
            bos_token,
            eos_token,
            caps: Capabilities::NONE,
        };
        t.caps = t.probe();
        Ok(t)
    }

    /// Reads the capabilities off the template: its text for the thinking
    /// switch, a `tools` list and the call syntax; a trial render for the
    /// system role, where a template that refuses one raises an exception or
    /// leaves the system text out.
    fn probe(&self) -> Capabilities {
        const MARK: &str = "\u{1}shoal-system-probe\u{1}";
        let trial = [
            ChatMessage::new("system", MARK),
            ChatMessage::new("user", "hi"),
        ];
        let system_role = self
            .render(&trial, true, &serde_json::Map::new())
            .is_ok_and(|text| text.contains(MARK));
        let thinking = self.source.contains("<think>");
        let harmony = self.source.contains("<|channel|>");
        Capabilities {
            chat: true,
            thinking,
            tools: self.source.contains("tools"),
            tool_syntax: ToolSyntax::for_template(&self.source),
            harmony,
            system_role,
            // A vocabulary's `</think>` token is added by the loader's
            // `Vocabulary::capabilities`, which knows the vocabulary.
            reasoning: thinking || harmony,
            vision: false,
        }
    }

    /// Renders the prompt. Keys in `extra` become template variables and may override
    /// `bos_token`/`eos_token`; `messages` and `add_generation_prompt` always come from the
    /// arguments.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        extra: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String> {
        let mut ctx: Vec<(String, Value)> = Vec::with_capacity(extra.len() + 4);
        if let Some(bos) = &self.bos_token {
            ctx.push(("bos_token".into(), Value::from(bos.as_str())));
        }
        if let Some(eos) = &self.eos_token {
            ctx.push(("eos_token".into(), Value::from(eos.as_str())));
        }
        ctx.extend(
            extra
                .iter()
                .map(|(k, v)| (k.clone(), Value::from_serialize(v))),
        );
        ctx.push(("messages".into(), Value::from_serialize(messages)));
        ctx.push((
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        ));
        // Later entries win, giving the precedence documented above.
        let ctx: Value = ctx.into_iter().collect();
        self.env
            .get_template(TEMPLATE_NAME)
            .and_then(|t| t.render(ctx))
            .map_err(template_error)
    }
}

fn template_error(err: Error) -> EngineError {
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(&err);
    while let Some(e) = source {
        if let Some(raised) = e.downcast_ref::<RaisedException>() {
            return EngineError::Template(raised.0.clone());
        }
        source = e.source();
    }
    let mut message = err.to_string();
    let mut cause = std::error::Error::source(&err);
    while let Some(e) = cause {
        let _ = write!(message, ": {e}");
        cause = e.source();
    }
    EngineError::Template(message)
}

/// Templates call this to reject unsupported conversations (e.g. roles out of order).
fn raise_exception(message: String) -> std::result::Result<Value, Error> {
    Err(
        Error::new(ErrorKind::InvalidOperation, "template raised an exception")
            .with_source(RaisedException(message)),
    )
}

/// The current date and time (UTC) formatted like Python's `strftime`; used by templates that
/// put today's date in the system prompt.
fn strftime_now(format: String) -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    strftime_utc(&format, i64::try_from(secs).unwrap_or(i64::MAX))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
];

/// Proleptic Gregorian (year, month 1-12, day 1-31) of a day count since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let shifted_month = (5 * day_of_year + 2) / 153;
    let day = (day_of_year - (153 * shifted_month + 2) / 5 + 1) as u32;
    let month = if shifted_month < 10 {
        shifted_month + 3
    } else {
        shifted_month - 9
    } as u32;
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

fn is_leap(year: i64) -> bool {
    (year % 4 == 0 && year % 100 != 0) || year % 400 == 0
}

fn day_of_year(year: i64, month: u32, day: u32) -> u32 {
    const BEFORE: [u32; 12] = [0, 31, 59, 90, 120, 151, 181, 212, 243, 273, 304, 334];
    let leap = u32::from(month > 2 && is_leap(year));
    BEFORE[(month - 1) as usize] + day + leap
}

/// A subset of C `strftime` for UTC timestamps, including the glibc `%-d` no-padding flag.
/// Unknown directives are copied through, as glibc does.
pub fn strftime_utc(format: &str, unix_secs: i64) -> String {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (
        secs_of_day / 3600,
        secs_of_day % 3600 / 60,
        secs_of_day % 60,
    );
    let weekday = (days + 4).rem_euclid(7) as usize;
    let month_name = MONTHS[(month - 1) as usize];
    let hour12 = match hour % 12 {
        0 => 12,
        h => h,
    };

    let mut out = String::with_capacity(format.len() + 16);
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let mut spec = chars.next();
        let pad = spec != Some('-');
        if !pad {
            spec = chars.next();
        }
        let num = |out: &mut String, value: i64, width: usize| {
            let _ = if pad {
                write!(out, "{value:0width$}")
            } else {
                write!(out, "{value}")
            };
        };
        match spec {
            Some('Y') => num(&mut out, year, 4),
            Some('y') => num(&mut out, year.rem_euclid(100), 2),
            Some('m') => num(&mut out, i64::from(month), 2),
            Some('d') => num(&mut out, i64::from(day), 2),
            Some('e') => {
                let _ = write!(out, "{day:>2}");
            }
            Some('j') => num(&mut out, i64::from(day_of_year(year, month, day)), 3),
            Some('H') => num(&mut out, hour, 2),
            Some('I') => num(&mut out, hour12, 2),
            Some('M') => num(&mut out, minute, 2),
            Some('S') => num(&mut out, second, 2),
            Some('p') => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            Some('B') => out.push_str(month_name),
            Some('b') | Some('h') => out.push_str(&month_name[..3]),
            Some('A') => out.push_str(WEEKDAYS[weekday]),
            Some('a') => out.push_str(&WEEKDAYS[weekday][..3]),
            Some('w') => num(&mut out, weekday as i64, 1),
            Some('F') => {
                let _ = write!(out, "{year:04}-{month:02}-{day:02}");
            }
            Some('T') => {
                let _ = write!(out, "{hour:02}:{minute:02}:{second:02}");
            }
            Some('Z') => out.push_str("UTC"),
            Some('z') => out.push_str("+0000"),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
                out.push(other);
            }
            None => {
                out.push('%');
                if !pad {
                    out.push('-');
                }
            }
        }
    }
    out
}

/// Python `json.dumps` layout (`", "`/`": "` separators, `indent`, `sort_keys`,
/// `ensure_ascii`) as transformers' `tojson` produces it; minijinja's built-in filter is compact
/// and HTML-escapes `<`, which would change tool prompts.
fn tojson(value: &Value, kwargs: Kwargs) -> std::result::Result<Value, Error> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let separators: Option<Vec<String>> = kwargs.get("separators")?;
    kwargs.assert_all_used()?;

    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => match v.as_str() {
            Some(s) => Some(s.to_owned()),
            None => Some(" ".repeat(usize::try_from(v)?)),
        },
    };
    let (item_sep, key_sep) = match separators.as_deref() {
        Some([item, key]) => (item.clone(), key.clone()),
        Some(_) => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                "tojson separators must be a pair of strings",
            ))
        }
        None if indent.is_some() => (",".to_owned(), ": ".to_owned()),
        None => (", ".to_owned(), ": ".to_owned()),
    };
    let json = serde_json::to_value(value).map_err(|e| {
        Error::new(ErrorKind::InvalidOperation, "cannot serialize to JSON").with_source(e)
    })?;
    let mut out = String::new();
    let style = JsonStyle {
        indent: indent.as_deref(),
        item_sep: &item_sep,
        key_sep: &key_sep,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    style.write(&mut out, &json, 0);
    Ok(Value::from_safe_string(out))
}

struct JsonStyle<'a> {
    indent: Option<&'a str>,
    item_sep: &'a str,
    key_sep: &'a str,
    sort_keys: bool,
    ensure_ascii: bool,
}

impl JsonStyle<'_> {
    fn newline(&self, out: &mut String, depth: usize) {
        if let Some(indent) = self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(indent);
            }
        }
    }

    fn write(&self, out: &mut String, value: &serde_json::Value, depth: usize) {
        use serde_json::Value as J;
        match value {
            J::Array(items) if items.is_empty() => out.push_str("[]"),
            J::Object(map) if map.is_empty() => out.push_str("{}"),
            J::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push(']');
            }
            J::Object(map) => {
                let mut entries: Vec<_> = map.iter().collect();
                if self.sort_keys {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (key, item)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(self.item_sep);
                    }
                    self.newline(out, depth + 1);
                    self.write_str(out, key);
                    out.push_str(self.key_sep);
                    self.write(out, item, depth + 1);
                }
                self.newline(out, depth);
                out.push('}');
            }
            J::String(s) => self.write_str(out, s),
            scalar => out.push_str(&scalar.to_string()),
        }
    }

    fn write_str(&self, out: &mut String, s: &str) {
        out.push('"');
        for c in s.chars() {
            match c {
                '"' => out.push_str("\\\""),
                '\\' => out.push_str("\\\\"),
                '\n' => out.push_str("\\n"),
                '\r' => out.push_str("\\r"),
                '\t' => out.push_str("\\t"),
                '\u{08}' => out.push_str("\\b"),
                '\u{0c}' => out.push_str("\\f"),
                c if (c as u32) < 0x20 || (self.ensure_ascii && !c.is_ascii()) => {
                    let mut units = [0u16; 2];
                    for unit in c.encode_utf16(&mut units) {
                        let _ = write!(out, "\\u{unit:04x}");
                    }
                }
                c => out.push(c),
            }
        }
        out.push('"');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::testdata::load_gguf;

    fn no_extra() -> serde_json::Map<String, serde_json::Value> {
        serde_json::Map::new()
    }

    fn extra(json: serde_json::Value) -> serde_json::Map<String, serde_json::Value> {
        match json {
            serde_json::Value::Object(map) => map,
            other => panic!("extra must be an object, got {other}"),
        }
    }

    fn caps(source: &str) -> Capabilities {
        ChatTemplate::new(source, None, None)
            .expect("template compiles")
            .capabilities()
    }

    #[test]
    fn capabilities_are_read_once_from_the_template() {
        let plain = caps("{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}");
        assert!(plain.chat && plain.system_role);
        assert!(!plain.thinking && !plain.tools);
        assert_eq!(plain.tool_syntax, ToolSyntax::Hermes);
        // A template that refuses the system role, and one that drops it.
        let refuses = caps(
            "{% for m in messages %}{% if m.role == 'system' %}\
             {{ raise_exception('System role not supported') }}{% endif %}\
             {{ m.content }}{% endfor %}",
        );
        assert!(refuses.chat && !refuses.system_role);
        let drops = caps("{% for m in messages %}{% if m.role != 'system' %}{{ m.content }}{% endif %}{% endfor %}");
        assert!(!drops.system_role);
        // Thinking switch, a tools list, and the Llama 3 call syntax.
        let rich = caps(
            "{% if tools %}{{ tools | tojson }}<|python_tag|>{% endif %}\
             {% if enable_thinking %}<think>{% endif %}\
             {% for m in messages %}{{ m.content }}{% endfor %}",
        );
        assert!(rich.thinking && rich.tools && rich.system_role && rich.reasoning);
        assert!(
            !plain.reasoning,
            "no switch: reasoning only with a </think> token"
        );
        assert_eq!(rich.tool_syntax, ToolSyntax::Llama3Json);
        // The default model: ChatML with a system turn and Hermes-style calls.
        let smol = smollm_template().capabilities();
        assert!(smol.chat && smol.system_role && !smol.thinking);
        assert_eq!(smol.tool_syntax, ToolSyntax::Hermes);
    }

    fn smollm_template() -> ChatTemplate {
        let source = load_gguf()
            .get_metadata_string("tokenizer.chat_template")
            .expect("read metadata")
            .expect("GGUF has tokenizer.chat_template");
        ChatTemplate::new(
            &source,
            Some("<|im_start|>".into()),
            Some("<|im_end|>".into()),
        )
        .unwrap()
    }

    #[test]
    fn chatml_inserts_default_system_prompt() {
        let rendered = smollm_template()
            .render(&[ChatMessage::new("user", "Hi there")], true, &no_extra())
            .unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n\
             <|im_start|>assistant\n"
        );
    }

    #[test]
    fn chatml_honours_custom_system_and_generation_flag() {
        let messages = [
            ChatMessage::new("system", "Be terse."),
            ChatMessage::new("user", "2+2?"),
            ChatMessage::new("assistant", "4"),
        ];
        let rendered = smollm_template()
            .render(&messages, false, &no_extra())
            .unwrap();
        assert_eq!(
            rendered,
            "<|im_start|>system\nBe terse.<|im_end|>\n\
             <|im_start|>user\n2+2?<|im_end|>\n\
             <|im_start|>assistant\n4<|im_end|>\n"
        );
    }

    const LLAMA3: &str = "{{- bos_token }}\n\
        {%- if not date_string is defined %}{%- set date_string = strftime_now('%d %b %Y') %}{%- endif %}\n\
        {{- '<|start_header_id|>system<|end_header_id|>\\n\\nToday Date: ' + date_string + '<|eot_id|>' }}\n\
        {%- for message in messages %}\n\
            {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' + message['content'] | trim + '<|eot_id|>' }}\n\
        {%- endfor %}\n\
        {%- if add_generation_prompt %}\n\
            {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n\
        {%- endif %}\n";

    #[test]
    fn llama3_style_template() {
        let template = ChatTemplate::new(LLAMA3, Some("<|begin_of_text|>".into()), None).unwrap();
        let messages = [ChatMessage::new("user", "  Hello!\n")];
        let rendered = template
            .render(
                &messages,
                true,
                &extra(serde_json::json!({"date_string": "26 Jul 2024"})),
            )
            .unwrap();
        assert_eq!(
            rendered,
            "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nToday Date: 26 Jul 2024<|eot_id|>\
             <|start_header_id|>user<|end_header_id|>\n\nHello!<|eot_id|>\
             <|start_header_id|>assistant<|end_header_id|>\n\n"
        );

        let dated = template.render(&messages, false, &no_extra()).unwrap();
        let date = dated
            .split("Today Date: ")
            .nth(1)
            .and_then(|rest| rest.split('<').next())
            .unwrap();
        let parts: Vec<&str> = date.split(' ').collect();
        assert_eq!(parts.len(), 3, "{date:?}");
        assert!(parts[0].len() == 2 && parts[0].chars().all(|c| c.is_ascii_digit()));
        assert!(MONTHS.iter().any(|m| &m[..3] == parts[1]), "{date:?}");
        assert!(parts[2].len() == 4 && parts[2].starts_with("20"));
    }

    const QWEN3: &str = "{%- for message in messages %}\
        {{- '<|im_start|>' + message.role + '\\n' + message.content.strip() + '<|im_end|>\\n' }}\
        {%- endfor %}\
        {%- if add_generation_prompt %}\
            {{- '<|im_start|>assistant\\n' }}\
            {%- if enable_thinking is defined and enable_thinking is false %}\
                {{- '<think>\\n\\n</think>\\n\\n' }}\
            {%- endif %}\
        {%- endif %}";

    #[test]
    fn qwen_style_enable_thinking() {
        let template = ChatTemplate::new(QWEN3, None, Some("<|im_end|>".into())).unwrap();
        let messages = [ChatMessage::new("user", " Why? ")];
        let thinking = template.render(&messages, true, &no_extra()).unwrap();
        assert_eq!(
            thinking,
            "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n"
        );
        let quiet = template
            .render(
                &messages,
                true,
                &extra(serde_json::json!({"enable_thinking": false})),
            )
            .unwrap();
        assert_eq!(
            quiet,
            "<|im_start|>user\nWhy?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"
        );
    }

    #[test]
    fn raise_exception_surfaces_message() {
        let template = ChatTemplate::new(
            "{% if messages[0]['role'] != 'user' %}{{ raise_exception('Conversation must start with user') }}{% endif %}ok",
            None,
            None,
        )
        .unwrap();
        let err = template
            .render(&[ChatMessage::new("assistant", "x")], false, &no_extra())
            .unwrap_err();
        assert!(
            matches!(&err, EngineError::Template(m) if m == "Conversation must start with user"),
            "{err:?}"
        );
        assert_eq!(
            template
                .render(&[ChatMessage::new("user", "x")], false, &no_extra())
                .unwrap(),
            "ok"
        );
    }

    #[test]
    fn syntax_and_runtime_errors_are_template_errors() {
        assert!(matches!(
            ChatTemplate::new("{% for %}", None, None),
            Err(EngineError::Template(_))
        ));
        let template = ChatTemplate::new("{{ missing.attr }}", None, None).unwrap();
        assert!(matches!(
            template.render(&[], false, &no_extra()),
            Err(EngineError::Template(_))
        ));
    }

    #[test]
    fn whitespace_control_matches_transformers() {
        let template = ChatTemplate::new(
            "{% for m in messages %}\n    {% if m.role == 'user' %}\n[{{ m.content }}]\n    {% endif %}\n{% endfor %}\n",
            None,
            None,
        )
        .unwrap();
        let rendered = template
            .render(
                &[ChatMessage::new("user", "a"), ChatMessage::new("user", "b")],
                false,
                &no_extra(),
            )
            .unwrap();
        assert_eq!(rendered, "[a]\n[b]\n");
    }

    #[test]
    fn tojson_uses_python_layout_and_key_order() {
        let template = ChatTemplate::new(
            "{{ tools | tojson }}|{{ tools[0] | tojson(indent=2) }}|{{ tools[0] | tojson(sort_keys=true) }}",
            None,
            None,
        )
        .unwrap();
        let tools =
            serde_json::json!({"tools": [{"name": "f", "about": "a<b & 'c' é", "args": [1, 2.5]}]});
        let rendered = template.render(&[], false, &extra(tools)).unwrap();
        assert_eq!(
            rendered,
            "[{\"name\": \"f\", \"about\": \"a<b & 'c' é\", \"args\": [1, 2.5]}]|\
             {\n  \"name\": \"f\",\n  \"about\": \"a<b & 'c' é\",\n  \"args\": [\n    1,\n    2.5\n  ]\n}|\
             {\"about\": \"a<b & 'c' é\", \"args\": [1, 2.5], \"name\": \"f\"}"
        );
    }

    #[test]
    fn pycompat_string_methods() {
        let template = ChatTemplate::new(
            "{{ messages[0].content.split(',') | join('|') }} {{ messages[0].content.startswith('a') }} {{ messages[0].content.upper() }}",
            None,
            None,
        )
        .unwrap();
        let rendered = template
            .render(&[ChatMessage::new("user", "a,b,c")], false, &no_extra())
            .unwrap();
        // Booleans print the Python way, as in transformers.
        assert_eq!(rendered, "a|b|c True A,B,C");
    }

    #[test]
    fn strftime_formats_known_instant() {
        // 2024-02-29T13:05:09Z, a Thursday.
        let t = 1_709_211_909;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2024-02-29 13:05:09");
        assert_eq!(strftime_utc("%d %b %Y", t), "29 Feb 2024");
        assert_eq!(
            strftime_utc("%A %B %-d, %I %p %j %%", t),
            "Thursday February 29, 01 PM 060 %"
        );
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        assert_eq!(strftime_utc("%-d %q", 0), "1 %q");
    }
}
