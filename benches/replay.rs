//! Idempotency replay bench: replayed requests per second over HTTP (in process and on
//! Redis) against baselines measured in the same run, and what fingerprinting costs a
//! first request. Prints one JSON object per figure.
//!
//! ```sh
//! cargo bench --bench replay -- --json
//! REDIS_URL=redis://127.0.0.1:6379 cargo bench --bench replay -- --json
//! ```
//!
//! - `replay/memory` and `replay/redis`: 50 keep-alive connections send the same
//!   `POST /orders` with one Idempotency-Key, so every request after the first is a
//!   replay; `ratio_to_bare` divides by the same load on the bare axum handler.
//! - `replay/redis` also reports `ratio_to_get`: its rate ÷ `redis-benchmark -t get -c 50`
//!   on the same server (one replay is one record read: one round trip).
//! - `round_trips/redis`: Redis round trips per request, counted with `MONITOR` (every
//!   command a client sent, not those its scripts ran), for sequential first requests
//!   (fresh keys; goal: 2, a begin and a completion) and for replays (goal: 1).
//! - `first_request/<size>`: sequential first requests (a fresh key each) with a body of
//!   1 KiB and 1 MiB, under the layer (in process) and bare; the difference per request is
//!   what reading and fingerprinting the body and storing the response cost.

mod support;

use std::{
    net::SocketAddr,
    process::{Command, ExitCode},
    time::{Duration, Instant},
};

use axum::{Router, http::StatusCode, routing::post};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Request, header::HOST};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use support::{Args, round};
use tokio::{net::TcpStream, runtime::Runtime};
use tower_lock::{IdempotencyLayer, LockEngine};

const CONNECTIONS: usize = 50;

fn bare() -> Router {
    Router::new().route(
        "/orders",
        post(|body: Bytes| async move {
            (
                StatusCode::CREATED,
                format!("order of {} bytes", body.len()),
            )
        }),
    )
}

fn replaying(engine: LockEngine) -> Router {
    let layer = IdempotencyLayer::builder(engine)
        .unscoped()
        .max_request_body(2 << 20)
        .build()
        .expect("valid layer");
    bare().layer(layer)
}

/// Serve `app` on its own runtime (one thread, as the server of the HTTP bench).
fn serve(rt: &Runtime, app: Router) -> SocketAddr {
    rt.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        addr
    })
}

async fn sender(addr: SocketAddr) -> hyper::client::conn::http1::SendRequest<Full<Bytes>> {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let (sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .unwrap();
    tokio::spawn(driver);
    sender
}

fn request(key: &str, body: Bytes) -> Request<Full<Bytes>> {
    Request::post("/orders")
        .header(HOST, "localhost")
        .header("idempotency-key", format!("\"{key}\""))
        .body(Full::new(body))
        .unwrap()
}

/// Requests per second with `CONNECTIONS` connections sending the same keyed request.
async fn rate(addr: SocketAddr, key: &str, duration: Duration) -> (f64, u64) {
    // The first request runs the handler; every later one is a replay.
    let mut first = sender(addr).await;
    let res = first
        .send_request(request(key, Bytes::from_static(b"{}")))
        .await
        .unwrap();
    res.into_body().collect().await.unwrap();
    let until = Instant::now() + duration;
    let tasks: Vec<_> = (0..CONNECTIONS)
        .map(|_| {
            let key = key.to_owned();
            tokio::spawn(async move {
                let mut s = sender(addr).await;
                let (mut done, mut bad) = (0u64, 0u64);
                while Instant::now() < until {
                    s.ready().await.unwrap();
                    let res = s
                        .send_request(request(&key, Bytes::from_static(b"{}")))
                        .await
                        .unwrap();
                    bad += u64::from(res.status() != StatusCode::CREATED);
                    res.into_body().collect().await.unwrap();
                    done += 1;
                }
                (done, bad)
            })
        })
        .collect();
    let (mut done, mut bad) = (0, 0);
    for t in tasks {
        let (d, b) = t.await.unwrap();
        done += d;
        bad += b;
    }
    (done as f64 / duration.as_secs_f64(), bad)
}

/// Mean time of `n` sequential first requests (fresh keys) with a body of `size` bytes.
async fn first_requests(addr: SocketAddr, size: usize, n: usize) -> f64 {
    let body = Bytes::from(vec![b'x'; size]);
    let mut s = sender(addr).await;
    let started = Instant::now();
    for i in 0..n {
        s.ready().await.unwrap();
        let res = s
            .send_request(request(&format!("first-{size}-{i}"), body.clone()))
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        res.into_body().collect().await.unwrap();
    }
    started.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// The commands clients sent to the server of `url` with `prefix` in them while `op` ran
/// (not those scripts ran: `MONITOR` tags those `lua`), or `None` if it cannot be watched.
async fn round_trips<F, Fut>(url: &str, prefix: &str, op: F) -> Option<u64>
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = ()>,
{
    use std::io::{BufRead, BufReader, Write};
    let hostport = url
        .strip_prefix("redis://")?
        .split(['/', '?'])
        .next()?
        .to_owned();
    let mut stream = std::net::TcpStream::connect(&hostport).ok()?;
    stream.write_all(b"MONITOR\r\n").ok()?;
    let mut reader = BufReader::new(stream.try_clone().ok()?);
    let mut ok = String::new();
    reader.read_line(&mut ok).ok()?;
    let prefix = format!("\"{prefix}:");
    let counter = std::thread::spawn(move || {
        let mut n = 0u64;
        let mut line = String::new();
        while reader.read_line(&mut line).is_ok_and(|r| r > 0) {
            if line.contains("STOP-COUNTING") {
                break;
            }
            if line.contains(&prefix) && !line.contains(" lua]") {
                n += 1;
            }
            line.clear();
        }
        n
    });
    op().await;
    // Everything sent before this marker has been echoed before it.
    let mut marker = std::net::TcpStream::connect(&hostport).ok()?;
    marker.write_all(b"ECHO STOP-COUNTING\r\n").ok()?;
    let counted = counter.join().ok();
    drop(stream);
    counted
}

/// `redis-benchmark -t get -c 50` against the server of `url`, in requests per second.
fn redis_get_rate(url: &str) -> Option<f64> {
    let port = url
        .rsplit(':')
        .next()?
        .trim_end_matches('/')
        .parse::<u16>()
        .ok()?;
    let out = Command::new("redis-benchmark")
        .args([
            "-p",
            &port.to_string(),
            "-t",
            "get",
            "-c",
            "50",
            "-n",
            "200000",
            "-q",
        ])
        .output()
        .ok()?;
    let text = String::from_utf8_lossy(&out.stdout);
    // "GET: 61349.69 requests per second, p50=0.407 msec"
    // Progress updates come first, on the same line, each ended by a carriage return.
    let line = text.lines().rev().find(|l| l.contains("GET"))?;
    let line = line.rsplit('\r').next()?;
    let after = line.split("GET:").nth(1)?;
    after.split_whitespace().next()?.parse().ok()
}

fn main() -> ExitCode {
    let args = match Args::parse(&["json", "help"]) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::FAILURE;
        }
    };
    if args.flag("help") {
        println!("replay: replayed requests/s and first-request overhead; see the file's docs");
        return ExitCode::SUCCESS;
    }
    if !args.benching() {
        // `cargo test --benches` runs this binary: nothing to check.
        return ExitCode::SUCCESS;
    }
    let duration = Duration::from_secs_f64(args.get("duration-secs", 3.0).unwrap());
    let server_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let client_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let mut lines: Vec<Value> = Vec::new();

    let bare_addr = serve(&server_rt, bare());
    let memory_addr = serve(&server_rt, replaying(LockEngine::in_memory()));
    let (bare_rate, _) = client_rt.block_on(rate(bare_addr, "bare", duration));
    let (memory_rate, bad) = client_rt.block_on(rate(memory_addr, "memory", duration));
    lines.push(json!({
        "bench": "replay", "scenario": "bare", "rps": round(bare_rate, 0),
    }));
    lines.push(json!({
        "bench": "replay", "scenario": "replay/memory", "rps": round(memory_rate, 0),
        "not_201": bad, "ratio_to_bare": round(memory_rate / bare_rate, 3), "goal": ">= 0.8",
    }));

    if let Some(url) = support::redis_url(&args) {
        match server_rt.block_on(support::redis_engine(&url, "bench-replay")) {
            Ok(engine) => {
                let redis_addr = serve(&server_rt, replaying(engine));
                let key = format!("redis-{}", std::process::id());
                let (redis_rate, bad) = client_rt.block_on(rate(redis_addr, &key, duration));
                let get = redis_get_rate(&url);
                lines.push(json!({
                    "bench": "replay", "scenario": "replay/redis", "rps": round(redis_rate, 0),
                    "not_201": bad, "ratio_to_bare": round(redis_rate / bare_rate, 3),
                    "redis_benchmark_get_c50": get.map(|g| round(g, 0)),
                    "ratio_to_get": get.map(|g| round(redis_rate / g, 3)), "goal": ">= 0.5",
                }));
            }
            Err(e) => eprintln!("redis: {e}"),
        }
        match server_rt.block_on(support::redis_engine(&url, "bench-rt")) {
            Ok(engine) => {
                let addr = serve(&server_rt, replaying(engine));
                let n = 200;
                let first = client_rt.block_on(round_trips(&url, "bench-rt", || async {
                    first_requests(addr, 16, n).await;
                }));
                let again = client_rt.block_on(round_trips(&url, "bench-rt", || async {
                    first_requests(addr, 16, n).await;
                }));
                lines.push(json!({
                    "bench": "replay", "scenario": "round_trips/redis",
                    "first_request_round_trips": first.map(|c| round(c as f64 / n as f64, 2)),
                    "replay_round_trips": again.map(|c| round(c as f64 / n as f64, 2)),
                    "goal": "2 and 1",
                }));
            }
            Err(e) => eprintln!("redis: {e}"),
        }
    }

    for (size, n) in [(1 << 10, 400), (1 << 20, 40)] {
        let bare_us = client_rt.block_on(first_requests(bare_addr, size, n));
        let layer_us = client_rt.block_on(first_requests(memory_addr, size, n));
        lines.push(json!({
            "bench": "replay", "scenario": format!("first_request/{}", if size == 1024 { "1KiB" } else { "1MiB" }),
            "bare_us": round(bare_us, 1), "layer_us": round(layer_us, 1),
            "overhead_us": round(layer_us - bare_us, 1),
        }));
    }
    for line in &lines {
        if args.flag("json") {
            println!("{line}");
        } else {
            println!("{line:#}");
        }
    }
    ExitCode::SUCCESS
}
