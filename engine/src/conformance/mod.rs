//! The conformance suite: the cases every backend must pass unchanged, written once.
//!
//! A backend plugs in with a [`Harness`] (a fresh engine per case, a time unit, and a way
//! to list what the backend still keeps; [`BackendHarness`] is one for any [`Backend`](crate::Backend))
//! and one macro call in its own test file: [`core_conformance_tests!`](crate::core_conformance_tests) for the core cases
//! every backend must pass, [`conformance_tests!`](crate::conformance_tests) for those and the capability cases
//! (admin operations, numeric compare-and-set, lock pools, records, permits). A backend that
//! lacks a capability instantiates the core cases and the capability cases it has, by name
//! ([`permit_conformance_tests!`](crate::permit_conformance_tests) for the permit cases).
//!
//! ```
//! use std::time::Duration;
//! use tower_lock_engine::{MemoryBackend, conformance::BackendHarness, conformance_tests};
//!
//! // One `#[tokio::test]` per case, each on a fresh backend; `residue` lists what the
//! // backend still keeps, which must be nothing once a case is done.
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
//! The cases are written once per capability: the core lock operations, FIFO order,
//! fences, leases over time, waiters, mutual exclusion under load and `KeyMutex` (the
//! core); admin, numeric, pools, records and permits (the capabilities). Each case's name is its
//! specification.

// The cases are public for the macros' sake; each one's name is its specification.
#![allow(missing_docs)]

use std::{future::Future, time::Duration};

use tokio::time::{Instant, sleep, timeout};

use crate::LockEngine;

mod admin;
mod exclusion;
mod fences;
mod fifo;
mod harness;
mod leases;
mod lock;
mod mutex;
mod numeric;
mod permits;
mod pools;
mod records;
mod waiters;

pub use admin::*;
pub use exclusion::*;
pub use fences::*;
pub use fifo::*;
pub use harness::{BackendHarness, Harness, Residue, memory};
pub use leases::*;
pub use lock::*;
pub use mutex::*;
pub use numeric::*;
pub use permits::*;
pub use pools::*;
pub use records::*;
pub use waiters::*;

/// Instantiate the core cases only: what every backend must pass, whatever optional
/// capabilities it has (see `tests/conformance_core_only.rs`).
#[macro_export]
macro_rules! core_conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::conformance_tests!(@cases [$timed] $make;
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
            key_mutex_releases_on_every_exit_path,
            key_mutex_reports_held_not_held_and_expiry,
            a_stale_waiter_dropped_late_leaves_the_next_holder_alone,
            a_waiter_is_granted_when_a_shorter_successor_lease_expires,
            huge_durations_never_panic,
        );
        $crate::conformance_tests!(@cases [$conc] $make;
            mutual_exclusion_many_tasks_many_iterations,
            fifo_mutual_exclusion_many_tasks_many_iterations,
        );
    };
}

/// Instantiate the permit cases only (the [`PermitBackend`](crate::PermitBackend)
/// capability): for a backend that adds permits to the core cases, or whose other
/// capability cases are listed by name. [`conformance_tests!`](crate::conformance_tests)
/// includes them.
#[macro_export]
macro_rules! permit_conformance_tests {
    (timed = #[$timed:meta], concurrent = #[$conc:meta], harness = $make:expr $(,)?) => {
        $crate::conformance_tests!(@cases [$timed] $make;
            n_permits_are_held_at_once_and_no_more,
            permit_grants_follow_arrival_order,
            an_exclusive_waiter_is_not_starved_by_a_stream_of_shared_ones,
            a_departed_exclusive_waiter_lets_the_shared_ones_behind_it_in,
            permit_fences_strictly_increase_per_key,
            an_expired_permit_is_freed_for_a_waiter_on_time,
            a_permit_waiter_follows_a_shorter_successor_lease,
            dropped_permit_waiters_leave_nothing,
            a_grant_to_a_dropped_permit_waiter_goes_on_to_the_next,
            permit_waits_are_busy_timed_out_or_queue_full,
            permit_release_extend_and_renew_compare_the_token,
        );
        $crate::conformance_tests!(@cases [$conc] $make;
            permits_never_exceed_n_nor_share_an_exclusive_holder,
            fifo_permits_never_exceed_n_nor_share_an_exclusive_holder,
        );
    };
}

/// Instantiate every conformance case as a test: the core cases and the capability cases
/// (admin operations, numeric compare-and-set, lock pools, records, permits).
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
            numeric_compare_and_set_follows_each_comparison,
            numeric_values_expire_and_delete,
            numeric_ttls_past_the_maximum_are_refused,
            pool_membership_and_health,
            a_record_appears_with_the_release_for_the_holder_only,
            a_lapsed_holder_writes_no_record_and_keeps_the_next_holder,
            a_waiter_granted_by_a_completion_finds_the_record,
            records_expire_after_their_retention,
            a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone,
        );
        $crate::permit_conformance_tests!(timed = #[$timed], concurrent = #[$conc], harness = $make);
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

async fn remaining(engine: &LockEngine, key: &str) -> Duration {
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
