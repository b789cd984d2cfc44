//! [`Session`]: the backend's watch on its server, so that the engine learns at once when
//! it can no longer vouch for what it granted ([`Resets`]).
//!
//! One RESP3 connection per backend stays open to the server (for Sentinel: the primary it
//! names), subscribed to a channel of the engine's own that nobody publishes on (a
//! subscribed client is exempt from the server's idle `timeout`), and to the prefix's
//! revocation channel (an admin's force release, see `revocation`). When it drops (the
//! server was killed or restarted, a failover's `CLIENT KILL`, a reset network path),
//! every grant made before can be gone from the server: a reset, reported from the
//! connection's own driver task the moment it reads the end of the stream. A killed
//! server's sockets are closed by its kernel, so the reset comes before a restarted server
//! can answer anyone.
//!
//! No call goes out while the watch is down ([`Watch::up`]): a call asks it to reconnect
//! at once, and fails if it cannot, so every grant is made under a watch. On reconnecting
//! the watch reads the server's `run_id`: another run than the one it watched is a reset
//! too. The command connections are left alone: their own failures retire them (and a
//! watch killed alone, say for a user's channel rights, says nothing about them).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicBool, Ordering},
    },
    time::Duration,
};

use redis::{PushInfo, PushKind, RedisError, aio::MultiplexedConnection};
use tokio::{sync::Notify, task::JoinHandle, time::Instant};

use super::{connector::Connector, revocation};
use crate::{BackendError, BackendErrorKind, Resets, runtime};

/// The watch task of one backend; dropping it ends the task.
pub(super) struct Session {
    task: JoinHandle<()>,
}

/// What the calls see of the watch: whether it is up, and a way to hurry it.
pub(crate) struct Watch {
    connector: Arc<Connector>,
    /// Whether the watch connection is up (calls may go out).
    up: AtomicBool,
    /// Asks a watch that is down to try now rather than after its backoff.
    kick: Notify,
    /// Signalled after every connect attempt of the watch.
    tried: Notify,
    /// Why the last attempt failed.
    error: Mutex<Option<RedisError>>,
}

impl Session {
    /// Watch the server `connector` connects to, reporting on `resets`; the watch
    /// subscribes to `channel` (one of the engine's, so the user may). Returns once its
    /// first connection is made or has failed (within `timeout`), with what the calls
    /// check before they go out.
    pub(super) async fn start(
        connector: Arc<Connector>,
        channel: String,
        revoke: String,
        timeout: Duration,
        resets: Resets,
    ) -> (Self, Arc<Watch>) {
        let watch = Arc::new(Watch {
            connector,
            up: AtomicBool::new(false),
            kick: Notify::new(),
            tried: Notify::new(),
            error: Mutex::new(None),
        });
        let tried = watch.tried.notified();
        let task = runtime::handle().spawn(run(watch.clone(), channel, revoke, timeout, resets));
        let _ = tokio::time::timeout(timeout, tried).await;
        (Self { task }, watch)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Watch {
    /// `Ok` once the watch is up, asking it to reconnect at once if it is down; an
    /// `Unavailable` error if that fails (or does not succeed by `deadline`).
    pub(crate) async fn up(
        &self,
        what: &'static str,
        deadline: Instant,
    ) -> Result<(), BackendError> {
        if self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        let tried = self.tried.notified();
        tokio::pin!(tried);
        tried.as_mut().enable();
        if self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        self.kick.notify_one();
        let _ = tokio::time::timeout_at(deadline, tried).await;
        if self.up.load(Ordering::Acquire) {
            return Ok(());
        }
        let error = BackendError::new(
            BackendErrorKind::Unavailable,
            format!(
                "redis {what} failed: cannot connect to {} (its session watch is down)",
                self.connector.target()
            ),
        );
        Err(match self.error.lock().unwrap().clone() {
            Some(source) => error.with_source(source),
            None => error,
        })
    }
}

async fn run(
    watch: Arc<Watch>,
    channel: String,
    revoke: String,
    timeout: Duration,
    resets: Resets,
) {
    let connector = watch.connector.clone();
    let mut watched: Option<String> = None;
    let mut backoff = Duration::from_millis(50);
    loop {
        // Set once this connection's drop is reported.
        let reported = Arc::new(AtomicBool::new(false));
        let (dropped_tx, mut dropped) = tokio::sync::mpsc::unbounded_channel::<()>();
        let on_push = {
            let (watch, resets, reported) = (watch.clone(), resets.clone(), reported.clone());
            let revoke = revoke.clone();
            move |push: PushInfo| {
                // An admin's force release of a lease this engine may hold: read in the
                // driver too, so the lease reads lost before the key is given back.
                if revocation::on_push(&resets, &revoke, &push) {
                    return Ok(());
                }
                if push.kind == PushKind::Disconnection && !reported.swap(true, Ordering::AcqRel) {
                    // Here, in the connection's driver: no task hop before the engine knows.
                    watch.up.store(false, Ordering::Release);
                    resets.reset("the connection to the redis server was reset");
                    let _ = dropped_tx.send(());
                }
                Ok::<(), std::convert::Infallible>(())
            }
        };
        let channels = [channel.as_str(), revoke.as_str()];
        let connected = tokio::time::timeout(timeout, connect(&connector, on_push, &channels))
            .await
            .unwrap_or_else(|_| {
                Err(RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    "session watch connect timed out",
                )))
            });
        let (conn, run_id) = match connected {
            Ok(connected) => connected,
            Err(error) => {
                tracing::debug!(%error, "redis session watch could not connect");
                *watch.error.lock().unwrap() = Some(error);
                watch.tried.notify_waiters();
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = watch.kick.notified() => {}
                }
                backoff = (backoff * 2).min(Duration::from_millis(500));
                continue;
            }
        };
        backoff = Duration::from_millis(50);
        if watched.as_ref().is_some_and(|w| *w != run_id) {
            resets.reset("the redis server is another run than before (a restart or a failover)");
        }
        watched = Some(run_id);
        if !reported.load(Ordering::Acquire) {
            watch.up.store(true, Ordering::Release);
        }
        watch.tried.notify_waiters();
        // Until the connection drops (its push sender is dropped with it).
        while dropped.recv().await.is_some() {}
        drop(conn);
        if !reported.swap(true, Ordering::AcqRel) {
            watch.up.store(false, Ordering::Release);
            resets.reset("the connection to the redis server ended");
        }
    }
}

/// A RESP3 connection to the server `connector` names now, its pushes to `on_push`,
/// subscribed to `channels`; and the server's run id.
async fn connect(
    connector: &Connector,
    on_push: impl redis::aio::AsyncPushSender,
    channels: &[&str],
) -> Result<(MultiplexedConnection, String), RedisError> {
    let client = connector.resp3_client().await?;
    // No response timeout: the connection only ever waits for its end.
    let config = redis::AsyncConnectionConfig::new().set_push_sender(on_push);
    let mut conn = client
        .get_multiplexed_async_connection_with_config(&config)
        .await?;
    let server: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut conn)
        .await?;
    let run_id = server
        .lines()
        .find_map(|l| l.trim().strip_prefix("run_id:"))
        .unwrap_or_default()
        .to_owned();
    // Refused (a user without rights on the engine's channels, which the wake-ups need
    // too and `build()` checks): the watch works unsubscribed, and the server's idle
    // timeout, if set, may close it (a reset: early, which is safe).
    if let Err(error) = conn.subscribe(channels).await {
        if error.is_unrecoverable_error() {
            return Err(error);
        }
        tracing::debug!(%error, "redis session watch could not subscribe; it watches unsubscribed");
    }
    Ok((conn, run_id))
}
