//! Permits on Redis: N holders per key, or one exclusive holder alone, under faults. What
//! must hold:
//! - a freed permit goes to the next waiter by message (never found by the fallback timer);
//! - once an exclusive request waits, later shared ones queue behind it;
//! - a holder that crashed (its lease no longer renewed) frees its permit once its TTL
//!   runs out, and a waiter is granted it then, not a lease TTL later;
//! - a holder process SIGKILLed mid-run frees its permits once their TTL runs out, to the
//!   waiters in order, never more than N at once nor anyone beside the exclusive one;
//! - with Redis paused mid-run, never more than N hold at once, nor anyone beside an
//!   exclusive holder;
//! - with Redis restarted mid-run (its data gone), calls fail as backend errors during the
//!   outage, the work resumes after it, and of the restarted server's grants never more
//!   than N hold at once, nor anyone beside an exclusive holder;
//! - nothing is left behind once nobody holds or waits, the fence tombstones aside (and
//!   they keep only the last fence, with a TTL).
//!
//! Each test owns its redis-server; the runtimes are multi-threaded.
#![cfg(feature = "redis")]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use tokio::time::{Instant, timeout};
use tower_lock::{
    LockEngine, LockError,
    engine::{Lock, redis::RedisBackend},
};
use tower_lock_test_support::fallbacks::Fallbacks;
use tower_lock_test_support::history::{Mode, Recorder};
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine, residue};
use tower_lock_test_support::serial;

async fn engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, Some(Duration::from_millis(300))).await
}

/// Wait until `n` callers wait for a permit of `permits`' key (backend state, no event).
async fn until_waiters(permits: &Lock, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while permits.waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} permit waiters");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Wait until nothing but fence tombstones is left under `prefix`, then check that every
/// permit tombstone keeps only the last fence, with a TTL.
async fn until_no_residue(server: &RedisServer, prefix: &str) {
    // Dropped leases and cancelled waiters clean up in spawned tasks.
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        let left = tokio::task::block_in_place(|| residue(server, prefix));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "residue: {left:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let tombstones = tokio::task::block_in_place(|| server.scan(&format!("{prefix}:*")));
    for key in tombstones.iter().filter(|k| k.contains("}:pfence:")) {
        let fields = tokio::task::block_in_place(|| server.cli(["HKEYS", key]));
        assert_eq!(fields, "fence", "{key} keeps holders: {fields:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn n_permits_admit_n_and_a_release_hands_one_to_the_next_waiter_by_message() {
    let _group = serial::group(module_path!()).await;
    let fallbacks = Fallbacks::install();
    let server = RedisServer::start();
    let (a, b) = (
        engine(&server, "handoff").await,
        engine(&server, "handoff").await,
    );
    let permits = a.lock("k").shared(2).ttl(Duration::from_secs(30));
    let first = permits.acquire().await.unwrap();
    let second = permits.acquire().await.unwrap();
    assert!(second.fence() > first.fence());
    match permits.try_acquire().await {
        Err(LockError::Busy { retry_after }) => {
            let left = retry_after.expect("the first holder's remaining TTL");
            assert!(left > Duration::from_secs(25) && left <= Duration::from_secs(30));
        }
        other => panic!("a third permit of two: {other:?}"),
    }
    assert_eq!(permits.holders().await.unwrap().len(), 2);

    let mut held = vec![first, second];
    let mut last_fence = held[1].fence();
    for _ in 0..6 {
        // A waiter on the other node, granted by a release on this one.
        let other = b.lock("k").shared(2).wait(Duration::from_secs(10));
        let waiter = tokio::spawn(async move { other.acquire().await });
        until_waiters(&permits, 1).await;
        let before = fallbacks.count_under("handoff");
        held.remove(0).release().await.unwrap();
        let granted = timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter is granted the freed permit")
            .unwrap()
            .unwrap();
        assert_eq!(
            fallbacks.count_under("handoff"),
            before,
            "the grant was found by the fallback timer, not by its message"
        );
        assert!(granted.fence() > last_fence);
        last_fence = granted.fence();
        held.push(granted);
        assert_eq!(permits.holders().await.unwrap().len(), 2);
    }
    for lease in held {
        lease.release().await.unwrap();
    }
    until_no_residue(&server, "handoff").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_exclusive_request_holds_back_later_shared_ones() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "writer").await;
    let doc = engine
        .lock("doc")
        .shared(u32::MAX)
        .wait(Duration::from_secs(10));
    let reader = doc.acquire().await.unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let writer = {
        let (doc, order) = (doc.clone().shared(1), order.clone());
        tokio::spawn(async move {
            let lease = doc.acquire().await.unwrap();
            order.lock().unwrap().push("writer");
            lease
        })
    };
    until_waiters(&doc, 1).await;
    // Readers still fit beside the reader, but a writer waits: they queue behind it.
    assert!(matches!(
        doc.try_acquire().await,
        Err(LockError::Busy { .. })
    ));
    let late_reader = {
        let (doc, order) = (doc.clone(), order.clone());
        tokio::spawn(async move {
            let lease = doc.acquire().await.unwrap();
            order.lock().unwrap().push("reader");
            lease
        })
    };
    until_waiters(&doc, 2).await;
    reader.release().await.unwrap();
    let writer = timeout(Duration::from_secs(5), writer)
        .await
        .expect("the writer is granted once the reader leaves")
        .unwrap();
    let holders = doc.holders().await.unwrap();
    assert_eq!(holders.len(), 1);
    assert!(holders[0].mode.is_alone());
    assert_eq!(
        doc.waiters().await.unwrap(),
        1,
        "the late reader still waits"
    );
    let writer_fence = writer.fence();
    writer.release().await.unwrap();
    let late_reader = timeout(Duration::from_secs(5), late_reader)
        .await
        .expect("the late reader is granted after the writer")
        .unwrap();
    assert_eq!(*order.lock().unwrap(), ["writer", "reader"]);
    assert!(late_reader.fence() > writer_fence);
    late_reader.release().await.unwrap();
    until_no_residue(&server, "writer").await;
}

/// One of two holders crashes (its lease neither renewed nor released) while the other
/// lives on, so the holders' key stays: the crashed permit must be dropped by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_holders_permit_frees_after_its_ttl_and_goes_to_a_waiter() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    const TTL: Duration = Duration::from_millis(1500);
    let survivor = engine(&server, "crash").await;
    let permits = survivor.lock("k").shared(2).ttl(Duration::from_secs(30));
    let live = permits.acquire().await.unwrap();
    // The crashed node.
    let crashed = engine(&server, "crash").await;
    let started = Instant::now();
    let lease = crashed
        .lock("k")
        .shared(2)
        .ttl(TTL)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let stale_fence = lease.fence();
    std::mem::forget(lease);
    drop(crashed);

    let granted = permits
        .clone()
        .wait(Duration::from_secs(10))
        .acquire()
        .await
        .expect("the crashed permit frees");
    let after = started.elapsed();
    assert!(
        after >= TTL,
        "granted {after:?} after the crash, before its TTL"
    );
    // The fallback retry notices the expiry: at most one fallback period late (250 ms),
    // with room for a loaded machine.
    assert!(
        after < TTL + Duration::from_secs(1),
        "granted {after:?} after the crash"
    );
    assert!(granted.fence() > stale_fence);
    assert_eq!(permits.holders().await.unwrap().len(), 2);
    granted.release().await.unwrap();
    live.release().await.unwrap();
    until_no_residue(&server, "crash").await;
}

/// Each node's connections opened and the permits' scripts loaded before a run whose
/// history is checked for FIFO order: an arrival is stamped before its acquire is sent,
/// and a node's first calls, which connect and load scripts (the first grant came 63 ms
/// after the first arrival in a loaded CI run), reached Redis after callers stamped 20 ms
/// later on a node already connected.
async fn warm(nodes: &[LockEngine], n: u32) {
    let calls: Vec<_> = nodes
        .iter()
        .flat_map(|node| {
            (0..4).map(move |i| {
                let lock = node.lock(format!("warm-{i}")).shared(n).fifo(true);
                tokio::spawn(async move {
                    let lease = lock.acquire().await.expect("warm-up acquire");
                    lease.release().await.expect("warm-up release");
                })
            })
        })
        .collect();
    for call in calls {
        call.await.unwrap();
    }
}

/// Shared and exclusive holders on three nodes, counted as they hold: never more than
/// `N` shared, never anyone beside an exclusive one, while Redis is paused mid-run. The
/// run's history is checked too: the same bounds in real time, fences rising in grant
/// order, FIFO callers granted in arrival order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_paused_mid_run_never_lets_more_than_n_hold() {
    let _group = serial::group(module_path!()).await;
    const N: usize = 3;
    let server = RedisServer::start();
    let nodes = [
        engine(&server, "paused").await,
        engine(&server, "paused").await,
        engine(&server, "paused").await,
    ];
    warm(&nodes, N as u32).await;
    let shared = Arc::new(AtomicUsize::new(0));
    let exclusive = Arc::new(AtomicUsize::new(0));
    let grants = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let recorder = Recorder::new();
    let mut tasks = Vec::new();
    for w in 0..12 {
        let node = nodes[w % 3].clone();
        let (shared, exclusive, grants, stop, recorder) = (
            shared.clone(),
            exclusive.clone(),
            grants.clone(),
            stop.clone(),
            recorder.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let alone = w % 6 == 0;
            let fifo = w % 2 == 0;
            let mode = if alone {
                Mode::Exclusive
            } else {
                Mode::Shared { limit: N }
            };
            let who = (u32::try_from(w % 3).unwrap(), u32::try_from(w).unwrap());
            let mut permits = node
                .lock("k")
                .shared(N as u32)
                .fifo(fifo)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(20));
            if alone {
                permits = permits.shared(1);
            }
            while !stop.load(Ordering::SeqCst) {
                // A failure (the server paused) is retried; nothing may be granted wrongly.
                let acquiring = recorder.acquiring(who.0, who.1, "k", mode, fifo);
                let Ok(lease) = permits.acquire().await else {
                    continue;
                };
                let holding = acquiring.granted(&lease);
                if alone {
                    assert_eq!(exclusive.fetch_add(1, Ordering::SeqCst), 0, "two writers");
                    assert_eq!(shared.load(Ordering::SeqCst), 0, "a writer beside readers");
                } else {
                    let now = shared.fetch_add(1, Ordering::SeqCst) + 1;
                    assert!(now <= N, "{now} shared holders of {N}");
                    assert_eq!(
                        exclusive.load(Ordering::SeqCst),
                        0,
                        "a reader beside a writer"
                    );
                }
                grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                if alone {
                    exclusive.fetch_sub(1, Ordering::SeqCst);
                } else {
                    shared.fetch_sub(1, Ordering::SeqCst);
                }
                holding.releasing(&lease);
                let _ = lease.release().await;
            }
        }));
    }
    let until_grants = |n: usize| {
        let grants = grants.clone();
        async move {
            let give_up = Instant::now() + Duration::from_secs(30);
            while grants.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < give_up, "only {grants:?} grants");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until_grants(100).await;
    tokio::task::block_in_place(|| server.cli(["CLIENT", "PAUSE", "800", "ALL"]));
    let paused_at = grants.load(Ordering::SeqCst);
    tokio::task::block_in_place(|| server.wait_ready());
    // Work goes on after the pause.
    until_grants(paused_at + 100).await;
    stop.store(true, Ordering::SeqCst);
    for t in tasks {
        t.await.expect("no worker saw a violation");
    }
    recorder
        .history()
        .assert_valid(Some(Duration::from_millis(20)));
    until_no_residue(&server, "paused").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waits_timeouts_and_cancellations_leave_nothing_behind() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "residue").await;
    let mut tasks = Vec::new();
    for i in 0..30 {
        let engine = engine.clone();
        tasks.push(tokio::spawn(async move {
            let mut permits = engine
                .lock(format!("k{}", i % 3))
                .shared(2)
                .fifo(i % 2 == 0)
                .ttl(Duration::from_secs(5));
            if i % 5 == 0 {
                permits = permits.shared(1);
            }
            match i % 3 {
                // Hold briefly, release explicitly.
                0 => {
                    let lease = permits.acquire().await.unwrap();
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    lease.release().await.unwrap();
                }
                // Give up waiting quickly (may also win at once, then drop).
                1 => {
                    let _ = permits.wait(Duration::from_millis(3)).acquire().await;
                }
                // Dropped mid-wait, or dropped holding.
                _ => {
                    let _ = timeout(Duration::from_millis(4), permits.acquire()).await;
                }
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    until_no_residue(&server, "residue").await;
    for k in 0..3 {
        let permits = engine.lock(format!("k{k}")).shared(2);
        assert_eq!(permits.waiters().await.unwrap(), 0);
        assert!(permits.holders().await.unwrap().is_empty());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shared_permit_is_not_upgraded_and_an_exclusive_one_re_enters_as_it_is() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "upgrade").await;
    let doc = engine.lock("doc").shared(4);
    let reader = doc.acquire().await.unwrap();
    let other = doc.acquire().await.unwrap();
    let upgrade = doc.clone().shared(1).token(reader.token().clone());
    for attempt in [upgrade.try_acquire().await, upgrade.acquire().await] {
        assert!(
            matches!(attempt, Err(LockError::InvalidValue(_))),
            "{attempt:?}"
        );
    }
    // Nothing changed: both still hold, shared, and nobody waits.
    let holders = doc.holders().await.unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| !h.mode.is_alone()));
    assert_eq!(doc.waiters().await.unwrap(), 0);
    reader.release().await.unwrap();
    other.release().await.unwrap();

    let writer = doc.clone().shared(1).acquire().await.unwrap();
    let again = doc
        .clone()
        .token(writer.token().clone())
        .acquire()
        .await
        .unwrap();
    assert_eq!(again.fence(), writer.fence());
    let holders = doc.holders().await.unwrap();
    assert!(holders.len() == 1 && holders[0].mode.is_alone());
    drop(again);
    drop(writer);
    until_no_residue(&server, "upgrade").await;
}

/// Holders counted as they hold, per key: never more than `n` shared, never anyone beside
/// an exclusive one. [`Census::enter`] panics on a violation.
#[derive(Debug, Default)]
struct Census {
    shared: AtomicUsize,
    exclusive: AtomicUsize,
}

/// One holder counted by a [`Census`], until dropped.
struct Counted {
    census: Arc<Census>,
    exclusive: bool,
}

impl Census {
    fn enter(self: &Arc<Self>, exclusive: bool, n: usize) -> Counted {
        if exclusive {
            assert_eq!(
                self.exclusive.fetch_add(1, Ordering::SeqCst),
                0,
                "two exclusive holders"
            );
            assert_eq!(
                self.shared.load(Ordering::SeqCst),
                0,
                "an exclusive holder beside shared ones"
            );
        } else {
            let now = self.shared.fetch_add(1, Ordering::SeqCst) + 1;
            assert!(now <= n, "{now} shared holders of {n}");
            assert_eq!(
                self.exclusive.load(Ordering::SeqCst),
                0,
                "a shared holder beside an exclusive one"
            );
        }
        Counted {
            census: self.clone(),
            exclusive,
        }
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        let count = if self.exclusive {
            &self.census.exclusive
        } else {
            &self.census.shared
        };
        count.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Wait until `n` permits of `permits`' key are held (backend state, no event).
async fn until_holders(permits: &Lock, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while permits.holders().await.unwrap().len() != n {
        assert!(Instant::now() < give_up, "never saw {n} permit holders");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Set in a child process started by [`spawn_holder`]: the prefix of its engine's keys.
const HOLDER_PREFIX: &str = "TOWER_LOCK_TEST_PERMIT_HOLDER";
/// The child's permits: two of [`KILLED_N`] of key `k`, renewed while it lives.
const KILLED_N: u32 = 3;
const KILLED_TTL: Duration = Duration::from_millis(1500);

/// A child process (this test binary again, running [`permit_holder_process`]), SIGKILLed
/// when dropped if it still runs.
struct Holder(std::process::Child);

impl Holder {
    /// SIGKILL: no release, no clean-up; its leases are simply no longer renewed.
    fn kill(&mut self) {
        self.0.kill().unwrap();
        self.0.wait().unwrap();
    }
}

impl Drop for Holder {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Re-run this test binary as a child process holding two permits (see
/// [`permit_holder_process`]), as faults' `spawn_child` does for its roles.
fn spawn_holder(server: &RedisServer, prefix: &str) -> Holder {
    let url = server.url();
    let env = [
        (HOLDER_PREFIX, prefix),
        ("TOWER_LOCK_TEST_REDIS", url.as_str()),
    ];
    let child = crate::child::rerun(module_path!(), "permit_holder_process", &env);
    Holder(child)
}

/// The entry point of [`spawn_holder`]'s child process: it takes two permits of key `k`
/// (auto-renewed, so held for as long as it lives) and waits to be killed. In the parent
/// run it checks nothing and returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_holder_process() {
    let Ok(prefix) = std::env::var(HOLDER_PREFIX) else {
        return;
    };
    let url = std::env::var("TOWER_LOCK_TEST_REDIS").unwrap();
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    let permits = engine.lock("k").shared(KILLED_N).ttl(KILLED_TTL);
    let _held = (
        permits.acquire().await.unwrap(),
        permits.acquire().await.unwrap(),
    );
    // Renewed by the watchdog until killed.
    std::future::pending::<()>().await;
}

/// A process holding two of three permits is SIGKILLed while the third is held here (so
/// the holders' key lives on: the dead permits must be dropped by the scripts) and four
/// requests wait in order: shared `a` and `b`, exclusive `x`, shared `c`. The dead permits
/// go to `a` and `b` once their TTL has run out (not before, and not much later); `x` only
/// once everyone has left, alone; `c` after `x`. Nothing is left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sigkilled_holder_process_frees_its_permits_after_their_ttl_to_the_queue_in_order() {
    let _group = serial::group(module_path!()).await;
    const N: usize = KILLED_N as usize;
    let server = RedisServer::start();
    let engine = engine(&server, "killed").await;
    let permits = engine
        .lock("k")
        .shared(KILLED_N)
        .fifo(true)
        .wait(Duration::from_secs(20));
    let census = Arc::new(Census::default());

    let mut child = spawn_holder(&server, "killed");
    until_holders(&permits, 2).await;
    let live = permits
        .clone()
        .ttl(Duration::from_secs(30))
        .acquire()
        .await
        .unwrap();
    let live_counted = census.enter(false, N);
    assert!(matches!(
        permits.try_acquire().await,
        Err(LockError::Busy { .. })
    ));

    let order = Arc::new(Mutex::new(Vec::new()));
    let waiter = |name: &'static str, exclusive: bool| {
        let (census, order) = (census.clone(), order.clone());
        let permits = if exclusive {
            permits.clone().shared(1)
        } else {
            permits.clone()
        };
        tokio::spawn(async move {
            let lease = permits.acquire().await.unwrap();
            let granted = Instant::now();
            let counted = census.enter(exclusive, N);
            order.lock().unwrap().push(name);
            (granted, lease, counted)
        })
    };
    let a = waiter("a", false);
    until_waiters(&permits, 1).await;
    let b = waiter("b", false);
    until_waiters(&permits, 2).await;
    let x = waiter("x", true);
    until_waiters(&permits, 3).await;
    let c = waiter("c", false);
    until_waiters(&permits, 4).await;

    tokio::task::block_in_place(|| child.kill());
    // The dead permits' remaining TTLs, as the server sees them once nobody renews them.
    let seen = Instant::now();
    let dead: Vec<Duration> = permits
        .holders()
        .await
        .unwrap()
        .into_iter()
        .filter(|h| &h.token != live.token())
        .map(|h| h.ttl.expect("a permit has a TTL"))
        .collect();
    assert_eq!(dead.len(), 2, "the child's permits: {dead:?}");
    assert!(dead.iter().all(|ttl| *ttl <= KILLED_TTL));
    // The server's clock is read in whole milliseconds: a little slack either way.
    let first_free = seen + *dead.iter().min().unwrap() - Duration::from_millis(5);
    // The fallback retry notices the expiry: at most one fallback period late (250 ms),
    // with room for a loaded machine.
    let all_free = seen + *dead.iter().max().unwrap() + Duration::from_secs(1);

    let mut shared = Vec::new();
    for (name, waiter) in [("a", a), ("b", b)] {
        let (granted, lease, counted) =
            timeout(all_free.saturating_duration_since(Instant::now()), waiter)
                .await
                .unwrap_or_else(|_| panic!("{name} is not granted a dead permit in time"))
                .unwrap();
        assert!(
            granted >= first_free,
            "{name} was granted {:?} before the dead permits' TTL ran out",
            first_free - granted
        );
        shared.push((lease, counted));
    }
    let holders = permits.holders().await.unwrap();
    assert_eq!(holders.len(), N, "{holders:?}");
    assert!(holders.iter().all(|h| !h.mode.is_alone()));
    assert_eq!(permits.waiters().await.unwrap(), 2, "x and c still wait");

    // Everyone leaves: x is granted, alone, and c still waits behind it.
    for (lease, counted) in shared {
        drop(counted);
        lease.release().await.unwrap();
    }
    drop(live_counted);
    live.release().await.unwrap();
    let (_, x_lease, x_counted) = timeout(Duration::from_secs(5), x)
        .await
        .expect("x is granted once everyone has left")
        .unwrap();
    let holders = permits.holders().await.unwrap();
    assert!(
        holders.len() == 1 && holders[0].mode.is_alone(),
        "x is not alone: {holders:?}"
    );
    assert_eq!(permits.waiters().await.unwrap(), 1, "c still waits");
    let x_fence = x_lease.fence();
    drop(x_counted);
    x_lease.release().await.unwrap();
    let (_, c_lease, c_counted) = timeout(Duration::from_secs(5), c)
        .await
        .expect("c is granted after x")
        .unwrap();
    assert!(c_lease.fence() > x_fence);
    let order = order.lock().unwrap().clone();
    assert!(
        order == ["a", "b", "x", "c"] || order == ["b", "a", "x", "c"],
        "{order:?}"
    );
    drop(c_counted);
    c_lease.release().await.unwrap();
    until_no_residue(&server, "killed").await;
}

/// Now as microseconds since the epoch: the clock Redis `TIME` reads too.
fn now_us() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_micros(),
    )
    .unwrap()
}

/// Shared and exclusive holders on three nodes; mid-run the server is killed, and restarted
/// empty (no persistence): whatever was held or queued is gone with it. What must hold:
/// during the outage calls fail as backend errors (or a wait runs out), nothing panics or
/// hangs; the same engines work again after the restart; and among the restarted server's
/// grants, never more than `N` hold at once, nor anyone beside an exclusive holder (the
/// old server's grants, still in hand across the restart, are not its holders).
///
/// A grant is told the old server's or the new one's by its fence: fences are at least the
/// server's clock in µs, so the new server's are past the moment the old one was seen dead,
/// and the old one's are before it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn redis_restarted_mid_run_fails_as_backend_errors_then_never_lets_more_than_n_hold() {
    let _group = serial::group(module_path!()).await;
    const N: usize = 3;
    let server = RedisServer::start();
    let nodes = [
        engine(&server, "restart").await,
        engine(&server, "restart").await,
        engine(&server, "restart").await,
    ];
    // Holders of the old server's grants, and of the new one's.
    let (old, new) = (Arc::new(Census::default()), Arc::new(Census::default()));
    let (old_grants, new_grants) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let backend_errors = Arc::new(AtomicUsize::new(0));
    let timed_out = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    // Set before the kill; then, once the old server is dead, the moment (µs) it was seen so.
    let killing = Arc::new(AtomicBool::new(false));
    let (died_tx, died) = tokio::sync::watch::channel(None::<u64>);
    let mut tasks = Vec::new();
    for w in 0..12 {
        let node = nodes[w % 3].clone();
        let (old, new, old_grants, new_grants) = (
            old.clone(),
            new.clone(),
            old_grants.clone(),
            new_grants.clone(),
        );
        let (backend_errors, timed_out, stop, killing, mut died) = (
            backend_errors.clone(),
            timed_out.clone(),
            stop.clone(),
            killing.clone(),
            died.clone(),
        );
        tasks.push(tokio::spawn(async move {
            let alone = w % 6 == 0;
            let mut permits = node
                .lock("k")
                .shared(N as u32)
                .fifo(w % 2 == 0)
                .ttl(Duration::from_secs(5))
                .wait(Duration::from_secs(5));
            if alone {
                permits = permits.shared(1);
            }
            while !stop.load(Ordering::SeqCst) {
                let lease = match permits.acquire().await {
                    Ok(lease) => lease,
                    Err(LockError::Backend(_)) => {
                        backend_errors.fetch_add(1, Ordering::SeqCst);
                        // Redis is down: calls fail at once; do not spin on them.
                        tokio::time::sleep(Duration::from_millis(10)).await;
                        continue;
                    }
                    Err(LockError::TimedOut { .. }) => {
                        timed_out.fetch_add(1, Ordering::SeqCst);
                        continue;
                    }
                    Err(other) => panic!("worker {w}: {other:?}"),
                };
                let from_new = if killing.load(Ordering::SeqCst) {
                    let died = *died.wait_for(Option::is_some).await.unwrap();
                    lease.fence().get() > died.unwrap()
                } else {
                    // Granted before the kill began: the old server's.
                    false
                };
                let (census, grants) = if from_new {
                    (&new, &new_grants)
                } else {
                    (&old, &old_grants)
                };
                let counted = census.enter(alone, N);
                grants.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(3)).await;
                drop(counted);
                let released = lease.release().await;
                if from_new {
                    // The new server is not restarted again: its grants are released.
                    released.unwrap_or_else(|e| panic!("worker {w}: release: {e:?}"));
                }
            }
        }));
    }
    let until = |count: &Arc<AtomicUsize>, n: usize, within: Duration, what: &'static str| {
        let count = count.clone();
        async move {
            let give_up = Instant::now() + within;
            while count.load(Ordering::SeqCst) < n {
                assert!(Instant::now() < give_up, "only {count:?} {what}");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    until(&old_grants, 100, Duration::from_secs(30), "grants before").await;

    killing.store(true, Ordering::SeqCst);
    tokio::task::block_in_place(|| server.kill());
    died_tx.send_replace(Some(now_us()));
    // The outage: the workers' calls fail, as backend errors.
    let failed = backend_errors.load(Ordering::SeqCst);
    until(
        &backend_errors,
        failed + 3,
        Duration::from_secs(5),
        "backend errors during the outage",
    )
    .await;
    tokio::task::block_in_place(|| server.restart());
    // The same engines, not rebuilt, work again.
    until(
        &new_grants,
        1,
        Duration::from_secs(5),
        "grants within 5 s of the restart",
    )
    .await;
    until(&new_grants, 100, Duration::from_secs(30), "grants after").await;

    stop.store(true, Ordering::SeqCst);
    // A worker's acquire waits 5 s at most: none hangs.
    let all = futures_util::future::join_all(tasks);
    for t in timeout(Duration::from_secs(15), all)
        .await
        .expect("the workers finish")
    {
        t.expect("no worker saw a violation or an unexpected error");
    }
    eprintln!(
        "grants: {} before, {} after; backend errors {}, timed out {}",
        old_grants.load(Ordering::SeqCst),
        new_grants.load(Ordering::SeqCst),
        backend_errors.load(Ordering::SeqCst),
        timed_out.load(Ordering::SeqCst),
    );
    until_no_residue(&server, "restart").await;
    let permits = nodes[0].lock("k").shared(N as u32);
    assert_eq!(permits.waiters().await.unwrap(), 0);
    assert!(permits.holders().await.unwrap().is_empty());
}
