//! What a dialect module declares to be served: [`Registered`], one const per
//! dialect, listed in the folder's `REGISTRY`.
use axum::Router;

use crate::dialect::Dialect;
use crate::state::AppState;

/// One registered dialect: its words, its routes and the state it keeps.
pub struct Registered {
    pub dialect: Dialect,
    pub routes: fn() -> Router<AppState>,
    /// Adds the state the dialect keeps for itself (Responses' stored
    /// replies) to the server's, found again by its type
    /// ([`AppState::dialect_state`]); `None` for a dialect that keeps none.
    pub keeps: Option<fn(&mut axum::http::Extensions)>,
}

impl Registered {
    /// A dialect that keeps no state of its own.
    pub const fn new(dialect: Dialect, routes: fn() -> Router<AppState>) -> Self {
        Registered {
            dialect,
            routes,
            keeps: None,
        }
    }

    /// The same, adding the state it keeps to every new server's.
    pub const fn keeping(self, keep: fn(&mut axum::http::Extensions)) -> Self {
        Registered {
            keeps: Some(keep),
            ..self
        }
    }
}
