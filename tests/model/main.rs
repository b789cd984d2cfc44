//! A model of the hand-off protocol of one key in both modes (the Redis scripts of
//! `engine/src/redis/scripts/`), checked exhaustively with stateright for small sizes:
//! three clients that each ask to hold the key alone or shared (limit 2), wait in the
//! key's one queue, are granted by whichever script frees room (a message naming the
//! ticket's registration nonce, which can be lost), renew, release and crash, and whose
//! first request the connection may send again; one server with the holders, the last
//! fence and the queue; discrete time with expiry, and a server clock that steps back.
//!
//! `state` is the state, `script` the steps every script shares, `actions` the steps named
//! after the scripts (and where the model could drift from them), `properties` what is
//! checked, `model` the glue, `checks` the exhaustive runs, `broken` the deliberate breaks
//! and their counterexamples, `runner` the checker runs.

mod actions;
mod broken;
mod checks;
mod model;
mod properties;
mod runner;
mod script;
mod state;
