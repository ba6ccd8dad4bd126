//! No code: this crate exists for its dependency list (`Cargo.toml`, written by
//! `cargo hakari generate` from `.config/hakari.toml`). Every workspace crate
//! depends on it, so every third-party crate is built with one set of features
//! whichever packages a build selects: the test build of the workspace and the
//! desktop app's build share their compiled dependencies instead of building
//! the stack twice. `tools/py/same_features.py` (in `make lint`) checks it is current.
