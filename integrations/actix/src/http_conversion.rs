//! Between actix-web's `http` 0.2 types and the `http` 1 types tower-lock's core speaks:
//! rejection and replay responses into actix, response headers out of it.

use actix_web::{
    HttpResponse,
    body::BoxBody,
    http::{
        StatusCode,
        header::{HeaderName, HeaderValue},
    },
};
use bytes::Bytes;
use tower_lock::NotStored;

/// Converts the locker's `http` 1 response into an actix (`http` 0.2) one. Status and
/// header names and values were valid in `http` 1 and are valid here; anything that is
/// not is left out rather than failing the request.
pub(crate) fn to_actix_response(res: http::Response<Bytes>) -> HttpResponse<BoxBody> {
    let (parts, body) = res.into_parts();
    let status =
        StatusCode::from_u16(parts.status.as_u16()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut response = HttpResponse::with_body(status, body);
    if parts.extensions.get::<NotStored>().is_some() {
        // A rejection: an idempotency middleware outside must not store it.
        response.extensions_mut().insert(NotStored);
    }
    let headers = response.headers_mut();
    for (name, value) in &parts.headers {
        if let (Ok(name), Ok(value)) = (
            HeaderName::from_bytes(name.as_str().as_bytes()),
            HeaderValue::from_bytes(value.as_bytes()),
        ) {
            headers.append(name, value);
        }
    }
    response.map_into_boxed_body()
}

/// The response headers as `http` 1 headers, for the replay capture. Names and values that
/// do not convert are left out.
#[cfg_attr(not(feature = "idempotency"), allow(dead_code))]
pub(crate) fn http_headers(headers: &actix_web::http::header::HeaderMap) -> http::HeaderMap {
    let mut out = http::HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        if let (Ok(name), Ok(value)) = (
            http::HeaderName::from_bytes(name.as_str().as_bytes()),
            http::HeaderValue::from_bytes(value.as_bytes()),
        ) {
            out.append(name, value);
        }
    }
    out
}
