//! Workers cycling one lock under faults, and the checks made on every grant: no grant
//! while another holder still believes its lease valid (the lease's own validity,
//! `is_lost`, which runs out on the engine's clock when renewals fail), fences rising
//! among valid leases, every acquire answered within its wait limit plus `overrun`.

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, AtomicUsize, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::{sync::watch, task::JoinHandle};
use tower_lock::{LockEngine, LockError, LostSignal};

/// How the workers cycle.
#[derive(Debug, Clone, Copy)]
pub struct Cycle {
    /// The lock they take.
    pub key: &'static str,
    /// Each lease's TTL.
    pub ttl: Duration,
    /// How long each acquire waits.
    pub wait: Duration,
    /// How far past its wait an acquire may be answered (the attempt in flight, the
    /// ticket's removal, a `replica_ack` wait).
    pub overrun: Duration,
}

/// What the workers saw, and the flag that stops them.
#[derive(Debug, Default)]
pub struct Log {
    /// The leases handed out and not yet given back, with their validity.
    holding: Mutex<Vec<(u64, LostSignal)>>,
    /// The highest fence of a lease that was valid when served.
    top: Mutex<u64>,
    violations: Mutex<Vec<String>>,
    /// Grants whose lease was already lost when the acquire returned.
    pub stale_on_arrival: AtomicUsize,
    /// Acquires that ran out of wait.
    pub timed_out: AtomicUsize,
    /// Acquires answered with a backend error.
    pub errors: AtomicUsize,
    stop: AtomicBool,
}

impl Log {
    /// Ask the workers to stop after their current cycle.
    pub fn stop(&self) {
        self.stop.store(true, Ordering::SeqCst);
    }

    /// The broken promises seen so far, one line each.
    pub fn violations(&self) -> Vec<String> {
        self.violations.lock().unwrap().clone()
    }
}

/// Take the lock again and again until [`Log::stop`]; FIFO if `fifo`. Counts each grant
/// on `served`.
pub async fn worker(
    engine: LockEngine,
    name: String,
    fifo: bool,
    cycle: Cycle,
    log: Arc<Log>,
    served: watch::Sender<usize>,
) {
    while !log.stop.load(Ordering::SeqCst) {
        let asked = Instant::now();
        let outcome = engine
            .lock(cycle.key)
            .fifo(fifo)
            .ttl(cycle.ttl)
            .wait(cycle.wait)
            .acquire()
            .await;
        let took = asked.elapsed();
        if took > cycle.wait + cycle.overrun {
            log.violations
                .lock()
                .unwrap()
                .push(format!("{name}: answered after {took:?} ({outcome:?})"));
        }
        let lease = match outcome {
            Ok(lease) => lease,
            Err(LockError::TimedOut { .. }) => {
                log.timed_out.fetch_add(1, Ordering::SeqCst);
                continue;
            }
            Err(LockError::Backend(_)) => {
                log.errors.fetch_add(1, Ordering::SeqCst);
                // As an application would, before asking again.
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
            Err(e) => panic!("{name}: {e}"),
        };
        let fence = lease.fence().get();
        {
            let mut holding = log.holding.lock().unwrap();
            let mut top = log.top.lock().unwrap();
            if lease.is_lost() {
                // Its validity ran out before it came back (a reply held up by a fault).
                log.stale_on_arrival.fetch_add(1, Ordering::SeqCst);
            } else {
                for (other, lost) in holding.iter() {
                    if !lost.is_lost() {
                        log.violations.lock().unwrap().push(format!(
                            "{name}: fence {fence} granted while fence {other} is still valid"
                        ));
                    }
                }
                if fence <= *top {
                    log.violations.lock().unwrap().push(format!(
                        "{name}: fence {fence} after fence {} (both valid when served)",
                        *top
                    ));
                }
                *top = fence.max(*top);
            }
            holding.push((fence, lease.lost_signal()));
        }
        served.send_modify(|n| *n += 1);
        tokio::time::sleep(Duration::from_millis(5)).await;
        log.holding.lock().unwrap().retain(|(f, _)| *f != fence);
        // During a fault the release may fail (its lease then runs out on the server).
        let _ = lease.release().await;
    }
}

/// Wait until `more` grants beyond the current count are served: the lock cycles.
pub async fn cycles(served: &mut watch::Receiver<usize>, more: usize, what: &str) {
    let from = *served.borrow();
    let reached = tokio::time::timeout(
        Duration::from_secs(20),
        served.wait_for(|n| *n >= from + more),
    )
    .await;
    assert!(reached.is_ok(), "the lock stopped cycling {what}");
}

/// `n` workers cycling `cycle.key` on the `nodes` in turn, every other one FIFO.
#[derive(Debug)]
pub struct Workers {
    /// What they saw.
    pub log: Arc<Log>,
    /// Grants served so far (see [`cycles`]).
    pub served: watch::Receiver<usize>,
    tasks: Vec<JoinHandle<()>>,
    cycle: Cycle,
}

impl Workers {
    /// Start them, on the current runtime.
    pub fn start(nodes: &[LockEngine], n: usize, cycle: Cycle) -> Self {
        let log = Arc::new(Log::default());
        let (served_tx, served) = watch::channel(0);
        let tasks = (0..n)
            .map(|i| {
                tokio::spawn(worker(
                    nodes[i % nodes.len()].clone(),
                    format!("worker {i}"),
                    i % 2 == 0,
                    cycle,
                    log.clone(),
                    served_tx.clone(),
                ))
            })
            .collect();
        Self {
            log,
            served,
            tasks,
            cycle,
        }
    }

    /// Stop them; each must end within one acquire's answer time.
    pub async fn stop(&mut self) {
        self.log.stop();
        let limit = self.cycle.wait + self.cycle.overrun + Duration::from_secs(1);
        for task in self.tasks.drain(..) {
            tokio::time::timeout(limit, task)
                .await
                .expect("a worker hung")
                .unwrap();
        }
    }
}
