//! The schedule on Postgres: the server killed (an immediate shutdown, as `pg_ctl stop -m
//! immediate`) and restarted, frozen (every process SIGSTOPped), the pool's connections and
//! the listeners' killed (`pg_terminate_backend`), and holder processes frozen past their
//! TTL then resumed or killed.
//!
//! Postgres keeps every grant it reported through a crash (each lease-changing call
//! commits synchronously), so a restart is not recorded as a loss of state for exclusion,
//! fences or the register. It is recorded as an outage for the FIFO check only: the
//! restart keeps the server down longer than the slack, and callers that arrive meanwhile
//! take their tickets when it is back, in no promised order.

use std::{sync::Arc, thread, time::Duration};

use rand::{RngExt, rngs::StdRng};
use tower_lock::{LockEngine, engine::postgres::PostgresBackend};
use tower_lock_test_support::{history::Recorder, postgres::PostgresServer, serial};

use super::{
    Faults, LONGEST_PAUSE,
    holder::holder_fault,
    redis_backends::{no_residue, recorder_with_wall_origin, register_server},
    schedule,
};

/// The schema the schedule's engines and holder processes share.
pub(super) const SCHEMA: &str = "fault";

/// Postgres: crashes and restarts, freezes, killed connections, frozen holders.
struct Postgres {
    server: Arc<PostgresServer>,
    register: String,
    origin_wall: u64,
    holders: std::sync::atomic::AtomicU32,
}

impl Faults for Postgres {
    fn inject(&self, rng: &mut StdRng, recorder: &Recorder) -> String {
        let pause = Duration::from_millis(rng.random_range(50..LONGEST_PAUSE.as_millis() as u64));
        match rng.random_range(0..5) {
            0 => {
                let began = recorder.now();
                self.server.restart();
                recorder.outage(began);
                "crash (immediate shutdown) and restart".to_owned()
            }
            1 => {
                self.server.pause();
                thread::sleep(pause);
                self.server.resume();
                format!("SIGSTOP {pause:?}")
            }
            2 => {
                let killed = self.server.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE usename = 'tower_lock' AND query NOT LIKE 'LISTEN%' \
                     AND pid <> pg_backend_pid()",
                );
                format!("{killed} pool connections killed")
            }
            3 => {
                let killed = self.server.psql(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE query LIKE 'LISTEN%'",
                );
                format!("{killed} listeners killed")
            }
            _ => {
                let n = self
                    .holders
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                holder_fault(
                    rng,
                    recorder,
                    (&[self.server.url()], &self.register, self.origin_wall),
                    n,
                )
            }
        }
    }
}

/// A backend of the schedule's schema on `url`, each call bounded by `timeout`.
pub(super) async fn backend(url: String, timeout: Duration) -> PostgresBackend {
    PostgresBackend::builder(url)
        .schema(SCHEMA)
        .command_timeout(timeout)
        .pool_size(6)
        .build()
        .await
        .expect("connect to the schedule's postgres")
}

/// What the backend keeps: live leases of both modes and the key's one queue's tickets
/// (fence tombstones are documented, and swept).
fn residue(server: &PostgresServer) -> Vec<String> {
    let left = server.psql(&format!(
        "SELECT 'lock ' || key FROM {SCHEMA}.locks
           WHERE token IS NOT NULL AND expires_at > clock_timestamp()
         UNION ALL SELECT 'ticket ' || key FROM {SCHEMA}.tickets
         UNION ALL SELECT 'shared lease ' || key FROM {SCHEMA}.shared_leases
           WHERE expires_at > clock_timestamp()"
    ));
    left.lines().map(str::to_owned).collect()
}

#[test]
fn postgres_fault_schedule_keeps_every_check() {
    let _group = serial::group_blocking(concat!(module_path!(), "::postgres"));
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let (_register_server, registers) = runtime.block_on(register_server());
    let register = _register_server.url();
    // A cluster of the test's own: the faults disturb it.
    let server = Arc::new(PostgresServer::start());
    runtime
        .block_on(
            PostgresBackend::builder(server.url())
                .schema(SCHEMA)
                .migrate(),
        )
        .unwrap();
    let (recorder, origin_wall) = recorder_with_wall_origin();
    let url = server.url();
    let make = move |n: u32| {
        let url = url.clone();
        Box::pin(async move {
            let timeout = Duration::from_millis(300 + 100 * u64::from(n));
            LockEngine::new(backend(url, timeout).await)
        }) as std::pin::Pin<Box<dyn std::future::Future<Output = _>>>
    };
    let faults = Postgres {
        server: server.clone(),
        register,
        origin_wall,
        holders: Default::default(),
    };
    schedule("postgres", make, &registers, (recorder, &faults));
    // Every node of the schedule has gone, and with it every sweeper; a fleet keeps one.
    // The tickets of waiters the faults cut off (their leave failed) are the sweeper's to
    // delete: a grant drops only the lapsed ones it meets at its queue's head (CI: three
    // of fault-b's were kept 15 s after the schedule, with no node left to sweep).
    let sweeper = runtime.block_on(backend(server.url(), Duration::from_secs(5)));
    no_residue(|| {
        runtime
            .block_on(sweeper.sweep())
            .expect("a sweep after the schedule");
        residue(&server)
    });
}
