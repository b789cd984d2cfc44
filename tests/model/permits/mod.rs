//! A model of the Redis permit protocol (the scripts of `engine/src/redis/permits/`),
//! checked exhaustively for small sizes: three clients that each ask for a shared permit
//! (of two) or the key alone, wait in one FIFO queue, are granted by whichever script frees
//! room (a message that can be lost), renew, release and crash; one server with the
//! holders' zset, the fence hash (the tombstone) and the queue; discrete time with expiry,
//! and a server clock that steps back within the documented bound.
//!
//! `state` is the state, `prelude` the scripts' shared `PRELUDE`, `actions` the steps named
//! after the scripts (and where the model could drift from them), `properties` what is
//! checked, `model` the glue, `checks` the exhaustive runs, `broken` the deliberate breaks
//! and their counterexamples. Durations, owners, grant messages, fairness and the checker
//! runner are the lock model's.

mod actions;
mod broken;
mod checks;
mod model;
mod prelude;
mod properties;
mod state;
