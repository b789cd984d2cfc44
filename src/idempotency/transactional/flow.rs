//! One request through the transactional layer, top to bottom: the key, the body and its
//! fingerprint, the claim (or the record's answer), the handler with the lent
//! transaction, then the commit of the response with the handler's rows, or the rollback.

use std::{pin::Pin, sync::Arc};

use bytes::{Bytes, BytesMut};
use http::{Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use super::{
    LentTransaction, TransactionalBody,
    lent::Returned,
    shared::{Claim, Shared},
};
use crate::{NotStored, Rejection, idempotency::RequestBody};

type Answer<B, E> = Result<Response<TransactionalBody<B>>, E>;

/// The request's head without its body, for rejection responses after the request was
/// handed to the handler.
fn head_of<B>(req: &Request<B>) -> Request<()> {
    let mut head = Request::new(());
    *head.method_mut() = req.method().clone();
    *head.uri_mut() = req.uri().clone();
    *head.headers_mut() = req.headers().clone();
    head
}

fn reject<B>(
    shared: &Shared,
    rejection: Rejection,
    req: &Request<()>,
) -> Response<TransactionalBody<B>> {
    shared
        .replay
        .respond(rejection, req)
        .map(TransactionalBody::full)
}

/// The whole request body, at most `max` bytes: `Err(true)` over it, `Err(false)` for a
/// body that failed.
async fn read_request<B: Body<Data = Bytes>>(body: B, max: usize) -> Result<Bytes, bool> {
    let mut body = std::pin::pin!(body);
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else { return Err(false) };
        if let Ok(data) = frame.into_data() {
            if bytes.len() + data.len() > max {
                return Err(true);
            }
            bytes.extend_from_slice(&data);
        }
    }
    Ok(bytes.freeze())
}

/// A response body read for its record.
enum Read<B> {
    /// All of it, within the limit.
    Whole(Bytes),
    /// Over the limit: what was read, and the rest still to send.
    Over(Bytes, Pin<Box<B>>),
    /// It failed before its end.
    Failed,
}

async fn read_response<B: Body<Data = Bytes>>(body: B, max: usize) -> Read<B> {
    let mut body = Box::pin(body);
    let mut bytes = BytesMut::new();
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Read::Failed;
        };
        if let Ok(data) = frame.into_data() {
            bytes.extend_from_slice(&data);
            if bytes.len() > max {
                return Read::Over(bytes.freeze(), body);
            }
        }
    }
    Read::Whole(bytes.freeze())
}

/// Serve `req` with `inner` (already ready) under the transactional protocol.
pub(super) async fn serve<S, ReqB, ResB>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqB>,
) -> Answer<ResB, S::Error>
where
    S: Service<Request<RequestBody<ReqB>>, Response = Response<ResB>>,
    ReqB: Body<Data = Bytes>,
    ResB: Body<Data = Bytes>,
{
    let replay = &shared.replay;
    let key = match replay.request_key(&req) {
        Ok(Some(key)) => key,
        Ok(None) => {
            let req = req.map(RequestBody::streaming);
            return inner
                .call(req)
                .await
                .map(|res| res.map(TransactionalBody::plain));
        }
        Err(rejection) => return Ok(reject(&shared, rejection, &head_of(&req))),
    };
    let head = head_of(&req);
    let (parts, body) = req.into_parts();
    let body = match read_request(body, replay.max_request_body()).await {
        Ok(body) => body,
        Err(too_large) => {
            let rejection = if too_large {
                replay.too_large()
            } else {
                replay.unreadable()
            };
            return Ok(reject(&shared, rejection, &head));
        }
    };
    let mut req = Request::from_parts(parts, RequestBody::buffered(body.clone()));
    let fingerprint = replay.fingerprint(&req, &body);
    let tx = match shared.claim(&key, &fingerprint).await {
        Claim::Ours(tx) => tx,
        Claim::Answer(Ok(replayed)) => return Ok(replayed.map(TransactionalBody::full)),
        Claim::Answer(Err(rejection)) => return Ok(reject(&shared, rejection, &head)),
    };
    let lent = LentTransaction::new(tx, Arc::clone(&shared.tables));
    req.extensions_mut().insert(lent.clone());
    // An error, a panic or a dropped future drops the transaction: sqlx rolls it back.
    let res = inner.call(req).await?;
    let tx = match lent.take_back() {
        Returned::Open(tx) => tx,
        Returned::Doomed(tx) => {
            let _ = tx.rollback().await;
            return Ok(res.map(TransactionalBody::plain));
        }
        Returned::Held => {
            tracing::error!(
                "the handler kept its idempotency transaction past its end; rolled back"
            );
            let detail = "the handler kept the request's transaction after it returned".to_owned();
            return Ok(reject(&shared, replay.misconfigured(detail), &head));
        }
    };
    let stores =
        res.extensions().get::<NotStored>().is_none() && replay.stores(res.status(), res.headers());
    if !stores {
        // "It did not happen": nothing of it stays, and the retry runs cleanly.
        let _ = tx.rollback().await;
        return Ok(res.map(TransactionalBody::plain));
    }
    let (parts, body) = res.into_parts();
    let meta = replay.encode_response(parts.status, &parts.headers);
    let not_kept = || replay.encode_not_kept(parts.status);
    let (record, answer) = match read_response(body, replay.max_response_body()).await {
        Read::Whole(bytes) => match meta {
            Some(meta) => ((meta, bytes.clone()), TransactionalBody::full(bytes)),
            None => ((not_kept(), Bytes::new()), TransactionalBody::full(bytes)),
        },
        Read::Over(prefix, rest) => (
            (not_kept(), Bytes::new()),
            TransactionalBody::prefixed(prefix, rest),
        ),
        Read::Failed => {
            let _ = tx.rollback().await;
            return Ok(reject(&shared, replay.unavailable_rejection(), &head));
        }
    };
    if let Err(error) = shared.complete(tx, &key, record.0, record.1).await {
        tracing::warn!(%error, "committing the idempotency record failed");
        return Ok(reject(&shared, replay.unavailable_rejection(), &head));
    }
    shared.sweep_if_due();
    Ok(Response::from_parts(parts, answer))
}
