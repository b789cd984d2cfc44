//! Holder processes: this test binary run again, holding a lock (on Redis, a Cluster or
//! Postgres) until the schedule freezes it past its TTL, then resumes or kills it.

use std::{
    io::{BufRead, BufReader},
    process::{Child, Command, Stdio},
    thread,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use rand::{RngExt, rngs::StdRng};
use tokio::time::Instant;
use tower_lock::LockEngine;
use tower_lock_test_support::history::{Acquisition, Grant, Mode, Recorder, Write};

use super::{CHILD_TTL, LOCK_KEYS, Registers};

/// Nanoseconds since the Unix epoch: the clock a holder process and the test share (one
/// machine), converted to the history's offsets through the recorder's origin.
pub(super) fn wall_nanos() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos(),
    )
    .unwrap()
}

/// A holder process: this test binary run again as [`holder_process_role`], for `key` on
/// the servers `urls` (several: a Cluster), its register on `register`.
struct HolderProcess {
    child: Child,
    lines: std::sync::mpsc::Receiver<String>,
}

impl HolderProcess {
    fn spawn(urls: &[String], register: &str, key: &str) -> Self {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "fault_schedule::holder::holder_process_role",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FAULT_HOLDER_URLS", urls.join(","))
            .env("FAULT_HOLDER_REGISTER", register)
            .env("FAULT_HOLDER_KEY", key)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a holder process");
        let out = BufReader::new(child.stdout.take().unwrap());
        let (tx, lines) = std::sync::mpsc::channel();
        thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                // libtest may have printed the test's name on the line before it.
                if let Some((_, event)) = line.split_once("FAULT ") {
                    let _ = tx.send(event.to_owned());
                }
            }
        });
        Self { child, lines }
    }

    fn signal(&self, signal: &str) -> bool {
        Command::new("kill")
            .args([signal, &self.child.id().to_string()])
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }
}

/// One holder process's run: spawned, granted, frozen past its TTL, then resumed (it
/// writes with its fence and releases) or killed. Recorded in the history.
pub(super) fn holder_fault(
    rng: &mut StdRng,
    recorder: &Recorder,
    (urls, register, origin_wall): (&[String], &str, u64),
    n: u32,
) -> String {
    let key = LOCK_KEYS[rng.random_range(0..LOCK_KEYS.len())];
    let invoked = recorder.now();
    let mut holder = HolderProcess::spawn(urls, register, key);
    let offset = |ns: &str| Duration::from_nanos(ns.parse::<u64>().unwrap() - origin_wall);
    let granted = holder.lines.recv_timeout(Duration::from_secs(10));
    let Ok(granted) = granted else {
        let _ = holder.child.kill();
        let _ = holder.child.wait();
        return format!("holder {n} never granted {key}");
    };
    // The process is frozen as soon as its grant is seen: its hold ends there.
    holder.signal("-STOP");
    let frozen = recorder.now();
    let f: Vec<&str> = granted.split(' ').collect();
    // granted <fence> <token> <completed ns> <valid until ns>
    let fence: u64 = f[1].parse().unwrap();
    let acquisition = Acquisition {
        process: 100 + n,
        task: 0,
        key: key.to_owned(),
        mode: Mode::Exclusive,
        fifo: false,
        invoked,
        completed: offset(f[3]),
        grant: Some(Grant {
            token: f[2].to_owned(),
            fence,
            granted_until: offset(f[4]),
            lost_at: None,
            // Frozen before it could act: its hold ends there (`max`: the grant line may be
            // read a moment after the process stamped its completion).
            released: Some(frozen.max(offset(f[3]))),
        }),
    };
    thread::sleep(CHILD_TTL + Duration::from_millis(rng.random_range(50..500)));
    let what = if rng.random_bool(0.5) {
        let _ = holder.child.kill();
        "killed"
    } else {
        holder.signal("-CONT");
        // write <fence> <read> <accepted> <invoked ns> <completed ns> | refused
        if let Ok(line) = holder.lines.recv_timeout(Duration::from_secs(10)) {
            let w: Vec<&str> = line.split(' ').collect();
            if w[0] == "write" {
                recorder.write(Write {
                    process: 100 + n,
                    task: 0,
                    key: key.to_owned(),
                    fence,
                    read: w[2].parse().unwrap(),
                    value: w[2].parse::<u64>().unwrap() + 1,
                    accepted: w[3] == "1",
                    invoked: offset(w[4]),
                    completed: offset(w[5]),
                });
            }
        }
        "resumed"
    };
    let _ = holder.child.wait();
    recorder.record(acquisition);
    format!("holder {n} of {key} frozen past its TTL and {what}")
}

/// The engine of a holder process on `urls`: a Postgres URL's schema, a Cluster (several
/// URLs) or a Redis server.
async fn engine(urls: Vec<String>) -> LockEngine {
    #[cfg(feature = "postgres")]
    if urls[0].starts_with("postgres://") {
        let timeout = Duration::from_millis(500);
        return LockEngine::new(super::postgres::backend(urls[0].clone(), timeout).await);
    }
    let backend = if urls.len() > 1 {
        tower_lock::engine::redis::RedisBackend::cluster(urls)
    } else {
        tower_lock::engine::redis::RedisBackend::builder(urls[0].clone())
    }
    .prefix("fault")
    .build()
    .await
    .unwrap();
    LockEngine::new(backend)
}

/// The role a [`HolderProcess`] plays: it does nothing unless the schedule spawned it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn holder_process_role() {
    let (Ok(urls), Ok(register), Ok(key)) = (
        std::env::var("FAULT_HOLDER_URLS"),
        std::env::var("FAULT_HOLDER_REGISTER"),
        std::env::var("FAULT_HOLDER_KEY"),
    ) else {
        return;
    };
    let urls: Vec<String> = urls.split(',').map(str::to_owned).collect();
    let engine = engine(urls).await;
    let lease = engine
        .lock(&key)
        .ttl(CHILD_TTL)
        .wait(Duration::from_secs(8))
        .acquire()
        .await
        .unwrap();
    // The wall clock read with the monotonic one: both move alike over a run's seconds.
    let completed = wall_nanos();
    let left = lease
        .valid_until()
        .saturating_duration_since(Instant::now());
    let until = completed + u64::try_from(left.as_nanos()).unwrap();
    println!(
        "FAULT granted {} {} {completed} {until}",
        lease.fence(),
        lease.token().as_str()
    );
    // Frozen here by the schedule, some time past the TTL.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let client = redis::Client::open(register).unwrap();
    let registers = Registers::Redis(client.get_multiplexed_async_connection().await.unwrap());
    let fence = lease.fence().get();
    if let Some(read) = registers.call(&key, fence, None).await {
        let invoked = wall_nanos();
        let accepted = registers.call(&key, fence, Some(read + 1)).await.is_some();
        println!(
            "FAULT write {fence} {read} {} {invoked} {}",
            u8::from(accepted),
            wall_nanos()
        );
    } else {
        println!("FAULT refused");
    }
    let _ = lease.release().await;
}
