//! The core [`Backend`] methods on Postgres: one statement each, in the space the mode
//! names (the key's lock, or its shared leases: tables and functions apart).

use std::time::Duration;

use sqlx::Row;

use super::{
    PostgresBackend,
    acquire::{int, protocol},
    backend_error, millis, remaining, resend,
    sql::Call,
};
use crate::{
    AcquireRequest, Backend, BoxFuture, Capabilities, ExtendMode, Grant, Holder, LockError,
    LockKey, Mode, Renewal, Token,
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

impl PostgresBackend {
    /// One batch of renewals, all in one space (`shared` or the locks').
    async fn renew_chunk(&self, shared: bool, chunk: &[&Renewal]) -> Result<Vec<bool>, LockError> {
        let (function, what) = if shared {
            (self.inner.names.shared_renew(), "shared renew")
        } else {
            (self.inner.names.renew(), "renew")
        };
        let sql = Call::function(function)
            .texts(chunk.iter().map(|l| l.key.as_str()))
            .texts(chunk.iter().map(|l| l.token.as_str()))
            .ints(chunk.iter().map(|l| millis(l.ttl)))
            .finish();
        let row = self.inner.call(what, sql).await?;
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
        Box::pin(self.inner.clone().acquire(req))
    }

    fn release<'a>(
        &'a self,
        key: &'a LockKey,
        token: &'a Token,
        mode: Mode,
    ) -> BoxFuture<'a, Result<(), LockError>> {
        Box::pin(async move {
            let (function, what) = if mode.is_shared() {
                (self.inner.names.shared_release(), "shared release")
            } else {
                (self.inner.names.release(), "release")
            };
            let sql = Call::function(function)
                .text(key.as_str())
                .text(token.as_str())
                .finish();
            let row = match self.inner.call(what, sql.clone()).await {
                // It may have run before its connection was lost: the server says whether
                // the lease is still ours (see `resend`).
                Err(error) if resend::may_have_run(&error) => {
                    let ours = self.holders(key).await?.iter().any(|holder| {
                        &holder.token == token && holder.mode.is_shared() == mode.is_shared()
                    });
                    if !ours {
                        return Err(error);
                    }
                    self.inner.call_fresh(what, sql).await?
                }
                other => other?,
            };
            refused(int(row.first(), 0)?)
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
            let (function, what) = if mode.is_shared() {
                (self.inner.names.shared_extend(), "shared extend")
            } else {
                (self.inner.names.extend(), "extend")
            };
            let sql = Call::function(function)
                .text(key.as_str())
                .text(token.as_str())
                .int(millis(ttl))
                .text(match how {
                    ExtendMode::Add => "add",
                    ExtendMode::Replace => "replace",
                })
                .finish();
            let row = self.inner.call(what, sql).await?;
            let left = int(row.first(), 0)?;
            refused(left)?;
            Ok(Duration::from_millis(u64::try_from(left).unwrap_or(1)))
        })
    }

    // One statement per space and RENEW_CHUNK leases; the answers in the batch's order.
    fn renew<'a>(&'a self, leases: &'a [Renewal]) -> BoxFuture<'a, Result<Vec<bool>, LockError>> {
        Box::pin(async move {
            let mut renewed = vec![false; leases.len()];
            for shared in [false, true] {
                let (at, part): (Vec<usize>, Vec<&Renewal>) = leases
                    .iter()
                    .enumerate()
                    .filter(|(_, l)| l.mode.is_shared() == shared)
                    .unzip();
                for (at, chunk) in at.chunks(RENEW_CHUNK).zip(part.chunks(RENEW_CHUNK)) {
                    let answers = self.renew_chunk(shared, chunk).await?;
                    for (i, ok) in at.iter().zip(answers) {
                        renewed[*i] = ok;
                    }
                }
            }
            Ok(renewed)
        })
    }

    /// Both spaces' holders, read in one statement (one snapshot).
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
                    Ok(match kind.as_str() {
                        "x" => Holder::new(token, ttl),
                        other => Holder::shared(token, ttl, other == "a"),
                    })
                })
                .collect()
        })
    }

    fn has_shared_mode(&self) -> bool {
        true
    }

    fn capabilities(&self) -> Capabilities<'_> {
        Capabilities::none()
            .with_admin(self)
            .with_numeric(self)
            .with_pools(self)
            .with_records(self)
    }

    /// Both queues' live tickets, counted in one statement.
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
