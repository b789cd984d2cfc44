//! The schedule on Redis standalone and on a Redis Cluster.

use std::{sync::Arc, thread, time::Duration};

use rand::{RngExt, rngs::StdRng};
use tower_lock::LockEngine;
use tower_lock_test_support::history::Recorder;
use tower_lock_test_support::redis::{RedisServer, residue};
use tower_lock_test_support::serial;

use super::{
    Faults, LONGEST_PAUSE, Registers,
    holder::{holder_fault, wall_nanos},
    schedule,
};

/// Redis standalone: restarts, suspensions, pauses, killed connections, frozen holders.
struct Standalone {
    redis: Arc<RedisServer>,
    register: String,
    origin_wall: u64,
    holders: std::sync::atomic::AtomicU32,
}

impl Faults for Standalone {
    fn inject(&self, rng: &mut StdRng, recorder: &Recorder) -> String {
        let pause = Duration::from_millis(rng.random_range(50..LONGEST_PAUSE.as_millis() as u64));
        match rng.random_range(0..5) {
            0 => {
                let began = recorder.now();
                self.redis.restart();
                recorder.outage(began);
                "restart".to_owned()
            }
            which @ 1..=3 => server_fault(&self.redis, which - 1, pause),
            _ => {
                let n = self
                    .holders
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                holder_fault(
                    rng,
                    recorder,
                    (&[self.redis.url()], &self.register, self.origin_wall),
                    n,
                )
            }
        }
    }
}

/// One of the faults every server takes, `which` in `0..3`: suspended (SIGSTOP) for
/// `pause`, paused (`CLIENT PAUSE`) for `pause`, or every client connection killed.
fn server_fault(server: &RedisServer, which: u32, pause: Duration) -> String {
    let port = server.port();
    match which {
        0 => {
            server.suspend();
            thread::sleep(pause);
            server.resume();
            format!("SIGSTOP {port} {pause:?}")
        }
        1 => {
            let ms = pause.as_millis().to_string();
            server.cli(["CLIENT", "PAUSE", &ms, "ALL"]);
            format!("CLIENT PAUSE {port} {pause:?}")
        }
        _ => {
            server.cli(["CLIENT", "KILL", "TYPE", "normal"]);
            server.cli(["CLIENT", "KILL", "TYPE", "pubsub"]);
            format!("connections of {port} killed")
        }
    }
}

/// The recorder, and the wall-clock instant of its origin (for holder processes' stamps).
pub(super) fn recorder_with_wall_origin() -> (Recorder, u64) {
    let recorder = Recorder::new();
    let wall = wall_nanos() - u64::try_from(recorder.now().as_nanos()).unwrap();
    (recorder, wall)
}

/// A Redis server for the registers, which no fault touches, and a connection to it.
pub(super) async fn register_server() -> (RedisServer, Registers) {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let conn = client.get_multiplexed_async_connection().await.unwrap();
    (server, Registers::Redis(conn))
}

/// Waits until `left()` names nothing (leases of killed holders and waiters' tickets
/// lapse by their TTLs).
pub(super) fn no_residue(left: impl Fn() -> Vec<String>) {
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let keys = left();
        if keys.is_empty() {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "kept {keys:?} after the schedule"
        );
        thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn redis_fault_schedule_keeps_every_check() {
    let _group = serial::group_blocking(concat!(module_path!(), "::standalone"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (_register_server, registers) = runtime.block_on(register_server());
    let register = _register_server.url();
    let redis = Arc::new(RedisServer::start());
    let (recorder, origin_wall) = recorder_with_wall_origin();
    let url = redis.url();
    let make = move |n: u32| {
        let url = url.clone();
        Box::pin(async move {
            let backend = tower_lock::engine::redis::RedisBackend::builder(url)
                .prefix("fault")
                .command_timeout(Duration::from_millis(150 + 100 * u64::from(n)))
                .build()
                .await
                .expect("connect to the schedule's redis-server");
            LockEngine::new(backend)
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>
    };
    let faults = Standalone {
        redis: redis.clone(),
        register,
        origin_wall,
        holders: Default::default(),
    };
    schedule("redis", make, &registers, (recorder, &faults));
    no_residue(|| residue(&redis, "fault"));
}

/// Redis Cluster: a primary suspended (under the node timeout), paused, or its connections
/// killed; frozen holders.
#[cfg(feature = "redis-cluster")]
struct Clustered {
    cluster: Arc<tower_lock_test_support::redis::RedisCluster>,
    register: String,
    origin_wall: u64,
    holders: std::sync::atomic::AtomicU32,
}

#[cfg(feature = "redis-cluster")]
impl Faults for Clustered {
    fn inject(&self, rng: &mut StdRng, recorder: &Recorder) -> String {
        let pause = Duration::from_millis(rng.random_range(50..LONGEST_PAUSE.as_millis() as u64));
        let primaries = self.cluster.primaries();
        let primary = primaries[rng.random_range(0..primaries.len())];
        match rng.random_range(0..4) {
            // A pause stays well under the cluster's node timeout (1 s): no failover.
            which @ 0..=2 => server_fault(primary, which, pause),
            _ => {
                let n = self
                    .holders
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                holder_fault(
                    rng,
                    recorder,
                    (&self.cluster.urls(), &self.register, self.origin_wall),
                    n,
                )
            }
        }
    }
}

#[cfg(feature = "redis-cluster")]
#[test]
fn cluster_fault_schedule_keeps_every_check() {
    let _group = serial::group_blocking(concat!(module_path!(), "::cluster"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (_register_server, registers) = runtime.block_on(register_server());
    let register = _register_server.url();
    // A cluster of the test's own: the faults disturb it.
    let cluster = Arc::new(tower_lock_test_support::redis::RedisCluster::start());
    let (recorder, origin_wall) = recorder_with_wall_origin();
    let urls = cluster.urls();
    let make = move |n: u32| {
        let urls = urls.clone();
        Box::pin(async move {
            let backend = tower_lock::engine::redis::RedisBackend::cluster(urls)
                .prefix("fault")
                .command_timeout(Duration::from_millis(150 + 100 * u64::from(n)))
                .build()
                .await
                .expect("connect to the schedule's cluster");
            LockEngine::new(backend)
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>
    };
    let faults = Clustered {
        cluster: cluster.clone(),
        register,
        origin_wall,
        holders: Default::default(),
    };
    schedule("cluster", make, &registers, (recorder, &faults));
    no_residue(|| {
        cluster
            .scan("fault:*")
            .into_iter()
            .filter(|k| !tower_lock_test_support::redis::is_fence_tombstone(k))
            .collect()
    });
}
