//! A model of the Redis hand-off protocol (the lock scripts of `engine/src/redis/scripts/`),
//! checked exhaustively with stateright for small sizes: three clients that acquire, wait,
//! are handed the key (a message that can be lost), renew, release and crash; one server
//! with the lock key, the queue and the fence key (tombstone or hand-off fence); discrete
//! time with expiry, and a server clock that steps back within the documented bound.
//!
//! `state` is the state, `actions` the steps named after the scripts (and where the model
//! could drift from them), `properties` what is checked, `model` the glue, `checks` the
//! exhaustive runs, `broken` the deliberate breaks and their counterexamples. `permits` is
//! the same for the permit scripts (`engine/src/redis/permits/scripts.rs`), with its own
//! state, actions and properties; `runner` runs the checker for both.

mod actions;
mod broken;
mod checks;
mod model;
mod permits;
mod properties;
mod runner;
mod state;
