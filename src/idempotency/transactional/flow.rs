//! One request through the tower service, top to bottom: the key, the body, the claim (or
//! the record's answer), the handler with the lent transaction, then the response stored
//! and committed with the handler's rows, or rolled back ([`protocol`](super::protocol)'s
//! steps, with a tower service and `http-body` bodies).

use std::{pin::Pin, sync::Arc};

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, Request, Response};
use http_body::Body;
use http_body_util::BodyExt;
use tower_service::Service;

use super::{
    RunsOn, TransactionalBody,
    protocol::{PendingClaim, Settled},
    shared::Shared,
};
use crate::{NotStored, idempotency::RequestBody};

type Answer<B, E> = Result<Response<TransactionalBody<B>>, E>;

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
    /// All of it, within the limit, and the trailers it ended with.
    Whole(Bytes, Option<HeaderMap>),
    /// Over the limit: what was read, and the rest still to send.
    Over(Bytes, Pin<Box<B>>),
    /// It failed before its end.
    Failed,
}

async fn read_response<B: Body<Data = Bytes>>(body: B, max: usize) -> Read<B> {
    let mut body = Box::pin(body);
    let mut bytes = BytesMut::new();
    let mut trailers = None;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            return Read::Failed;
        };
        match frame.into_data() {
            Ok(data) => {
                bytes.extend_from_slice(&data);
                if bytes.len() > max {
                    return Read::Over(bytes.freeze(), body);
                }
            }
            // The trailers end the body (a gRPC response's status is in them).
            Err(frame) => {
                if let Ok(frame) = frame.into_trailers() {
                    trailers = Some(frame);
                }
            }
        }
    }
    Read::Whole(bytes.freeze(), trailers)
}

/// Serve `req` with `inner` (already ready) under the transactional protocol; `runs_on`
/// is told when the handler begins, and says when the client left.
pub(super) async fn serve<S, ReqB, ResB>(
    shared: Arc<Shared>,
    mut inner: S,
    req: Request<ReqB>,
    runs_on: RunsOn,
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
        Err(rejection) => {
            return Ok(TransactionalBody::answer(replay.respond(rejection, &req)));
        }
    };
    let (parts, body) = req.into_parts();
    let body = match read_request(body, replay.max_request_body()).await {
        Ok(body) => body,
        Err(too_large) => {
            let rejection = if too_large {
                replay.too_large()
            } else {
                replay.unreadable()
            };
            let res = replay.respond(rejection, &Request::from_parts(parts, ()));
            return Ok(res.map(TransactionalBody::full));
        }
    };
    let mut req = Request::from_parts(parts, RequestBody::buffered(body.clone()));
    let pending = PendingClaim::new(Arc::clone(&shared), &req, key, &body);
    let claimed = match pending.claim().await {
        Ok(claimed) => claimed,
        // A replay ends with its stored trailers (a gRPC status).
        Err(answer) => return Ok(TransactionalBody::answer(answer)),
    };
    req.extensions_mut().insert(claimed.lent());
    // From here a client that leaves does not cancel the request (see `RunsOn`); a panic
    // drops the transaction: it is rolled back.
    runs_on.begin();
    let res = match inner.call(req).await {
        Ok(res) => res,
        Err(error) => {
            claimed.abandon().await;
            return Err(error);
        }
    };
    let marked = res.extensions().get::<NotStored>().is_some();
    let storing = match claimed.settle(res.status(), res.headers(), marked).await {
        Settled::RolledBack => return Ok(res.map(TransactionalBody::plain)),
        Settled::Refused(answer) => return Ok(answer.map(TransactionalBody::full)),
        Settled::Store(storing) => storing,
    };
    let (parts, body) = res.into_parts();
    let read = read_response(body, storing.max_body());
    let (stored, trailers, answer) = match runs_on
        .unless_gone_for(storing.max_drain_time(), read)
        .await
    {
        Some(Read::Whole(bytes, trailers)) => (
            Some(bytes.clone()),
            trailers.clone(),
            TransactionalBody::with_trailers(bytes, trailers),
        ),
        // A gRPC status still to come decides whether anything commits: the transaction
        // stays open while the rest streams to its client (nothing over the limit is
        // kept), and the trailers are sent once it committed a tombstone or rolled back.
        Some(Read::Over(prefix, rest)) if storing.decided_by_trailers() => {
            let body = TransactionalBody::deciding(prefix, rest, storing);
            return Ok(Response::from_parts(parts, body));
        }
        Some(Read::Over(prefix, rest)) => (None, None, TransactionalBody::prefixed(prefix, rest)),
        Some(Read::Failed) => return Ok(storing.abandon().await.map(TransactionalBody::full)),
        // Its client left and the body did not end within the drain time: completed, not
        // stored (a retry gets `409 response-not-stored`), as the engine-backed layer's;
        // a gRPC response without its status rolls back (`commit` without trailers).
        None => (None, None, TransactionalBody::full(Bytes::new())),
    };
    if let Err(answer) = storing.commit(stored, trailers.as_ref()).await {
        return Ok(TransactionalBody::answer(answer));
    }
    Ok(Response::from_parts(parts, answer))
}
