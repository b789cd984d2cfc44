//! The bench's HTTP/1.1 load generator: hyper's client, one keep-alive connection per
//! concurrent client, each sending its requests back to back.

use std::{
    net::SocketAddr,
    time::{Duration, Instant},
};

use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::{Request, StatusCode, header::HOST};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::support::{self, micros};

/// What one slice of load measured: the latency of each request sent in the measured
/// window, and how many of those were not answered `200 OK`.
pub(crate) struct LoadOutcome {
    pub(crate) latencies: Vec<f64>,
    pub(crate) errors: u64,
}

/// Keep `connections` requests in flight for `warmup` plus `slice`; record the requests
/// sent inside the measured window.
pub(crate) async fn load(
    connections: usize,
    warmup: Duration,
    addr: SocketAddr,
    hot: bool,
    slice: Duration,
) -> Result<LoadOutcome, String> {
    let measure_from = Instant::now() + warmup;
    let until = measure_from + slice;
    let tasks: Vec<_> = (0..connections)
        .map(|conn| tokio::spawn(connection(addr, conn, hot, measure_from, until)))
        .collect();
    let mut outcome = LoadOutcome {
        latencies: Vec::new(),
        errors: 0,
    };
    for task in tasks {
        let one = task.await.map_err(|e| format!("client task: {e}"))??;
        outcome.latencies.extend(one.latencies);
        outcome.errors += one.errors;
    }
    Ok(outcome)
}

/// One client connection sending requests back to back.
async fn connection(
    addr: SocketAddr,
    conn: usize,
    hot: bool,
    measure_from: Instant,
    until: Instant,
) -> Result<LoadOutcome, String> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|e| format!("connect: {e}"))?;
    stream.set_nodelay(true).map_err(|e| e.to_string())?;
    let (mut sender, driver) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("handshake: {e}"))?;
    tokio::spawn(driver);
    let mut outcome = LoadOutcome {
        latencies: Vec::new(),
        errors: 0,
    };
    for seq in 0u64.. {
        let sent = Instant::now();
        if sent >= until {
            break;
        }
        let key = if hot {
            "hot".to_string()
        } else {
            format!("c{conn}-{seq}")
        };
        let request = Request::get(format!("/items/{key}"))
            .header(HOST, "localhost")
            .header(support::KEY_HEADER, &key)
            .body(Empty::<Bytes>::new())
            .expect("valid request");
        sender
            .ready()
            .await
            .map_err(|e| format!("connection closed: {e}"))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("request: {e}"))?;
        let status = response.status();
        response
            .into_body()
            .collect()
            .await
            .map_err(|e| format!("body: {e}"))?;
        if sent >= measure_from {
            outcome.latencies.push(micros(sent.elapsed()));
            if status != StatusCode::OK {
                outcome.errors += 1;
            }
        }
    }
    Ok(outcome)
}
