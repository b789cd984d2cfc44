//! A waiter whose process was killed while it waited: this test binary run again, queued
//! for a key (a lock, or one permit of one), then SIGKILLed, so no clean-up runs and its
//! ticket stays in the queue until its deadline passes by the server clock.

use std::time::Duration;

use tokio::time::Instant;
use tower_lock::{LockEngine, Token, engine::redis::RedisBackend};
use tower_lock_test_support::redis::RedisServer;

/// Set in the child process: what it waits for (`lock` or `permit`).
const ROLE: &str = "TOWER_LOCK_VANISHED_WAITER";
/// The vanished waiter's lease TTL: far above its claim period, so a grant that cost it
/// would show.
const LONG_TTL: Duration = Duration::from_secs(60);

/// What the vanished waiter queued for.
#[derive(Clone, Copy)]
pub(crate) enum Kind {
    /// `engine.lock(key).fifo(true)`.
    Lock,
    /// `engine.lock(key).shared(1).fifo(true)`.
    Permit,
}

/// How many live waiters `observer` sees for `key`.
pub(crate) async fn waiters(observer: &LockEngine, kind: Kind, key: &str) -> usize {
    match kind {
        Kind::Lock => observer.lock(key).waiters().await.unwrap(),
        Kind::Permit => observer.lock(key).shared(1).waiters().await.unwrap(),
    }
}

/// Wait until `observer` sees `n` live waiters for `key` (backend state, no event).
pub(crate) async fn until_waiters(observer: &LockEngine, kind: Kind, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while waiters(observer, kind, key).await != n {
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// Queue a waiter for `key` under `prefix` in another process, FIFO, with the token
/// `token` and the default settings (claim period 3 s), and kill it (SIGKILL) once its
/// ticket is queued; returns when it is dead.
pub(crate) async fn queue_and_kill(
    server: &RedisServer,
    observer: &LockEngine,
    prefix: &str,
    key: &str,
    kind: Kind,
    token: &str,
) {
    let before = waiters(observer, kind, key).await;
    let role = match kind {
        Kind::Lock => "lock",
        Kind::Permit => "permit",
    };
    let url = server.url();
    let env = [
        (ROLE, role),
        ("TOWER_LOCK_TEST_REDIS", url.as_str()),
        ("TOWER_LOCK_TEST_PREFIX", prefix),
        ("TOWER_LOCK_TEST_KEY", key),
        ("TOWER_LOCK_TEST_TOKEN", token),
    ];
    let mut child = crate::child::rerun(module_path!(), "vanished_waiter_entry", &env);
    until_waiters(observer, kind, key, before + 1).await;
    child.kill().unwrap();
    child.wait().unwrap();
}

/// The entry point of the child process; in the parent run it checks nothing and returns.
#[tokio::test]
async fn vanished_waiter_entry() {
    let Ok(role) = std::env::var(ROLE) else {
        return;
    };
    let var = |name: &str| std::env::var(name).unwrap();
    let backend = RedisBackend::builder(var("TOWER_LOCK_TEST_REDIS"))
        .prefix(var("TOWER_LOCK_TEST_PREFIX"))
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    let (key, token) = (
        var("TOWER_LOCK_TEST_KEY"),
        Token::new(var("TOWER_LOCK_TEST_TOKEN")).unwrap(),
    );
    let wait = Duration::from_secs(60);
    let outcome = match role.as_str() {
        "lock" => engine
            .lock(&key)
            .fifo(true)
            .ttl(LONG_TTL)
            .wait(wait)
            .token(token)
            .acquire()
            .await
            .map(drop),
        "permit" => engine
            .lock(&key)
            .shared(1)
            .fifo(true)
            .ttl(LONG_TTL)
            .wait(wait)
            .token(token)
            .acquire()
            .await
            .map(drop),
        other => panic!("unknown role {other}"),
    };
    unreachable!("the parent kills this waiter before it is served: {outcome:?}");
}
