//! [`BusyClients`]: other clients of a PgBouncer keeping its few server connections busy,
//! so that a client's consecutive transactions (and the two halves of an extended-protocol
//! statement sent outside a transaction) are served by different server connections, as in
//! a loaded production pooler.

use std::{
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use tower_lock_engine::postgres::sqlx::{self, Executor, postgres::PgPoolOptions};

/// Clients looping short transactions through a URL until dropped, on a thread and
/// runtime of their own (so they outlive the runtime of the test that started them: a
/// `static` harness can keep them for the whole binary).
#[derive(Debug)]
pub struct BusyClients {
    stop: Arc<AtomicBool>,
}

impl BusyClients {
    /// `clients` connections on `url`, each sending `SELECT pg_sleep(<each>)` (a simple
    /// query: a transaction of its own) in a loop. More clients than the pooler has server
    /// connections keep them all busy; a longer `each` costs the machine less (a load kept
    /// for a whole test binary). Blocks until every client has run one: call it from a
    /// blocking context (`spawn_blocking`).
    pub fn start(url: &str, clients: usize, each: Duration) -> Self {
        let sql = format!("SELECT pg_sleep({})", each.as_secs_f64());
        let stop = Arc::new(AtomicBool::new(false));
        let (ran, started) = std::sync::mpsc::channel::<()>();
        let (url, stopped, sql) = (url.to_owned(), stop.clone(), Arc::new(sql));
        std::thread::Builder::new()
            .name("busy-clients".into())
            .spawn(move || {
                let runtime = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("a runtime for the busy clients");
                runtime.block_on(async move {
                    let mut tasks = Vec::with_capacity(clients);
                    for _ in 0..clients {
                        let pool = PgPoolOptions::new()
                            .max_connections(1)
                            .connect_lazy(&url)
                            .expect("a valid URL");
                        let (ran, stopped, sql) = (ran.clone(), stopped.clone(), sql.clone());
                        tasks.push(tokio::spawn(async move {
                            let mut first = Some(ran);
                            while !stopped.load(Ordering::Relaxed) {
                                let done = pool.execute(sqlx::raw_sql(&sql)).await;
                                match done {
                                    Ok(_) => {
                                        if let Some(ran) = first.take() {
                                            let _ = ran.send(());
                                        }
                                    }
                                    // A pooler or server being restarted: again shortly.
                                    Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
                                }
                            }
                            pool.close().await;
                        }));
                    }
                    drop(ran);
                    for task in tasks {
                        let _ = task.await;
                    }
                });
            })
            .expect("spawn the busy clients' thread");
        for _ in 0..clients {
            started
                .recv_timeout(Duration::from_secs(30))
                .expect("a busy client ran its first statement");
        }
        Self { stop }
    }
}

impl Drop for BusyClients {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}
