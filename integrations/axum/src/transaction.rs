//! [`Tx`]: the request's database transaction, borrowed from tower-lock's transactional
//! idempotency layer (feature `postgres`).

use std::{
    fmt,
    ops::{Deref, DerefMut},
};

use axum::{
    extract::FromRequestParts,
    http::{StatusCode, header, request::Parts},
    response::{IntoResponse, Response},
};
use tower_lock::{
    LeaseInfo,
    idempotency::transactional::{BorrowError, BorrowedTransaction, FenceError, LentTransaction},
    sqlx::PgConnection,
};

/// The request's transaction, lent by a
/// [`TransactionalLayer`](tower_lock::idempotency::transactional::TransactionalLayer): it
/// dereferences to sqlx's [`PgConnection`], so `sqlx::query(..).execute(&mut *tx)` writes
/// in the transaction that commits with the idempotency record (or rolls back with it).
/// It has no commit or rollback: the layer decides from the handler's answer.
///
/// ```
/// use axum::http::StatusCode;
/// use tower_lock_axum::Tx;
///
/// async fn pay(mut tx: Tx, body: String) -> Result<StatusCode, StatusCode> {
///     sqlx::query("INSERT INTO payments (note) VALUES ($1)")
///         .persistent(false)
///         .bind(body)
///         .execute(&mut *tx)
///         .await
///         .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
///     Ok(StatusCode::CREATED)
/// }
/// # let _: axum::routing::MethodRouter = axum::routing::post(pay);
/// ```
///
/// Rejects with [`TxRejection`] (`500`) when the request has no transaction: the layer is
/// not installed on the route, or the request is not covered (a method or key it passes
/// through).
pub struct Tx(BorrowedTransaction);

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tx").finish_non_exhaustive()
    }
}

impl Tx {
    /// Refuse this request's writes if a newer holder of `lease`'s lock already wrote
    /// under its key (see [`BorrowedTransaction::check_fence`]); the transaction is then
    /// rolled back whatever the handler answers. `?` turns the refusal into a `409`
    /// (`stale-fence`), a failed check into a `503`.
    pub async fn check_fence(&mut self, lease: &LeaseInfo) -> Result<(), FenceRejection> {
        self.0.check_fence(lease).await.map_err(FenceRejection)
    }
}

impl Deref for Tx {
    type Target = PgConnection;

    fn deref(&self) -> &PgConnection {
        &self.0
    }
}

impl DerefMut for Tx {
    fn deref_mut(&mut self) -> &mut PgConnection {
        &mut self.0
    }
}

impl<S: Send + Sync> FromRequestParts<S> for Tx {
    type Rejection = TxRejection;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let lent = parts
            .extensions
            .get::<LentTransaction>()
            .cloned()
            .ok_or_else(TxRejection::default)?;
        lent.borrow().await.map(Self).map_err(TxRejection::from)
    }
}

/// The request has no transaction to lend: the transactional layer is not installed on
/// this route, or it passed the request through; or it is already borrowed (`Tx` taken
/// twice, or by a middleware around the handler: refused at once, never a wait). A
/// server bug, answered `500`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct TxRejection {
    /// Why the layer lent nothing; `None`: the request has no transaction.
    pub cause: Option<BorrowError>,
}

impl From<BorrowError> for TxRejection {
    fn from(cause: BorrowError) -> Self {
        Self { cause: Some(cause) }
    }
}

impl fmt::Display for TxRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.cause {
            Some(cause) => write!(f, "the handler cannot have the request's transaction: {cause}"),
            None => f.write_str("the handler needs the request's transaction, but it has none (is the transactional idempotency layer installed on this route?)"),
        }
    }
}

impl std::error::Error for TxRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.cause.as_ref().map(|c| c as _)
    }
}

impl IntoResponse for TxRejection {
    fn into_response(self) -> Response {
        (StatusCode::INTERNAL_SERVER_ERROR, self.to_string()).into_response()
    }
}

/// A refused fence check, as an answer: `409` `application/problem+json` (type
/// `urn:tower-lock:problem:stale-fence`) for a stale holder, `503` for a check that failed.
/// Never stored: the retry runs (under the current holder).
#[derive(Debug)]
pub struct FenceRejection(pub FenceError);

impl fmt::Display for FenceRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl std::error::Error for FenceRejection {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.0)
    }
}

impl IntoResponse for FenceRejection {
    fn into_response(self) -> Response {
        let (status, slug) = match self.0 {
            FenceError::Stale { .. } => (StatusCode::CONFLICT, "stale-fence"),
            _ => (StatusCode::SERVICE_UNAVAILABLE, "fence-check-failed"),
        };
        let body = problem_body(status, slug, &self.0.to_string());
        (
            status,
            [(header::CONTENT_TYPE, "application/problem+json")],
            body,
        )
            .into_response()
    }
}

/// A problem+json body without a JSON dependency: `detail` escaped as a JSON string.
fn problem_body(status: StatusCode, slug: &str, detail: &str) -> String {
    let mut escaped = String::with_capacity(detail.len());
    for c in detail.chars() {
        match c {
            '"' => escaped.push_str("\\\""),
            '\\' => escaped.push_str("\\\\"),
            c if u32::from(c) < 0x20 => escaped.push_str(&format!("\\u{:04x}", u32::from(c))),
            c => escaped.push(c),
        }
    }
    format!(
        r#"{{"type":"urn:tower-lock:problem:{slug}","title":"Stale lock holder","status":{},"detail":"{escaped}"}}"#,
        status.as_u16()
    )
}
