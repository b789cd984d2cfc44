//! A key prefix of its own on a shared server.
//!
//! A test binary shares one `redis-server` (and one Cluster) among its tests, and they keep
//! apart by key prefix alone. A prefix spelled from a name is not enough: one scenario is
//! instantiated under several frameworks, backends and macro calls with the same name, and
//! libtest runs whichever instances a name filter selects at once, so two of them would
//! share their locks (an exclusion or occupancy check passing or failing because of the
//! other test) and see each other's live keys in their residue checks. Every prefix made
//! here ends in a number no other call in any process has been given, so no two instances
//! ever share one, under any filter and any `--test-threads`.

use std::sync::atomic::{AtomicU64, Ordering};

/// `name`, then this process's id and a number never handed out before in this process:
/// `scenario-fifo-4711-3`. Unique among all the prefixes made here by any process, since
/// the last two parts are.
///
/// `name` keeps the key listings readable (a residue message names the scenario); it must
/// be short enough for the whole to fit the backend's limit on a prefix (64 bytes), and be
/// free of `{`, `}`, glob characters and blanks.
pub fn unique(name: &str) -> String {
    static MADE: AtomicU64 = AtomicU64::new(0);
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    format!("{name}-{}-{n}", std::process::id())
}
