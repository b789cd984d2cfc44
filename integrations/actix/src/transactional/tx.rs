//! [`Tx`]: the request's database transaction on actix-web, borrowed from the
//! [`TransactionalMiddleware`](super::TransactionalMiddleware).

use std::{
    fmt,
    ops::{Deref, DerefMut},
};

use actix_web::{
    FromRequest, HttpMessage, HttpRequest, HttpResponse, ResponseError, dev::Payload,
    http::StatusCode,
};
use tower_lock::{
    LeaseInfo,
    idempotency::transactional::{BorrowError, BorrowedTransaction, FenceError, LentTransaction},
    sqlx::PgConnection,
};

use crate::middleware::LocalBoxFuture;

/// The request's transaction, lent by the [`TransactionalMiddleware`](super::TransactionalMiddleware):
/// it dereferences to sqlx's [`PgConnection`] (`sqlx::query(..).execute(&mut *tx)`), and
/// has no commit or rollback. Fails with [`TxRejection`] (`500`) without the middleware.
pub struct Tx(BorrowedTransaction);

impl fmt::Debug for Tx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Tx").finish_non_exhaustive()
    }
}

impl Tx {
    /// Refuse this request's writes if a newer holder of `lease`'s lock already wrote
    /// under its key (see [`BorrowedTransaction::check_fence`]): `?` answers a stale
    /// holder `409`, a failed check `503`; the transaction rolls back either way.
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

impl FromRequest for Tx {
    type Error = TxRejection;
    type Future = LocalBoxFuture<Result<Self, TxRejection>>;

    fn from_request(req: &HttpRequest, _payload: &mut Payload) -> Self::Future {
        let lent = req.extensions().get::<LentTransaction>().cloned();
        Box::pin(async move {
            match lent {
                Some(lent) => lent.borrow().await.map(Self).map_err(TxRejection::from),
                None => Err(TxRejection::default()),
            }
        })
    }
}

/// The request has no transaction to lend: the middleware does not wrap this resource,
/// or passed the request through; or it is already borrowed (`Tx` taken twice, or by a
/// middleware around the handler: refused at once, never a wait). A server bug, answered
/// `500`.
#[derive(Clone, Copy, Debug, Default)]
#[non_exhaustive]
pub struct TxRejection {
    /// Why the middleware lent nothing; `None`: the request has no transaction.
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
            None => f.write_str("the handler needs the request's transaction, but it has none (does the transactional middleware wrap this resource?)"),
        }
    }
}

impl ResponseError for TxRejection {}

/// A refused fence check, as an answer: `409` (`stale-fence`) for a stale holder, `503`
/// for a check that failed. Never stored.
#[derive(Debug)]
pub struct FenceRejection(pub FenceError);

impl fmt::Display for FenceRejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

impl ResponseError for FenceRejection {
    fn status_code(&self) -> StatusCode {
        match self.0 {
            FenceError::Stale { .. } => StatusCode::CONFLICT,
            _ => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        HttpResponse::build(self.status_code())
            .content_type("text/plain; charset=utf-8")
            .body(format!("stale-fence: {}", self.0))
    }
}
