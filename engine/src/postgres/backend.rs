//! The core [`Backend`] methods on Postgres: one statement each, on the key's one space
//! (the mode says which of its holders: the lock, or a shared lease, and the limit).

use std::time::Duration;

use sqlx::Row;

use super::{
    PostgresBackend,
    acquire::{int, protocol},
    backend_error, listener, millis, remaining,
    sql::Call,
};
use crate::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Fence, Grant, Holder,
    HolderLabel, LockError, LockKey, Mode, Renewal, Token,
};

/// Leases renewed per statement.
const RENEW_CHUNK: usize = 256;

/// What `release`, `extend` answer when they change nothing: `-1` another token holds the
/// key, `-2` nobody does.
fn refused(code: i64) -> Result<(), LockError> {
    match code {
        -1 => Err(LockError::NotOwned),
        c if c < 0 => Err(LockError::Expired),
        _ => Ok(()),
    }
}

/// A mode as the functions take it: `0` the lock, else a shared lease's limit.
pub(super) fn lim(mode: Mode) -> i64 {
    match mode {
        Mode::Exclusive => 0,
        Mode::Shared { limit } => i64::from(limit),
    }
}

impl PostgresBackend {
    /// One batch of renewals, both modes.
    async fn renew_chunk(&self, chunk: &[Renewal]) -> Result<Vec<bool>, LockError> {
        let sql = Call::function(self.inner.names.renew())
            .texts(chunk.iter().map(|l| l.key.as_str()))
            .texts(chunk.iter().map(|l| l.token.as_str()))
            .ints(chunk.iter().map(|l| millis(l.ttl)))
            .ints(chunk.iter().map(|l| lim(l.mode)))
            .finish();
        let row = self.inner.call("renew", sql).await?;
        let row = row
            .first()
            .ok_or_else(|| protocol("renew answered no row"))?;
        let renewed: String = row.try_get(0).map_err(|e| backend_error("decode", e))?;
        if renewed.len() != chunk.len() {
            return Err(protocol("renew answered the wrong number of results"));
        }
        Ok(renewed.bytes().map(|b| b == b'1').collect())
    }
}

impl Backend for PostgresBackend {
    fn acquire(&self, req: AcquireRequest) -> BoxFuture<'_, Result<Grant, LockError>> {
        if req.mode == (Mode::Shared { limit: 0 }) {
            return Box::pin(std::future::ready(Err(LockError::InvalidValue(
                "a shared limit must be at least 1",
            ))));
        }
        let lease = listener::lease_hash(&req.key, &req.token);
        let inner = self.inner.clone();
        Box::pin(async move {
            let granted = inner.clone().acquire(req).await;
            if granted.is_ok() {
                inner.listener.hold(lease).await;
            }
            granted
        })
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            // A release whose connection was lost after it went out is sent again (see
            // `resend`): one that ran answers "released" the second time too, by its id.
            let sql = Call::function(self.inner.names.release())
                .text(key.as_str())
                .text(token.as_str())
                .int(lim(mode))
                .text(&String::from_utf8_lossy(&crate::key::random_hex()))
                .finish();
            let answered = self.inner.call("release", sql).await;
            self.inner.listener.let_go(listener::lease_hash(key, token));
            refused(int(answered?.first(), 0)?)
        })
    }

    fn extend<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
        ttl: Duration,
        how: ExtendMode,
    ) -> BoxFuture<'a, Result<Duration, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.extend())
                .text(key.as_str())
                .text(token.as_str())
                .int(millis(ttl))
                .text(match how {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                })
                .int(lim(mode))
                .finish();
            let row = self.inner.call("extend", sql).await?;
            let left = int(row.first(), 0)?;
            refused(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        })
    }

    // One statement per RENEW_CHUNK leases, both modes; the answers in the batch's order.
    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            let mut renewed = Vec::with_capacity(leases.len());
            for chunk in leases.chunks(RENEW_CHUNK) {
                renewed.extend(self.renew_chunk(chunk).await?);
            }
            Ok(renewed)
        })
    }

    /// Every holder of the key, both modes, read in one statement (one snapshot).
    fn holders<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<Vec<Holder>, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.holder())
                .text(key.as_str())
                .finish();
            let rows = self.inner.call("holder", sql).await?;
            rows.iter()
                .map(|row| {
                    let token: String = row.try_get(0).map_err(|e| backend_error("decode", e))?;
                    let token =
                        Token::new(&token).map_err(|_| protocol("stored token is malformed"))?;
                    let ttl = remaining(int(Some(row), 1)?);
                    let kind: String = row.try_get(2).map_err(|e| backend_error("decode", e))?;
                    let fence: Option<i64> =
                        row.try_get(3).map_err(|e| backend_error("decode", e))?;
                    let label: Option<String> =
                        row.try_get(4).map_err(|e| backend_error("decode", e))?;
                    let holder = match kind.as_str() {
                        "x" => Holder::new(token, ttl),
                        other => Holder::shared(token, ttl, other == "a"),
                    }
                    .with_label(label.as_deref().and_then(HolderLabel::stored));
                    Ok(match fence.and_then(|f| u64::try_from(f).ok()) {
                        Some(fence) => holder.with_fence(Fence::new(fence)),
                        None => holder,
                    })
                })
                .collect()
        })
    }

    fn has_shared_mode(&self) -> bool {
        true
    }

    /// A restart of the database (or the end of the listener's connection) is a reset (see
    /// `restarts`), and an admin's revocations, which the listener hears (see `admin`), go
    /// to the same `Resets`.
    fn resets(&self) -> Option<crate::Resets> {
        Some(self.inner.restarts.resets())
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_pools(self)
            .with_records(self)
    }

    /// The key's one queue's live tickets, counted in one statement.
    fn waiters<'a>(&'a self, key: &'a LockKey) -> BoxFuture<'a, Result<usize, LockError>> {
        Box::pin(async move {
            let sql = Call::function(self.inner.names.waiters())
                .text(key.as_str())
                .finish();
            let row = self.inner.call("waiters", sql).await?;
            Ok(usize::try_from(int(row.first(), 0)?).unwrap_or(0))
        })
    }
}
