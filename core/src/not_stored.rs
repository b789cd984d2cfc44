//! [`NotStored`]: the response mark that keeps a response out of the idempotency record.

/// Put in a response's extensions, it keeps the response from being stored for replay:
/// the key is released when the body ends, nothing is recorded, and a retry with the same
/// key runs again. For answers that mean "this did not happen" in a way the status does
/// not tell (a `400` from an extractor, a `200` that only says "queued, try later").
///
/// tower-lock's own rejections carry it, so a lock layer inside an idempotency layer never
/// has its `423`, `429` or `400` frozen into the record. On actix-web, insert it into the
/// `HttpResponse`'s extensions.
///
/// ```
/// use axum::response::IntoResponse;
/// use http::StatusCode;
/// use tower_lock::idempotency::NotStored;
///
/// async fn create() -> axum::response::Response {
///     let mut res = (StatusCode::BAD_REQUEST, "the sku does not exist yet").into_response();
///     res.extensions_mut().insert(NotStored);
///     res
/// }
/// # let _ = create;
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NotStored;
