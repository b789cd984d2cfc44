//! The handler outlives its client: a client that leaves mid-handler or mid-body still
//! has its response produced and stored in full; a body that never ends is drained for a
//! bounded time only; a panicking handler or body costs only its own request.

use std::{sync::atomic::Ordering, time::Duration};

use bytes::Bytes;
use http::StatusCode;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    time::sleep,
};

use super::{app::replay_app, drain_bounded, post_with, preset, raw_post, until_recorded};
use crate::scenarios::{Framework, Stack, idempotency_lock_key};

/// A client that disconnects while its handler runs does not cancel it: the handler
/// completes once, and the retry gets the replay.
pub async fn a_client_leaving_mid_handler_still_gets_its_replay(on: Stack) {
    let table = on.table("replay-leave-handler").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let mut stream = raw_post(&app.server, "/slow", "o6").await;
    assert_eq!(app.control.arrived().await, "1");
    match on.framework {
        // The client leaves: hyper reads the end of the stream, drops the request's future
        // and closes its side, which is what the read below waits for.
        Framework::Tower => {
            stream.shutdown().await.unwrap();
            let mut buf = [0u8; 256];
            while matches!(stream.read(&mut buf).await, Ok(n) if n > 0) {}
        }
        // actix does not notice a closed connection while the handler runs (it notices
        // when it next writes, actix-web#1313), so it never drops a running handler: the
        // client just leaves.
        Framework::Actix => drop(stream),
    }
    app.control.open();
    until_recorded(&table, "o6").await;
    let retry = post_with(&app.server, "/slow", "o6", "").await;
    assert_eq!(
        (retry.status, retry.text().as_str()),
        (StatusCode::CREATED, "slow 1")
    );
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o6")], 1)
        .await;
}

/// A client that disconnects in the middle of a streaming body: the rest of the body is
/// still produced and stored in full; the retry gets all of it.
pub async fn a_client_leaving_mid_body_still_gets_the_whole_body_stored(on: Stack) {
    let table = on.table("replay-leave-body").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let mut stream = raw_post(&app.server, "/stream", "o7").await;
    let tx = app.streams.recv().await.unwrap();
    tx.send(Bytes::from_static(b"part one;")).await.unwrap();
    // The client has the head and the first chunk, then leaves.
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("part one;") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    for part in ["part two;", "part three."] {
        tx.send(Bytes::from(part)).await.unwrap();
    }
    drop(tx);
    until_recorded(&table, "o7").await;
    let retry = post_with(&app.server, "/stream", "o7", "").await;
    assert_eq!(retry.text(), "part one;part two;part three.");
    assert_eq!(retry.header("idempotent-replayed"), Some("true"));
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("o7")], 1)
        .await;
}

/// A body streamed in several chunks is stored in full.
pub async fn a_streaming_body_is_stored_in_full(on: Stack) {
    let table = on.table("replay-stream").await;
    let mut app = replay_app(on, preset(&table).build().unwrap()).await;
    let server = app.server.clone();
    let first = tokio::spawn(async move { post_with(&server, "/stream", "o8", "").await });
    let tx = app.streams.recv().await.unwrap();
    for i in 0..50 {
        tx.send(Bytes::from(format!("chunk {i}\n"))).await.unwrap();
    }
    drop(tx);
    let first = first.await.unwrap();
    assert_eq!(first.text().lines().count(), 50);
    until_recorded(&table, "o8").await;
    let again = post_with(&app.server, "/stream", "o8", "").await;
    assert_eq!(again.body, first.body);
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
}

/// A response body that panics, or a handler that panics, costs only its own request:
/// the server keeps serving, nothing is stored, and the key is released at once.
pub async fn a_panicking_body_or_handler_costs_only_its_own_request(on: Stack) {
    let table = on.table("replay-panic").await;
    let app = replay_app(on, preset(&table).build().unwrap()).await;
    for (path, k) in [("/panic-body", "p1"), ("/panic", "p2")] {
        let mut stream = raw_post(&app.server, path, k).await;
        // Whatever the server manages to send, the connection ends.
        let mut buf = [0u8; 1024];
        while matches!(
            tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await,
            Ok(Ok(n)) if n > 0
        ) {}
        // The server is alive and serves the next request.
        let next = post_with(&app.server, "/orders", &format!("after-{k}"), "x").await;
        assert_eq!(next.status, StatusCode::CREATED, "after {path}");
    }
    let mut keys: Vec<String> = ["p1", "p2"]
        .iter()
        .map(|k| idempotency_lock_key(k))
        .collect();
    // Nothing stored for the panicking requests (their keys are free within 5 s, not a
    // lease TTL); the two requests after them are.
    keys.extend(
        ["after-p1", "after-p2"]
            .iter()
            .map(|k| idempotency_lock_key(k)),
    );
    table.assert_only_records(&keys, 2).await;
    for k in ["p1", "p2"] {
        let key = tower_lock::LockKey::new(idempotency_lock_key(k)).unwrap();
        assert!(table.engine().record(&key).await.unwrap().is_none(), "{k}");
    }
}

/// A response body that never ends after its client left (a stream answering a keyed
/// `POST`) is drained for a bounded time only: then the request is recorded as completed
/// but not stored (a retry is `409 response-not-stored`, never a second run), and the key
/// is released.
pub async fn an_endless_body_after_its_client_left_is_cut_off(on: Stack) {
    let table = on.table("replay-endless").await;
    let layer = drain_bounded(preset(&table)).build().unwrap();
    let mut app = replay_app(on, layer).await;
    let mut stream = raw_post(&app.server, "/stream", "e1").await;
    let tx = app.streams.recv().await.unwrap();
    tx.send(Bytes::from_static(b"event 1\n")).await.unwrap();
    let mut seen = Vec::new();
    while !String::from_utf8_lossy(&seen).contains("event 1") {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.unwrap();
        assert!(n > 0, "closed early");
        seen.extend_from_slice(&buf[..n]);
    }
    drop(stream);
    // The stream goes on, an event every 50 ms, but nobody reads it any more. (actix
    // notices a client that left only when it next writes, actix-web#1313: the events
    // are what let it notice.)
    let events = tokio::spawn(async move {
        for n in 2.. {
            if tx.send(Bytes::from(format!("event {n}\n"))).await.is_err() {
                break;
            }
            sleep(Duration::from_millis(50)).await;
        }
    });
    until_recorded(&table, "e1").await;
    let retry = post_with(&app.server, "/stream", "e1", "").await;
    assert_eq!(retry.status, StatusCode::CONFLICT);
    assert_eq!(
        retry.json()["type"],
        "urn:tower-lock:problem:response-not-stored"
    );
    assert_eq!(app.runs.load(Ordering::SeqCst), 1);
    table
        .assert_only_records(&[idempotency_lock_key("e1")], 1)
        .await;
    events.abort();
}
