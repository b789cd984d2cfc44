//! A waiter's refresh that timed out is still on its way (the engine lets a statement land
//! rather than guess what it did): it may reach the database after the acquire has ended.
//! Landing then, it must not register the waiter's ticket again or take the key for a
//! caller that is gone. Here one of the waiter's two pooled connections is frozen (its
//! backend stopped with SIGSTOP) while the waiter refreshes every 250 ms: a refresh is sent
//! to it and times out, the acquire ends (its wait runs out, or it is granted and the lease
//! released), and only then does the frozen backend run the refresh.

use std::{process::Command, sync::Arc, time::Duration};

use tokio::{task::JoinHandle, time::Instant};
use tower_lock::engine::{Lease, LockEngine, LockError, postgres::PostgresBackend};
use tower_lock_test_support::postgres::PostgresServer;

async fn psql(server: &Arc<PostgresServer>, sql: String) -> String {
    let server = server.clone();
    tokio::task::spawn_blocking(move || server.psql(&sql))
        .await
        .unwrap()
}

fn signal(signal: &str, pid: &str) {
    let status = Command::new("kill").args([signal, pid]).status().unwrap();
    assert!(status.success(), "kill {signal} {pid}");
}

/// A server one of whose backends (`pid`) is frozen, the holder's node and the waiter's.
struct Frozen {
    server: Arc<PostgresServer>,
    holder_node: LockEngine,
    // Kept: a node that is dropped closes its pool, and its statements with it.
    _waiter_node: LockEngine,
    pid: String,
}

/// The key's holder, and a waiter on another node.
type Started = (Frozen, Lease, JoinHandle<Result<Lease, LockError>>);

impl Frozen {
    /// Once this returns, a refresh of the waiter (waiting up to `wait`) has been sent to
    /// the frozen backend: its bytes sit unread in that backend's socket.
    /// `timeout` is the waiter node's call timeout.
    async fn start(wait: Duration, timeout: Duration) -> Started {
        let server = Arc::new(
            tokio::task::spawn_blocking(PostgresServer::start)
                .await
                .unwrap(),
        );
        let builder = PostgresBackend::builder(server.url()).schema("late");
        builder.migrate().await.unwrap();
        let holder_node = LockEngine::new(builder.build().await.unwrap());
        // The waiter's node: two pooled connections, named so that the test finds them.
        let waiter_node = LockEngine::new(
            PostgresBackend::builder(format!("{}?application_name=late_waiter", server.url()))
                .schema("late")
                .pool_size(2)
                .command_timeout(timeout)
                .build()
                .await
                .unwrap(),
        );
        let holder = holder_node
            .lock("k")
            .ttl(Duration::from_secs(60))
            .acquire()
            .await
            .unwrap();
        // Both of the waiter node's pooled connections open.
        let (first, second) = (waiter_node.lock("k"), waiter_node.lock("k"));
        let (a, b) = tokio::join!(first.holder(), second.holder());
        a.unwrap();
        b.unwrap();
        let waiter = {
            let lock = waiter_node.lock("k").wait(wait);
            tokio::spawn(async move { lock.acquire().await })
        };
        let give_up = Instant::now() + Duration::from_secs(10);
        while holder_node.lock("k").waiters().await.unwrap() != 1 {
            assert!(Instant::now() < give_up, "the waiter never queued");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        // Freeze one pooled connection's backend (not the listener's): the pool hands its
        // idle connections out in turn, so one of the next refreshes is sent to it.
        let found = psql(
            &server,
            "SELECT pid || ' ' || client_port FROM pg_stat_activity \
             WHERE application_name = 'late_waiter' AND query NOT LIKE 'LISTEN%' \
             ORDER BY pid LIMIT 1"
                .to_owned(),
        )
        .await;
        let (pid, client_port) = found
            .split_once(' ')
            .expect("no pooled connection of the waiter's node");
        let (pid, client_port) = (pid.to_owned(), client_port.to_owned());
        signal("-STOP", &pid);
        until_unread_input(server.port(), &client_port).await;
        let frozen = Self {
            server,
            holder_node,
            _waiter_node: waiter_node,
            pid,
        };
        (frozen, holder, waiter)
    }

    /// Let the frozen backend run what it was sent, and wait until it has.
    async fn thaw(&self) {
        signal("-CONT", &self.pid);
        let give_up = Instant::now() + Duration::from_secs(10);
        loop {
            let sql = format!(
                "SELECT state FROM pg_stat_activity WHERE pid = {}",
                self.pid
            );
            let state = psql(&self.server, sql).await;
            if state == "idle" {
                return;
            }
            assert!(Instant::now() < give_up, "backend stays {state:?}");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Nobody holds the key and nobody waits for it, within `within`.
    async fn assert_left_nothing(&self, within: Duration) {
        let lock = self.holder_node.lock("k");
        let give_up = Instant::now() + within;
        loop {
            let (holder, waiters) = (lock.holder().await.unwrap(), lock.waiters().await.unwrap());
            if holder.is_none() && waiters == 0 {
                return;
            }
            assert!(
                Instant::now() < give_up,
                "left for a caller that is gone: holder {holder:?}, {waiters} waiting"
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

/// Until the frozen backend's connection (the server on `port`, the client's end on
/// `client_port`) has input the backend has not read: `ss`'s receive queue of the server's
/// side. That connection's own, not any: on a loaded machine another connection's queue
/// holds a statement for a moment too, and the test went on before a refresh was sent to
/// the frozen backend, whose idle connection the pool then gave to the lease's release.
async fn until_unread_input(port: u16, client_port: &str) {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        let out = Command::new("ss")
            .args([
                "-tnH",
                "state",
                "established",
                "(",
                "sport",
                "=",
                &format!(":{port}"),
                "and",
                "dport",
                "=",
                &format!(":{client_port}"),
                ")",
            ])
            .output()
            .expect("run ss");
        let unread = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok())
            .any(|recv_q| recv_q > 0);
        if unread {
            return;
        }
        assert!(
            Instant::now() < give_up,
            "no refresh was sent to the frozen backend"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_lands_after_its_wait_ran_out_leaves_nothing() {
    // A call timeout short enough that the frozen refresh times out within the wait.
    let (frozen, holder, waiter) =
        Frozen::start(Duration::from_secs(3), Duration::from_secs(1)).await;
    let waited = waiter.await.unwrap();
    assert!(
        matches!(waited, Err(LockError::TimedOut { .. })),
        "the wait runs out: {waited:?}"
    );
    holder.release().await.unwrap();
    frozen.thaw().await;
    frozen.assert_left_nothing(Duration::from_secs(2)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refresh_that_lands_after_its_lease_was_released_leaves_nothing() {
    // The frozen refresh is still in flight when the grant arrives, whether or not its
    // call timed out: the call timeout only bounds the release on the other connection,
    // which on a loaded machine (three test binaries, each starting servers) took more
    // than 300 ms and then 1 s in CI. The grant comes from the holder's release; the
    // waiter's own release must land before the thaw for this test to mean anything.
    let (frozen, holder, waiter) =
        Frozen::start(Duration::from_secs(20), Duration::from_secs(5)).await;
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().expect("the waiter is handed the key");
    lease.release().await.unwrap();
    frozen.thaw().await;
    frozen.assert_left_nothing(Duration::from_secs(2)).await;
}
