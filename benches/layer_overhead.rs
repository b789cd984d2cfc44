//! What the lock layer costs a request at the tower level, in process and uncontended,
//! beside a keyed rate check: `ServiceBuilder::new().layer(LockLayer…)` over a trivial
//! `service_fn` answering `200 ok`, on the in-process engine, against the same service
//! behind `tower_governor` keyed by the same header, against the bare service, all in one
//! run. Prints a JSON object per workload, one a line.
//!
//! ```sh
//! cargo bench --bench layer_overhead                      # 7 rounds of 200,000 requests
//! cargo bench --bench layer_overhead -- --requests 500000 --rounds 9
//! # one stack alone, for a profiler or `perf stat` (instructions do not depend on load)
//! cargo bench --bench layer_overhead -- --only lock_layer
//! ```
//!
//! Requests are sequential (one at a time, so never contended), their key in the
//! `x-lock-key` header: one key for every request (`hot`), or a key of 1,024 in turn
//! (`distinct`). Each request's response body is read to its end, as a server would: the
//! layer holds its lease until then. Each round runs every stack once, in an order that
//! alternates between rounds; the figures are the median of the rounds, in nanoseconds per
//! request, and the layer's and the rate check's cost is their figure less the bare
//! service's of the same round. Allocations per request are counted by a counting global
//! allocator over the same requests (every thread's, the engine's own included).

mod support;

use std::{
    convert::Infallible,
    num::NonZeroU32,
    process::ExitCode,
    time::{Duration, Instant},
};

use axum::body::Body;
use http::{HeaderName, HeaderValue, Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::{Service, ServiceBuilder, ServiceExt, service_fn};
use tower_governor::{
    GovernorError, GovernorLayer, governor::GovernorConfigBuilder, key_extractor::KeyExtractor,
};
use tower_lock::{LockEngine, LockLayer, key::HeaderKey};

#[global_allocator]
static GLOBAL: support::counting::Counting = support::counting::Counting;

/// How many distinct keys the `distinct` workload cycles through.
const DISTINCT_KEYS: usize = 1024;

/// The rate check's key: the value of the same header the layer locks on, owned (as the
/// layer's lock key is).
#[derive(Clone)]
struct HeaderRateKey;

impl KeyExtractor for HeaderRateKey {
    type Key = String;

    fn extract<T>(&self, req: &Request<T>) -> Result<Self::Key, GovernorError> {
        req.headers()
            .get(support::KEY_HEADER)
            .and_then(|v| v.to_str().ok())
            .map(str::to_owned)
            .ok_or(GovernorError::UnableToExtractKey)
    }
}

/// The trivial service every stack wraps: `200 ok`.
async fn ok(_req: Request<Body>) -> Result<Response<Body>, Infallible> {
    Ok(Response::new(Body::from("ok")))
}

/// One request through `svc`, its response body read to its end.
async fn call<S>(svc: &mut S, key: &HeaderValue)
where
    S: Service<Request<Body>>,
    S::Response: IntoBody,
    S::Error: std::fmt::Debug,
{
    let mut req = Request::new(Body::empty());
    req.headers_mut()
        .insert(HeaderName::from_static(support::KEY_HEADER), key.clone());
    let svc = svc.ready().await.expect("ready");
    let response = svc.call(req).await.expect("infallible");
    response.drain().await;
}

/// A response whose status is checked and whose body is read to its end, frame by frame
/// (no buffer: the bench measures the stack, not a collector).
trait IntoBody {
    async fn drain(self);
}

impl<B> IntoBody for Response<B>
where
    B: http_body::Body + Unpin,
    B::Error: std::fmt::Debug,
{
    async fn drain(self) {
        assert_eq!(self.status(), StatusCode::OK, "an uncontended request runs");
        let mut body = self.into_body();
        while let Some(frame) = body.frame().await {
            std::hint::black_box(frame.expect("an in-memory body cannot fail"));
        }
    }
}

/// Nanoseconds and allocations per request of `n` requests through `svc`, keys from `keys`
/// in turn.
async fn measure<S>(svc: &mut S, keys: &[HeaderValue], n: usize) -> (f64, f64)
where
    S: Service<Request<Body>>,
    S::Response: IntoBody,
    S::Error: std::fmt::Debug,
{
    let allocations = support::counting::allocations();
    let started = Instant::now();
    for i in 0..n {
        call(svc, &keys[i % keys.len()]).await;
    }
    let elapsed = started.elapsed();
    let allocated = support::counting::allocations() - allocations;
    (
        elapsed.as_nanos() as f64 / n as f64,
        allocated as f64 / n as f64,
    )
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

/// The stacks' names, in the order of [`workload`]'s figures.
const STACKS: [&str; 3] = ["bare", "lock_layer", "governor"];

/// The three stacks (or `only` the one of that index), measured round by round on `keys`:
/// the workload's JSON figures.
async fn workload(
    name: &str,
    keys: &[HeaderValue],
    n: usize,
    rounds: usize,
    only: Option<usize>,
) -> Value {
    let mut bare = ServiceBuilder::new().service(service_fn(ok));
    let lock_layer = LockLayer::builder(LockEngine::in_memory())
        .key(HeaderKey::new(HeaderName::from_static(support::KEY_HEADER)))
        // The bench sends `GET`s, which the default leaves unlocked (a safe method).
        .methods(["GET"])
        .wait(Duration::from_secs(30))
        .build()
        .expect("the bench's layer configuration is valid");
    let mut locked = ServiceBuilder::new()
        .layer(lock_layer)
        .service(service_fn(ok));
    // A quota no sequential run reaches: the check always passes, as the lock is always
    // free.
    let config = GovernorConfigBuilder::default()
        .key_extractor(HeaderRateKey)
        .per_nanosecond(1)
        .burst_size(NonZeroU32::MAX.get())
        .finish()
        .expect("the bench's rate limit configuration is valid");
    let mut governed = ServiceBuilder::new()
        .layer(GovernorLayer::new(config))
        .service(service_fn(ok));

    // Warm-up: every key seen once by every stack, caches and the engine's watchdog started.
    let warm = n.min(20_000).max(keys.len());
    let mut figures: [Vec<(f64, f64)>; 3] = Default::default();
    for round in 0..=rounds {
        // Alternate the order, so that no stack always runs right after the same one.
        let order: [usize; 3] = if round % 2 == 0 { [0, 1, 2] } else { [2, 1, 0] };
        for stack in order.into_iter().filter(|&s| only.is_none_or(|o| o == s)) {
            // Round 0 is the warm-up: every key seen once by every stack, caches and the
            // engine's watchdog started.
            let requests = if round == 0 { warm } else { n };
            let figure = match stack {
                0 => measure(&mut bare, keys, requests).await,
                1 => measure(&mut locked, keys, requests).await,
                _ => measure(&mut governed, keys, requests).await,
            };
            if round > 0 {
                figures[stack].push(figure);
            }
        }
    }
    let ns = |stack: usize| median(figures[stack].iter().map(|f| f.0).collect());
    if let Some(stack) = only {
        return json!({
            "workload": name,
            "only": STACKS[stack],
            "ns": ns(stack).round(),
            "allocations": round2(median(figures[stack].iter().map(|f| f.1).collect())),
        });
    }
    let extra = |stack: usize| {
        median(
            figures[stack]
                .iter()
                .zip(&figures[0])
                .map(|(f, bare)| f.0 - bare.0)
                .collect(),
        )
    };
    let allocs = |stack: usize| median(figures[stack].iter().map(|f| f.1).collect());
    let (lock_extra, governor_extra) = (extra(1), extra(2));
    json!({
        "workload": name,
        "bare_ns": ns(0).round(),
        "lock_layer_ns": ns(1).round(),
        "governor_ns": ns(2).round(),
        "lock_layer_extra_ns": lock_extra.round(),
        "governor_extra_ns": governor_extra.round(),
        "lock_layer_extra_per_governor_extra": round2(lock_extra / governor_extra),
        "bare_allocations": round2(allocs(0)),
        "lock_layer_extra_allocations": round2(allocs(1) - allocs(0)),
        "governor_extra_allocations": round2(allocs(2) - allocs(0)),
    })
}

fn main() -> ExitCode {
    let args = match support::Args::parse(&["help"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("layer_overhead: {e}");
            return ExitCode::from(2);
        }
    };
    if args.flag("help") {
        println!(
            "usage: layer_overhead [--requests N (200000)] [--rounds R (7)] \
             [--only bare|lock_layer|governor (one stack alone, to profile it)]"
        );
        return ExitCode::SUCCESS;
    }
    let parsed = args
        .reject_unknown(&["help", "requests", "rounds", "only"])
        .and_then(|()| {
            let only = match args.string("only") {
                None => None,
                Some(s) => Some(
                    STACKS
                        .iter()
                        .position(|&name| name == s)
                        .ok_or_else(|| format!("--only: no stack `{s}`"))?,
                ),
            };
            // Under `cargo test` (no `--bench`): a short run, to check that it works.
            let (n, r) = if args.benching() {
                (200_000, 7)
            } else {
                (2_000, 1)
            };
            Ok((
                args.get("requests", n)?,
                args.get("rounds", r)?.max(1),
                only,
            ))
        });
    let (n, rounds, only) = match parsed {
        Ok(p) => p,
        Err(e) => {
            eprintln!("layer_overhead: {e}");
            return ExitCode::from(2);
        }
    };
    // The stacks are driven from one thread, as a server's connection task drives its
    // requests; the engine's own runtime (its watchdog) runs on threads of its own.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let hot = [HeaderValue::from_static("k1")];
    let distinct: Vec<HeaderValue> = (0..DISTINCT_KEYS)
        .map(|i| HeaderValue::from_str(&format!("k{i}")).expect("a valid header value"))
        .collect();
    runtime.block_on(async {
        for (name, keys) in [("hot", &hot[..]), ("distinct", &distinct[..])] {
            let mut line = workload(name, keys, n, rounds, only).await;
            line["bench"] = json!("layer_overhead");
            line["requests_per_round"] = json!(n);
            line["rounds"] = json!(rounds);
            println!("{line}");
        }
    });
    ExitCode::SUCCESS
}
