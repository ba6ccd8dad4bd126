//! Which API a target speaks: the dialect's identity (its names and its
//! endpoint), and the module that speaks it ([`crate::wire`]).
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::metadata::ProviderMeta;
use crate::wire::{self, Wire};

/// The API a target speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// OpenAI Chat Completions.
    Chat,
    /// OpenAI (legacy) Completions.
    Completions,
    /// OpenAI Responses.
    Responses,
    /// Anthropic Messages.
    Messages,
    /// Ollama's `/api/chat`.
    Ollama,
}

impl Dialect {
    /// Every dialect.
    pub const ALL: [Dialect; 5] = [
        Dialect::Chat,
        Dialect::Completions,
        Dialect::Responses,
        Dialect::Messages,
        Dialect::Ollama,
    ];

    /// The module that speaks it.
    pub(crate) fn wire(self) -> &'static dyn Wire {
        match self {
            Dialect::Chat => &wire::chat::CHAT,
            Dialect::Completions => &wire::completions::COMPLETIONS,
            Dialect::Responses => &wire::responses::Responses,
            Dialect::Messages => &wire::messages::Messages,
            Dialect::Ollama => &wire::ollama::Ollama,
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Dialect::ALL.into_iter().find(|d| d.name() == s)
    }

    /// Its short name, the name a server's usage ledger, metrics and logs
    /// give it, and its endpoint's path: the dialect's identity, in one
    /// table here rather than once in every wire module.
    fn names(self) -> (&'static str, &'static str, &'static str) {
        match self {
            Dialect::Chat => ("chat", "openai.chat", "/v1/chat/completions"),
            Dialect::Completions => ("completions", "openai.completions", "/v1/completions"),
            Dialect::Responses => ("responses", "openai.responses", "/v1/responses"),
            Dialect::Messages => ("messages", "anthropic.messages", "/v1/messages"),
            Dialect::Ollama => ("ollama", "ollama", "/api/chat"),
        }
    }

    /// Its short name (`chat`, `messages`, `ollama` …).
    pub fn name(self) -> &'static str {
        self.names().0
    }

    /// The name a server's usage ledger, metrics and logs give the dialect.
    pub fn ledger_name(self) -> &'static str {
        self.names().1
    }

    /// Its endpoint's path (`/v1/chat/completions`).
    pub(crate) fn path(self) -> &'static str {
        self.names().2
    }

    /// The dialect a server's ledger name stands for.
    pub fn for_ledger_name(name: &str) -> Option<Self> {
        Dialect::ALL.into_iter().find(|d| d.ledger_name() == name)
    }

    /// The dialect a request path belongs to (`/v1/messages/count_tokens`
    /// is Anthropic's too); `None` for paths of no dialect.
    pub fn for_path(path: &str) -> Option<Self> {
        Dialect::ALL.into_iter().find(|d| {
            let own = d.path();
            path.strip_prefix(own)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
        })
    }

    /// Whether a request may ask for several choices (`n`).
    pub fn has_choices(self) -> bool {
        self.wire().has_choices()
    }

    /// Reads a usage object in this dialect's field names onto the typed
    /// capture; fields not reported stay `None`.
    pub fn read_usage(self, u: &Value, m: &mut ProviderMeta) {
        self.wire().read_usage(u, m);
    }
}

#[cfg(test)]
mod tests {
    use super::Dialect;

    #[test]
    fn a_request_path_names_its_dialect() {
        let cases = [
            ("/v1/chat/completions", Some(Dialect::Chat)),
            ("/v1/completions", Some(Dialect::Completions)),
            ("/v1/responses", Some(Dialect::Responses)),
            ("/v1/responses/resp_1", Some(Dialect::Responses)),
            ("/v1/messages", Some(Dialect::Messages)),
            ("/v1/messages/count_tokens", Some(Dialect::Messages)),
            ("/api/chat", Some(Dialect::Ollama)),
            ("/v1/messagesx", None),
            ("/v1/models", None),
            ("/health", None),
        ];
        for (path, want) in cases {
            assert_eq!(Dialect::for_path(path), want, "{path}");
        }
        for d in Dialect::ALL {
            assert_eq!(Dialect::parse(d.name()), Some(d));
            assert_eq!(Dialect::for_ledger_name(d.ledger_name()), Some(d));
        }
        assert_eq!(Dialect::Messages.ledger_name(), "anthropic.messages");
    }
}
