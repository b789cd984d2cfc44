//! The conformance suite: the cases every backend must pass unchanged, written once, each
//! run in every acquisition mode the backend has (a lock is the exclusive case).
//!
//! A backend plugs in with a [`Harness`] (a fresh engine per case, a time unit, and a way
//! to list what the backend still keeps; [`BackendHarness`] is one for any [`Backend`](crate::Backend))
//! and one macro call in its own test file: [`core_conformance_tests!`](crate::core_conformance_tests) for the core cases
//! every backend must pass (in exclusive mode), [`shared_conformance_tests!`](crate::shared_conformance_tests) for the
//! same cases in shared mode plus the shared-only ones (a backend with shared mode, see
//! [`Backend::has_shared_mode`](crate::Backend::has_shared_mode)), [`conformance_tests!`](crate::conformance_tests) for all
//! of those and the capability cases (admin operations, numeric compare-and-set, lock pools,
//! records). A backend that lacks a capability instantiates the cases it has, by name.
//!
//! ```
//! use std::time::Duration;
//! use tower_lock_engine::{MemoryBackend, conformance::BackendHarness, conformance_tests};
//!
//! // One `#[tokio::test]` per case and mode, each on a fresh backend; `residue` lists what
//! // the backend still keeps, which must be nothing once a case is done.
//! conformance_tests!(
//!     timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
//!     concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
//!     harness = async {
//!         BackendHarness::new(MemoryBackend::new(), Duration::from_millis(100), |b| {
//!             let left = (0..b.key_count()).map(|i| format!("entry {i}")).collect();
//!             Box::pin(async move { left })
//!         })
//!     },
//! );
//! # fn main() {}
//! ```
//!
//! The cases are written once per behaviour: the core lease operations, FIFO order,
//! fences, leases over time, waiters and mutual exclusion under load, each run in
//! exclusive mode and (as `shared_mode::…`) in shared mode with a limit of 1; `KeyMutex`
//! (exclusive only); the shared-only behaviours (N at once, no writer starvation, a
//! departed head that held the others up); the two modes on one key (one space, one
//! queue, one fence sequence: the lock excludes the shared leases and both wait in one
//! arrival order); admin,
//! numeric, pools and records (the capabilities). Each case's name is its specification.

// The cases are public for the macros' sake; each one's name is its specification.
#![allow(missing_docs)]

use std::{future::Future, time::Duration};

use tokio::time::{Instant, sleep, timeout};

use crate::{Lock, LockEngine, Mode};

mod admin;
mod cross_mode;
mod exclusion;
mod fences;
mod fifo;
mod harness;
mod labels;
mod leases;
mod lock;
mod mutex;
mod numeric;
mod pools;
mod records;
mod shared;
mod shared_load;
mod waiters;

pub use admin::*;
pub use cross_mode::*;
pub use exclusion::*;
pub use fences::*;
pub use fifo::*;
pub use harness::{BackendHarness, Harness, Residue, memory};
pub use labels::*;
pub use leases::*;
pub use lock::*;
pub use mutex::*;
pub use numeric::*;
pub use pools::*;
pub use records::*;
pub use shared::*;
pub use shared_load::*;
pub use waiters::*;

/// Instantiate the core cases, in exclusive mode: what every backend must pass, whatever
/// optional capabilities it has (see `tests/engine/conformance_core_only.rs`).
#[macro_export]
macro_rules! core_conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::core_conformance_tests!(@moded [$timed] [$conc] $make, $crate::Mode::Exclusive);
        $crate::conformance_tests!(@cases [$timed] $make;
            key_mutex_releases_on_every_exit_path,
            key_mutex_reports_held_not_held_and_expiry,
        );
    };
    // The cases run in each mode, in `mode`.
    (@moded [$timed:meta] [$conc:meta] $make:expr, $mode:expr) => {
        $crate::conformance_tests!(@in_mode [$timed] $make, $mode;
            fifo_grants_in_arrival_order_with_zero_overtakes,
            try_acquire_under_contention_is_busy_with_retry_after,
            only_one_of_simultaneous_tries_wins,
            acquire_times_out_after_wait_limit,
            release_by_non_owner_is_refused,
            late_release_after_expiry_is_reported_and_not_applied,
            extend_adds_or_replaces_and_reacquire_resets,
            fences_strictly_increase_per_key,
            watchdog_keeps_lease_past_its_ttl,
            lost_fires_when_the_lease_is_gone,
            lost_fires_at_the_deadline_without_renewal,
            cancelled_waiters_leave_no_residue,
            timed_out_waiters_leave_no_residue,
            max_waiters_is_enforced,
            drop_releases_without_waiting_for_the_ttl,
            same_token_reenters_and_refreshes,
            expired_holder_is_replaced_by_a_waiter,
            invalid_keys_are_refused,
            locked_and_owned_report_state,
            a_stale_waiter_dropped_late_leaves_the_next_holder_alone,
            a_grant_to_a_dropped_waiter_goes_on_to_the_next,
            a_put_aside_fifo_waiter_does_not_hold_back_the_next,
            a_waiter_is_granted_when_a_shorter_successor_lease_expires,
            huge_durations_never_panic,
            holders_show_each_holders_label_through_handoff_reentry_and_extension,
        );
        $crate::conformance_tests!(@in_mode [$conc] $make, $mode;
            mutual_exclusion_many_tasks_many_iterations,
            fifo_mutual_exclusion_many_tasks_many_iterations,
            fifo_waiters_called_in_order_are_granted_in_that_order,
        );
    };
}

/// Instantiate the shared-mode cases, in a module `shared_mode`: every core case run in
/// shared mode (a limit of 1, alone among the shared holders), and the shared-only cases.
/// For a backend with shared mode whose other cases are listed by name;
/// [`conformance_tests!`](crate::conformance_tests) includes them.
#[macro_export]
macro_rules! shared_conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        mod shared_mode {
            #[allow(unused_imports)]
            use super::*;

            $crate::core_conformance_tests!(@moded [$timed] [$conc] $make,
                $crate::Mode::Shared { limit: 1 });
            $crate::conformance_tests!(@cases [$timed] $make;
                n_shared_leases_are_held_at_once_and_no_more,
                shared_grants_follow_arrival_order_across_limits,
                a_writer_is_not_starved_by_a_stream_of_readers,
                a_departed_writer_lets_the_readers_behind_it_in,
                fifo_grants_follow_arrival_order_across_modes,
                a_keys_lock_and_its_shared_leases_exclude_each_other,
                a_lone_waiter_is_not_overtaken_by_later_shared_arrivals,
                shared_waiters_behind_a_lock_are_granted_together_at_its_release,
                fences_rise_across_both_modes,
            );
            $crate::conformance_tests!(@cases [$conc] $make;
                shared_leases_never_exceed_n_nor_share_a_lone_holder,
                fifo_shared_leases_never_exceed_n_nor_share_a_lone_holder,
            );
        }
    };
}

/// Instantiate every conformance case as a test: the core cases in each mode, the
/// shared-only cases, and the capability cases (admin operations, numeric
/// compare-and-set, lock pools, records).
///
/// `timed` is the test attribute for cases about TTLs and ordering; `concurrent` the one
/// for many-task cases; `harness` an async expression building a fresh harness.
#[macro_export]
macro_rules! conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::core_conformance_tests!(timed = #[$timed], concurrent = #[$conc], harness = $make);
        $crate::conformance_tests!(@cases [$timed] $make;
            status_tells_free_locked_reserved_and_no_expiry,
            admin_force_release_hands_the_key_to_the_next_waiter,
            a_force_released_holder_reads_lost_before_its_waiter_is_granted,
            the_last_fence_bounds_every_grant_and_the_next_exceeds_it,
            numeric_compare_and_set_follows_each_comparison,
            numeric_values_expire_and_delete,
            numeric_ttls_past_the_maximum_are_refused,
            pool_membership_and_health,
            a_record_appears_with_the_release_for_the_holder_only,
            a_lapsed_holder_writes_no_record_and_keeps_the_next_holder,
            a_waiter_granted_by_a_completion_finds_the_record,
            records_expire_after_their_retention,
            a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
            acquire_or_record_grants_a_free_key_and_answers_a_stored_record,
            acquire_or_record_after_a_wait_answers_the_record_its_holder_wrote,
        );
        $crate::shared_conformance_tests!(timed = #[$timed], concurrent = #[$conc], harness = $make);
    };
    (@cases [$attr:meta] $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $case() {
                let harness = $make.await;
                $crate::conformance::bounded($crate::conformance::$case(&harness)).await;
            }
        )*
    };
    (@in_mode [$attr:meta] $make:expr, $mode:expr; $($case:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $case() {
                let harness = $make.await;
                $crate::conformance::bounded($crate::conformance::$case(&harness, $mode)).await;
            }
        )*
    };
}

/// Run a case with a time bound, so a broken backend fails the case instead of hanging it.
pub async fn bounded(case: impl Future<Output = ()>) {
    timeout(Duration::from_secs(120), case)
        .await
        .expect("conformance case did not finish within 120 s");
}

async fn assert_no_residue(h: &impl Harness) {
    // Dropped leases release in a spawned task: allow it a moment to land.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let left = h.residue().await;
        if left.is_empty() {
            return;
        }
        assert!(Instant::now() < deadline, "backend kept state: {left:?}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// The engine under test in one mode: its [`lock`](Self::lock) handles take `mode`, and
/// it is the [`LockEngine`] for everything else.
#[derive(Clone, Debug)]
pub struct InMode {
    engine: LockEngine,
    mode: Mode,
}

impl InMode {
    /// A handle on `key` in this mode.
    pub fn lock(&self, key: impl AsRef<str>) -> Lock {
        self.engine.lock(key).in_mode(self.mode)
    }
}

impl std::ops::Deref for InMode {
    type Target = LockEngine;

    fn deref(&self) -> &LockEngine {
        &self.engine
    }
}

/// The harness's engine, its handles in `mode`.
pub fn in_mode(h: &impl Harness, mode: Mode) -> InMode {
    InMode {
        engine: h.engine(),
        mode,
    }
}

/// Wait until `n` callers are queued for `key` (observable backend state, no event to await).
async fn until_waiters(engine: &LockEngine, key: &str, n: usize) {
    let lock = engine.lock(key);
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if lock.waiters().await.unwrap() == n {
            return;
        }
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        tokio::task::yield_now().await;
        sleep(Duration::from_millis(1)).await;
    }
}

async fn remaining(engine: &InMode, key: &str) -> Duration {
    engine
        .lock(key)
        .holder()
        .await
        .unwrap()
        .expect("key is held")
        .ttl
        .expect("key has a TTL")
}

// The suite on the in-process backend, from this crate alone: what a backend author's
// test file does (the workspace also runs it from `tests/`, with the other backends).
#[cfg(test)]
mod memory_backend {
    crate::conformance_tests!(
        timed = #[tokio::test(flavor = "multi_thread", worker_threads = 2)],
        concurrent = #[tokio::test(flavor = "multi_thread", worker_threads = 4)],
        harness = crate::conformance::memory(),
    );
}
