//! Grants matched by a registration nonce, not a clock, and registrations that are safe to
//! send twice. A waiter's registration carries a fresh random nonce, which its ticket keeps
//! (a refresh keeps it too); the grant names it, and the waiter accepts only a grant naming
//! its current registration's. What must hold:
//! - a registration sent twice (redis-rs's Cluster client re-sends a request whose node
//!   connection dropped) leaves one ticket, and the key, handed to it, leaves none behind;
//! - a grant naming an older registration of the waiter's ticket (one that lapsed before
//!   it registered again) is ignored, whatever it names: no clock decides;
//! - a release sent twice answers released both times.
//!
//! The re-send is the very command the engine sent, read from `MONITOR` and sent again
//! with `redis-cli`; the stale grant is published on the key's channel by hand.
#![cfg(feature = "redis")]

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::Duration,
};

use tower_lock::LockEngine;
use tower_lock_test_support::redis::{RedisServer, engine};
use tower_lock_test_support::serial;

/// `redis-cli MONITOR` on `server`, its lines sent on a channel by a reader thread.
struct Monitor {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Monitor {
    fn start(server: &RedisServer) -> Self {
        let mut child = Command::new("redis-cli")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &server.port().to_string(),
                "MONITOR",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run redis-cli MONITOR");
        let out = child.stdout.take().expect("piped stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        // `OK` comes first, once the monitor is attached.
        let first = lines
            .recv_timeout(Duration::from_secs(5))
            .expect("MONITOR attached");
        assert_eq!(first, "OK");
        Self { child, lines }
    }

    /// The arguments of the next `EVALSHA` that registers ticket-carrying waiter (its
    /// `ARGV[3]`, the ticket id, not empty): `[EVALSHA, sha, numkeys, keys…, argv…]`.
    fn registration(&self) -> Vec<String> {
        loop {
            let line = self
                .lines
                .recv_timeout(Duration::from_secs(10))
                .expect("a registration went out");
            let args = quoted(&line);
            if args.first().map(String::as_str) != Some("EVALSHA") || args.len() < 4 {
                continue;
            }
            let keys: usize = args[2].parse().unwrap();
            // An acquire: the token, the TTL, the ticket id, flags, …
            if args.len() >= 3 + keys + 7 && !args[3 + keys + 2].is_empty() {
                return args;
            }
        }
    }
}

impl Drop for Monitor {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The quoted arguments of one `MONITOR` line (the engine's are plain ASCII: no escapes).
fn quoted(line: &str) -> Vec<String> {
    line.split('"')
        .skip(1)
        .step_by(2)
        .map(str::to_owned)
        .collect()
}

/// Waits until `node` counts `n` waiters of `key`.
async fn until_waiters(node: &LockEngine, key: &str, n: usize) {
    let give_up = tokio::time::Instant::now() + Duration::from_secs(10);
    while node.lock(key).waiters().await.unwrap() != n {
        assert!(tokio::time::Instant::now() < give_up, "never {n} waiters");
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_sent_twice_leaves_one_ticket() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let node = engine(&server, "twice", None).await;
    let holder = node.lock("k").acquire().await.unwrap();
    let monitor = Monitor::start(&server);
    let waiter = {
        let node = node.clone();
        tokio::spawn(async move {
            let lease = node.lock("k").wait(Duration::from_secs(10)).acquire().await;
            lease.unwrap()
        })
    };
    let sent = tokio::task::block_in_place(|| monitor.registration());
    until_waiters(&node, "k", 1).await;
    // The same command again, as the Cluster client's re-send would.
    let again = tokio::task::block_in_place(|| server.cli(&sent));
    assert!(
        again.contains('0'),
        "the re-sent registration waits: {again}"
    );
    assert_eq!(
        node.lock("k").waiters().await.unwrap(),
        1,
        "a registration sent twice queued two tickets"
    );
    let fence = holder.fence();
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap();
    assert!(lease.fence() > fence);
    assert_eq!(node.lock("k").waiters().await.unwrap(), 0, "a copy is left");
    lease.release().await.unwrap();
    // Nothing is left to be handed the key: the next acquire takes it at once.
    let next = node.lock("k").try_acquire().await.expect("the key is free");
    next.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_naming_an_older_registration_is_ignored() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let node = engine(&server, "stale", None).await;
    let holder = node.lock("k").acquire().await.unwrap();
    let monitor = Monitor::start(&server);
    let waiter = {
        let node = node.clone();
        tokio::spawn(async move { node.lock("k").wait(Duration::from_secs(10)).acquire().await })
    };
    let sent = tokio::task::block_in_place(|| monitor.registration());
    drop(monitor);
    until_waiters(&node, "k", 1).await;
    let keys: usize = sent[2].parse().unwrap();
    let (ticket, first_nonce) = (&sent[3 + keys + 2], &sent[3 + keys + 6]);
    // Its registration lapses (as one granted and never claimed would), and the waiter's
    // next refresh registers the ticket anew, with another nonce.
    let tickets = server
        .scan("stale:*:tickets:k")
        .pop()
        .expect("the tickets hash");
    let queue = tickets.replacen(":tickets:", ":queue:", 1);
    server.cli(["HDEL", &tickets, ticket]);
    server.cli(["LREM", &queue, "0", ticket]);
    let give_up = tokio::time::Instant::now() + Duration::from_secs(5);
    loop {
        let now = server.cli(["HGET", &tickets, ticket]);
        if !now.is_empty() {
            assert!(!now.starts_with(&format!("{first_nonce}|")), "{now}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < give_up,
            "never registered again"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // The grant of the older registration arrives now, late: whatever a clock would say
    // of it, it names a registration that is not the waiter's current one.
    let channel = tickets.replacen(":tickets:", ":wake:", 1);
    let stale = format!("{ticket}|{first_nonce} 7 30000");
    assert_eq!(server.cli(["PUBLISH", &channel, &stale]), "1");
    let early = tokio::time::timeout(Duration::from_millis(600), async {
        while !waiter.is_finished() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(early.is_err(), "the waiter took a stale grant");
    assert!(holder.owned().await.unwrap());
    let fence = holder.fence();
    holder.release().await.unwrap();
    let lease = waiter.await.unwrap().unwrap();
    assert!(lease.fence() > fence, "granted by the release");
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_sent_twice_reports_released() {
    let _group = serial::group(module_path!()).await;
    let server = RedisServer::start();
    let node = engine(&server, "release-twice", None).await;
    let lease = node.lock("k").acquire().await.unwrap();
    let monitor = Monitor::start(&server);
    lease.release().await.unwrap();
    let release = tokio::task::block_in_place(|| {
        loop {
            let line = monitor.lines.recv_timeout(Duration::from_secs(5)).unwrap();
            let args = quoted(&line);
            if args.first().map(String::as_str) == Some("EVALSHA") {
                break args;
            }
        }
    });
    // The same command again: released (1), not "nobody holds it" (0).
    assert_eq!(server.cli(&release), "1");
}
