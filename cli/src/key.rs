//! `key`: the lock key a layer derives from a request, computed by the core's own
//! extractors and encoding (`<namespace>/<kind>/<value>`), so nobody builds one by hand.

use serde_json::json;
use tower_lock_core::{
    http,
    key::{HeaderKey, IdempotencyKey, KeyExtractor, MethodPathKey, PathKey, encode},
};

use crate::{
    args::KeyArgs,
    output::{Failure, OK, Outcome},
};

pub(crate) fn run(args: &KeyArgs) -> Result<Outcome, Failure> {
    let mut request = http::Request::builder();
    let extractor: Box<dyn KeyExtractor> = match (&args.header, &args.idempotency_key, &args.path) {
        (Some(header), None, None) => {
            let [name, value] = header.as_slice() else {
                return Err(Failure::usage("--header takes NAME VALUE"));
            };
            request = request.header(name.as_str(), value.as_str());
            Box::new(HeaderKey::new(name))
        }
        (None, Some(value), None) => {
            request = request.header("idempotency-key", value.as_str());
            Box::new(IdempotencyKey::new())
        }
        (None, None, Some(path)) => {
            request = request.uri(path.as_str());
            match &args.method {
                Some(method) => {
                    request = request.method(method.as_str());
                    Box::new(MethodPathKey)
                }
                None => Box::new(PathKey),
            }
        }
        _ => {
            return Err(Failure::usage(
                "give one of --header NAME VALUE, --idempotency-key VALUE, --path PATH",
            ));
        }
    };
    extractor.validate().map_err(Failure::usage)?;
    let request = request
        .body(())
        .map_err(|e| Failure::usage(format!("not a valid request: {e}")))?;
    let value = extractor
        .extract(&request)
        .map_err(|e| Failure::usage(e.reason().to_owned()))?
        .ok_or_else(|| Failure::usage("the request gives no value for this extractor"))?;
    let key = encode(&args.namespace, extractor.kind(), &value);
    Ok(Outcome::new(
        OK,
        format!("{key}\n"),
        json!({"key": key, "namespace": args.namespace, "kind": extractor.kind(), "value": value}),
    ))
}
