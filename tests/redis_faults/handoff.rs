//! The Redis backend's direct hand-off: a release makes the next waiter the holder inside
//! the script and publishes the grant. What must hold:
//! - a grant to a waiter that has gone (crashed, cancelled) costs at most its claim period
//!   (its own node's ticket TTL, 3 s here), never the waiter's lease TTL (60 s here), nor
//!   the releasing node's longer claim;
//! - nodes with different settings share a prefix: a hand-off lasts the waiter's own claim,
//!   and the waiter's local deadline is never later than the server's expiry;
//! - a waiter whose grant message is lost still gets its key, long before the claim runs
//!   out (its retry finds the key already its own);
//! - fences keep rising across every hand-off; exclusion and FIFO order hold with many
//!   nodes, many waiters, and waiters cancelled around their grant, run after run.
//!
//! Each test owns its redis-server; the runtimes are multi-threaded.
#![cfg(feature = "redis")]

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicU64, Ordering},
    },
    time::Duration,
};

use tokio::time::{Instant, timeout};
use tower_lock::{LockEngine, LockError, Token, engine::redis::RedisBackend};
use tower_lock_test_support::redis::{RedisServer, engine as redis_engine, residue};
use tower_lock_test_support::serial;

use crate::deadlines::past_the_servers_expiry;

/// The claim period of a hand-off with the default command timeout: the ticket TTL.
const CLAIM: Duration = Duration::from_secs(3);
/// A lease TTL far above the claim period: a grant that cost it would show.
const LONG_TTL: Duration = Duration::from_secs(60);
/// The claim period of a node with a 5 s command timeout: three times (5 s + 250 ms).
const SLOW_CLAIM: Duration = Duration::from_millis(15_750);
/// Set in a child process started by [`spawn_child`]: which role it plays.
const CHILD_ROLE: &str = "TOWER_LOCK_HANDOFF_CHILD";

async fn engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, None).await
}

/// A node whose settings differ from the default ones: a 5 s command timeout, so its
/// tickets live (and its claim period lasts) [`SLOW_CLAIM`].
async fn slow_engine(server: &RedisServer, prefix: &str) -> LockEngine {
    redis_engine(server, prefix, Some(Duration::from_secs(5))).await
}

/// Wait until `n` callers are queued for `key` (observable backend state, no event).
async fn until_waiters(engine: &LockEngine, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock(key).waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Wait until the only waiter under `prefix` listens for its grant: its channel is
/// subscribed, and a retry after that has refreshed its ticket (a grant before that retry
/// would be found by the retry, a re-entry that takes the full lease, not by the message).
/// Observable server state, no event to await.
pub(crate) async fn until_listening(server: &RedisServer, prefix: &str, key: &str) {
    let give_up = Instant::now() + Duration::from_secs(10);
    let queue = tokio::task::block_in_place(|| {
        loop {
            if let Some(q) = server
                .scan(&format!("{prefix}:*"))
                .into_iter()
                .find(|k| k.ends_with(&format!("}}:queue:{key}")))
            {
                break q;
            }
            assert!(
                Instant::now() < give_up,
                "no queue for {key} under {prefix}"
            );
            std::thread::sleep(Duration::from_millis(1));
        }
    });
    // The ticket's content (its deadline) changes with each refresh; its id, in the
    // queue, does not.
    let tickets = queue.replacen(":queue:", ":tickets:", 1);
    let id = tokio::task::block_in_place(|| server.cli(["LRANGE", &queue, "0", "0"]));
    let first = tokio::task::block_in_place(|| server.cli(["HGET", &tickets, &id]));
    loop {
        let (channels, ticket) = tokio::task::block_in_place(|| {
            (
                server.cli(["PUBSUB", "CHANNELS", &format!("{prefix}:*:wake:{key}")]),
                server.cli(["HGET", &tickets, &id]),
            )
        });
        if !channels.is_empty() && ticket != first {
            return;
        }
        assert!(Instant::now() < give_up, "the waiter never listened");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Wait until `token` holds `key` and return the remaining TTL the server reports.
async fn until_held_by(engine: &LockEngine, key: &str, token: &Token) -> Duration {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(h) = engine.lock(key).holder().await.unwrap()
            && &h.token == token
        {
            return h.ttl.expect("a handed-off lease has a TTL");
        }
        assert!(Instant::now() < give_up, "{token:?} never held {key}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Nodes with different settings on one prefix: whichever node releases, a hand-off lasts
/// the waiter's own claim period (it travels in the ticket), and the waiter's local
/// deadline is never later than the expiry the server set.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hand_off_between_nodes_with_different_settings_lasts_the_waiters_own_claim() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let default = engine(&server, "mixed").await;
    let slow = slow_engine(&server, "mixed").await;
    for (round, (from, to, claim)) in [
        (&default, &slow, SLOW_CLAIM),
        (&slow, &default, CLAIM),
        (&default, &slow, SLOW_CLAIM),
    ]
    .into_iter()
    .enumerate()
    {
        let key = format!("k{round}");
        let holder = from.lock(&key).acquire().await.unwrap();
        let waiter = {
            let (to, key) = (to.clone(), key.clone());
            tokio::spawn(async move { to.lock(&key).ttl(LONG_TTL).acquire().await })
        };
        until_waiters(from, &key, 1).await;
        until_listening(&server, "mixed", &key).await;
        holder.release().await.unwrap();
        let lease = waiter.await.unwrap().unwrap();
        // The server's expiry, read right after the hand-off (long before the first
        // renewal, due at a third of the claim).
        let pttl = from
            .lock(&key)
            .holder()
            .await
            .unwrap()
            .unwrap()
            .ttl
            .unwrap();
        assert!(
            pttl <= claim && pttl > claim - Duration::from_secs(1),
            "round {round}: the server keeps the handed-off lease for {pttl:?}, the waiter's claim is {claim:?}"
        );
        let past =
            tokio::task::block_in_place(|| past_the_servers_expiry(&server, "mixed", &key, &lease));
        assert!(
            past <= 0,
            "round {round}: the waiter trusts its lease {past} µs longer than the server keeps it"
        );
        assert!(!lease.is_lost());
        lease.release().await.unwrap();
    }
    let left = tokio::task::block_in_place(|| residue(&server, "mixed"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// A waiter whose runtime stalls (its only thread blocked) past its claim: by the time it
/// runs again, the server has expired the hand-off and the next waiter holds the key.
/// `acquire` must not return that lost lease; its wait limit ran out during the stall, so
/// it answers as a timed-out wait. Several rounds: after the stall, the waiter's grant and
/// its fallback timer are both ready, and either may be seen first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_stalled_past_its_claim_is_never_handed_a_lost_lease() {
    let _group = serial::group(module_path!()).await;
    /// The stalled waiter's lease TTL, hence the claim of its hand-off.
    const TTL: Duration = Duration::from_secs(1);
    const WAIT: Duration = Duration::from_millis(1500);
    const STALL: Duration = Duration::from_secs(2);
    let server = RedisServer::start();
    let node = engine(&server, "stalled").await;
    for round in 0..4 {
        let key = format!("k{round}");
        let holder = node.lock(&key).fifo(true).acquire().await.unwrap();
        let (stall_tx, stall_rx) = tokio::sync::oneshot::channel::<()>();
        let (stalling_tx, stalling_rx) = tokio::sync::oneshot::channel::<()>();
        let (url, k) = (server.url(), key.clone());
        // The waiter's node, on a runtime of its own with one thread.
        let stalled = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let backend = RedisBackend::builder(url)
                    .prefix("stalled")
                    .build()
                    .await
                    .unwrap();
                let engine = LockEngine::new(backend);
                let waiter = tokio::spawn(async move {
                    let lock = engine.lock(&k).fifo(true).ttl(TTL).wait(WAIT);
                    let lease = lock.acquire().await?;
                    // Judged the moment acquire returns.
                    let lost = lease.is_lost();
                    let _ = lease.release().await;
                    Ok::<_, LockError>(lost)
                });
                stall_rx.await.unwrap();
                // The trigger: the runtime's only thread blocks, nothing of it runs.
                tokio::spawn(async move {
                    stalling_tx.send(()).unwrap();
                    std::thread::sleep(STALL);
                });
                waiter.await.unwrap()
            })
        });
        until_waiters(&node, &key, 1).await;
        until_listening(&server, "stalled", &key).await;
        let behind = {
            let (node, key) = (node.clone(), key.clone());
            tokio::spawn(async move {
                let lock = node.lock(&key).fifo(true).wait(Duration::from_secs(20));
                lock.acquire().await
            })
        };
        until_waiters(&node, &key, 2).await;
        stall_tx.send(()).unwrap();
        stalling_rx.await.unwrap();
        holder.release().await.unwrap();
        // The stalled waiter's claim (its TTL) runs out on the server: the next is served.
        let next = behind.await.unwrap().expect("the queue moves on");
        let outcome = tokio::task::spawn_blocking(move || stalled.join().unwrap())
            .await
            .unwrap();
        assert!(
            matches!(outcome, Err(LockError::TimedOut { .. })),
            "round {round}: the stalled waiter's acquire answered {outcome:?} (Ok(true): a lease already lost) while the next waiter holds the key"
        );
        assert!(next.owned().await.unwrap() && !next.is_lost());
        next.release().await.unwrap();
    }
    let left = tokio::task::block_in_place(|| residue(&server, "stalled"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// The releaser is a node with a long claim period ([`SLOW_CLAIM`]); the dead waiter's own
/// claim ([`CLAIM`], the default settings) is what the key costs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_to_a_crashed_waiter_costs_at_most_its_own_claim_period() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = slow_engine(&server, "crashed").await;
    let holder = engine.lock("k").fifo(true).acquire().await.unwrap();
    let first_fence = holder.fence();

    // A FIFO waiter in another process, asking for a long lease, first in line; then
    // SIGKILLed: no cleanup runs, its ticket is still fresh when the key is released.
    let mut child = spawn_child("waiter", &server, "crashed");
    until_waiters(&engine, "k", 1).await;
    let behind = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("k")
                .fifo(true)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    until_waiters(&engine, "k", 2).await;
    child.kill().unwrap();
    child.wait().unwrap();

    let released = Instant::now();
    holder.release().await.unwrap();
    // The dead waiter was handed the key, for the claim period only.
    let dead = Token::new("crashed-child").unwrap();
    let claimed = until_held_by(&engine, "k", &dead).await;
    assert!(
        claimed <= CLAIM,
        "a dead waiter holds the key for {claimed:?}"
    );
    let lease = behind.await.unwrap().expect("the queue moves on");
    let waited = released.elapsed();
    assert!(
        waited < CLAIM + Duration::from_secs(1),
        "the next waiter waited {waited:?} (claim period {CLAIM:?}, lease TTL {LONG_TTL:?})"
    );
    assert!(lease.fence() > first_fence);
    lease.release().await.unwrap();
    let left = tokio::task::block_in_place(|| residue(&server, "crashed"));
    assert!(left.is_empty(), "residue: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_waiter_cancelled_after_its_grant_gives_the_key_back_at_once() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "cancelled").await;
    for round in 0..5 {
        let key = format!("k{round}");
        let first = engine.lock(&key).fifo(true).acquire().await.unwrap();
        let first_fence = first.fence();
        // The waiter is polled until it is queued, then never again: its grant lands
        // unseen, and then its future is dropped (a client that went away).
        let me = Token::new(format!("cancelled-{round}")).unwrap();
        let lock = engine.lock(&key).fifo(true).ttl(LONG_TTL).token(me.clone());
        let mut cancelled = tokio_test::task::spawn(async move { lock.acquire().await });
        assert!(cancelled.poll().is_pending());
        until_waiters(&engine, &key, 1).await;
        let behind = {
            let engine = engine.clone();
            let key = key.clone();
            tokio::spawn(async move { engine.lock(&key).fifo(true).acquire().await })
        };
        until_waiters(&engine, &key, 2).await;

        first.release().await.unwrap();
        until_held_by(&engine, &key, &me).await;
        let dropped = Instant::now();
        drop(cancelled);
        let lease = timeout(Duration::from_secs(10), behind)
            .await
            .expect("the next waiter is served")
            .unwrap()
            .unwrap();
        // Given back by the cancelled waiter's clean-up, not left to the claim period.
        assert!(
            dropped.elapsed() < CLAIM / 3,
            "round {round}: the next waiter waited {:?} after the cancellation",
            dropped.elapsed()
        );
        assert!(lease.fence() > first_fence);
        lease.release().await.unwrap();
    }
    let left = tokio::task::block_in_place(|| residue(&server, "cancelled"));
    assert!(left.is_empty(), "residue: {left:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_whose_message_is_lost_is_found_by_its_waiter() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    // Two nodes: the waiter's node loses its subscriber, the holder's does not matter.
    let node_a = engine(&server, "lost").await;
    let node_b = engine(&server, "lost").await;
    for round in 0..3 {
        let key = format!("k{round}");
        let first = node_a.lock(&key).fifo(true).acquire().await.unwrap();
        let first_fence = first.fence();
        let waiter = {
            let node_b = node_b.clone();
            let key = key.clone();
            tokio::spawn(async move {
                let lease = node_b.lock(&key).fifo(true).ttl(LONG_TTL).acquire().await?;
                Ok::<_, tower_lock::LockError>((Instant::now(), lease))
            })
        };
        until_waiters(&node_a, &key, 1).await;
        let channels = || server.cli(["PUBSUB", "CHANNELS", "lost:*"]);
        let give_up = Instant::now() + Duration::from_secs(5);
        while channels().is_empty() {
            assert!(Instant::now() < give_up, "the waiter never subscribed");
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        // Every subscriber connection goes: the grant is published to nobody (unless the
        // subscriber is back already; then the waiter has retried on its reconnect).
        server.cli(["CLIENT", "KILL", "TYPE", "pubsub"]);
        let released = Instant::now();
        first.release().await.unwrap();
        let (granted, lease) = waiter.await.unwrap().expect("the waiter gets its key");
        let waited = granted - released;
        assert!(
            waited < Duration::from_secs(1),
            "round {round}: found its grant after {waited:?} (claim period {CLAIM:?})"
        );
        assert!(lease.fence() > first_fence);
        assert!(lease.owned().await.unwrap());
        assert!(!lease.is_lost());
        lease.release().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handed_off_lease_is_renewed_past_its_claim() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let engine = engine(&server, "claim").await;
    let first = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("k")
                .ttl(Duration::from_secs(8))
                .auto_renew(false)
                .acquire()
                .await
        })
    };
    until_waiters(&engine, "k", 1).await;
    first.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    // Held through and past the claim period, with no renewal asked for: the engine turns
    // the claim into the full lease by itself.
    tokio::time::sleep(CLAIM + Duration::from_millis(500)).await;
    assert!(
        !lease.is_lost(),
        "the lease was lost at the end of its claim"
    );
    assert!(lease.owned().await.unwrap());
    lease.release().await.unwrap();
}

/// Many nodes, many waiters, FIFO and not, some waiters giving up around their grant:
/// never two holders at once, fences rising in grant order, run after run.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn exclusion_and_fences_hold_across_nodes_run_after_run() {
    let _group = serial::group(module_path!()).await;
    const NODES: usize = 4;
    const WORKERS: usize = 12;
    const CYCLES: usize = 25;
    let server = RedisServer::start();
    let mut nodes = Vec::new();
    for _ in 0..NODES {
        nodes.push(engine(&server, "soak").await);
    }
    for round in 0..6 {
        let fifo = round % 2 == 0;
        let key = format!("k{round}");
        let inside = Arc::new(AtomicBool::new(false));
        let violations = Arc::new(AtomicU64::new(0));
        // The fence of each grant, pushed while holding: grant order.
        let grants = Arc::new(Mutex::new(Vec::<u64>::new()));
        let mut tasks = Vec::new();
        for w in 0..WORKERS {
            let node = nodes[w % NODES].clone();
            let (key, inside, violations, grants) = (
                key.clone(),
                inside.clone(),
                violations.clone(),
                grants.clone(),
            );
            tasks.push(tokio::spawn(async move {
                for c in 0..CYCLES {
                    let lock = node.lock(&key).fifo(fifo);
                    // Every fifth attempt of some workers gives up quickly: a cancellation
                    // racing with its grant.
                    let lease = if (w + c) % 5 == 0 {
                        match timeout(Duration::from_micros(700), lock.acquire()).await {
                            Ok(lease) => lease.unwrap(),
                            Err(_) => continue,
                        }
                    } else {
                        lock.acquire().await.unwrap()
                    };
                    if inside.swap(true, Ordering::SeqCst) {
                        violations.fetch_add(1, Ordering::SeqCst);
                    }
                    grants.lock().unwrap().push(lease.fence().get());
                    tokio::task::yield_now().await;
                    inside.store(false, Ordering::SeqCst);
                    lease.release().await.unwrap();
                }
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        assert_eq!(violations.load(Ordering::SeqCst), 0, "round {round}");
        let grants = grants.lock().unwrap();
        assert!(
            grants.windows(2).all(|w| w[0] < w[1]),
            "round {round}: fences did not rise in grant order"
        );
    }
    let give_up = Instant::now() + Duration::from_secs(3);
    loop {
        let left = tokio::task::block_in_place(|| residue(&server, "soak"));
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < give_up, "residue: {left:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// FIFO across nodes with waiters leaving the queue: queued ones cancelled, and one
/// cancelled after the key was handed to it. Those who stayed are served in arrival order,
/// round after round.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifo_order_survives_cancellations_around_hand_offs() {
    let _group = serial::group(module_path!()).await;
    const WAITERS: usize = 9;
    let server = RedisServer::start();
    let mut nodes = Vec::new();
    for _ in 0..3 {
        nodes.push(engine(&server, "order").await);
    }
    for round in 0..4 {
        let key = format!("k{round}");
        let holder = nodes[0].lock(&key).fifo(true).acquire().await.unwrap();
        let order = Arc::new(Mutex::new(Vec::new()));
        let mut tasks = Vec::new();
        // The first in line is never polled after it queued: it is handed the key unseen
        // and then dropped.
        let lock = nodes[1].lock(&key).fifo(true).ttl(LONG_TTL);
        let mut unseen = tokio_test::task::spawn(async move { lock.acquire().await });
        assert!(unseen.poll().is_pending());
        until_waiters(&nodes[0], &key, 1).await;
        for i in 0..WAITERS {
            let (node, k, order) = (nodes[i % 3].clone(), key.clone(), order.clone());
            tasks.push(tokio::spawn(async move {
                let lease = node.lock(&k).fifo(true).acquire().await.unwrap();
                order.lock().unwrap().push(i);
                lease.release().await.unwrap();
            }));
            // Arrival order is defined once the waiter is queued.
            until_waiters(&nodes[0], &key, i + 2).await;
        }
        // Two queued waiters leave (round-dependent positions).
        let gone = [(round + 1) % WAITERS, (round + 4) % WAITERS];
        for &g in &gone {
            tasks[g].abort();
        }
        until_waiters(&nodes[0], &key, WAITERS + 1 - gone.len()).await;
        let fence = holder.fence();
        holder.release().await.unwrap();
        drop(unseen);
        for (i, t) in tasks.into_iter().enumerate() {
            match t.await {
                Ok(()) => assert!(!gone.contains(&i)),
                Err(e) => assert!(e.is_cancelled() && gone.contains(&i)),
            }
        }
        let expected: Vec<usize> = (0..WAITERS).filter(|i| !gone.contains(i)).collect();
        assert_eq!(*order.lock().unwrap(), expected, "round {round}");
        let after = nodes[2].lock(&key).try_acquire().await.unwrap();
        assert!(after.fence() > fence);
        after.release().await.unwrap();
    }
    let left = tokio::task::block_in_place(|| residue(&server, "order"));
    assert!(left.is_empty(), "residue: {left:?}");
}

/// Re-run this test binary as a child process playing `role` (see [`child_process_entry`]).
fn spawn_child(role: &str, server: &RedisServer, prefix: &str) -> std::process::Child {
    let url = server.url();
    let env = [
        (CHILD_ROLE, role),
        ("TOWER_LOCK_TEST_REDIS", url.as_str()),
        ("TOWER_LOCK_TEST_PREFIX", prefix),
    ];
    crate::child::rerun(module_path!(), "child_process_entry", &env)
}

/// The entry point of child processes; in the parent run it checks nothing and returns.
#[tokio::test]
async fn child_process_entry() {
    let Ok(role) = std::env::var(CHILD_ROLE) else {
        return;
    };
    let url = std::env::var("TOWER_LOCK_TEST_REDIS").unwrap();
    let prefix = std::env::var("TOWER_LOCK_TEST_PREFIX").unwrap();
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    match role.as_str() {
        "waiter" => {
            // Wait until killed.
            let _ = engine
                .lock("k")
                .fifo(true)
                .ttl(LONG_TTL)
                .token(Token::new("crashed-child").unwrap())
                .acquire()
                .await;
            unreachable!("the parent never releases to this waiter while it lives");
        }
        other => panic!("unknown child role {other}"),
    }
}
