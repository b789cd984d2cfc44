//! [`discard_small_body`]: read what is left of a small request body before a rejection is
//! sent, so that actix keeps the connection open for the client's next request.
//!
//! actix-web closes an HTTP/1.1 connection (`connection: close`) when it sends a response
//! while the request body is still unread: the rest of the body would otherwise be taken
//! for the next request. A chunked body that was dropped it reads to its end itself; a
//! body of known length (`content-length`, what clients send for JSON) it does not. The
//! tower layer's server (hyper) keeps such a connection, and a rejection is an ordinary
//! answer that the client often follows with its next request (a retry after `423`), so a
//! small body is read and thrown away here first, as a proxy would. A large or slow body
//! is left unread and the connection closed, as actix does: reading megabytes only to
//! save a connection would cost more than the connection.

use std::time::Duration;

use actix_web::{
    FromRequest,
    dev::ServiceRequest,
    http::header::{CONTENT_LENGTH, TRANSFER_ENCODING},
    web,
};

/// The largest body read to keep the connection: a JSON request's, not an upload's.
const MAX_DISCARDED_BODY: usize = 64 * 1024;

/// How long the rest of a small body may take to arrive: it is on its way when the
/// request is rejected; a client that stalls loses its connection, not the server a task.
const MAX_DISCARD_TIME: Duration = Duration::from_secs(1);

/// Read and drop the unread body of `req` when its `content-length` is at most
/// [`MAX_DISCARDED_BODY`], within [`MAX_DISCARD_TIME`]; otherwise leave it (actix then
/// closes the connection after the response).
pub(crate) async fn discard_small_body(req: &mut ServiceRequest) {
    let headers = req.headers();
    if headers.contains_key(TRANSFER_ENCODING) {
        // Chunked: actix reads a dropped chunked body to its end itself.
        return;
    }
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<usize>().ok());
    if !length.is_some_and(|n| n > 0 && n <= MAX_DISCARDED_BODY) {
        return;
    }
    let (http_req, payload) = req.parts_mut();
    let Ok(payload) = web::Payload::from_request(http_req, payload).await else {
        return;
    };
    // Whatever the outcome (read, too long, failed, late), the response goes out next.
    let _ = actix_web::rt::time::timeout(
        MAX_DISCARD_TIME,
        payload.to_bytes_limited(MAX_DISCARDED_BODY),
    )
    .await;
}
