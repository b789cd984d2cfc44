//! What a scenario's handlers do, said once for every framework.

use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use tokio::sync::{mpsc, oneshot};
use tower_lock::LeaseInfo;

use crate::{
    gate::Gate,
    http::{ChannelBody, channel_body},
};

/// A scenario's handler: what it does, whichever framework serves it.
#[derive(Clone, Debug)]
pub enum Handler {
    /// Answers `200` with this text.
    Text(&'static str),
    /// Answers this status with an empty body.
    Empty(StatusCode),
    /// Reports the request's `x-seq` header (or nothing) at the gate, waits there, and
    /// answers with its lease: `fence:F`, `degraded:F`, or `unlocked`.
    Gated(Gate),
    /// Answers `200` with a body the test feeds: sends `first` (if any), then hands the
    /// test the body's sender (see [`Handler::stream`]).
    Stream {
        /// A chunk the handler sends before it returns.
        first: Option<&'static str>,
        /// Where the handler hands over the sender of its body.
        senders: mpsc::UnboundedSender<mpsc::Sender<Bytes>>,
    },
    /// Answers `200` with a body of these chunks, sent by another task.
    Chunks(&'static [&'static str]),
    /// Never answers: tells the test it is inside with a receiver that completes when the
    /// server drops the handler (see [`Handler::hang`]).
    Hang(mpsc::UnboundedSender<oneshot::Receiver<()>>),
}

/// A handler's answer, before a framework turns it into its response type.
pub(crate) enum Answer {
    Text(String),
    Empty(StatusCode),
    Stream(ChannelBody),
}

/// The test's side of a [`Handler::Stream`]: each request's body sender.
#[derive(Debug)]
pub struct Streams(mpsc::UnboundedReceiver<mpsc::Sender<Bytes>>);

/// The test's side of a [`Handler::Hang`]: for each request inside, what completes when
/// the server drops its handler.
#[derive(Debug)]
pub struct Hangs(mpsc::UnboundedReceiver<oneshot::Receiver<()>>);

impl Handler {
    /// A [`Handler::Stream`] and the test's side of it.
    pub fn stream(first: Option<&'static str>) -> (Self, Streams) {
        let (senders, rx) = mpsc::unbounded_channel();
        (Self::Stream { first, senders }, Streams(rx))
    }

    /// A [`Handler::Hang`] and the test's side of it.
    pub fn hang() -> (Self, Hangs) {
        let (entered, rx) = mpsc::unbounded_channel();
        (Self::Hang(entered), Hangs(rx))
    }

    /// Handle a request with `x-seq: seq` that holds `lease` (if any).
    pub(crate) async fn respond(self, seq: String, lease: Option<LeaseInfo>) -> Answer {
        match self {
            Self::Text(text) => Answer::Text(text.to_owned()),
            Self::Empty(status) => Answer::Empty(status),
            Self::Gated(gate) => {
                let _inside = gate.pass(seq).await;
                // Give a concurrent handler every chance to overlap this one.
                for _ in 0..10 {
                    tokio::task::yield_now().await;
                }
                Answer::Text(match lease {
                    Some(info) if info.is_degraded() => format!("degraded:{}", info.fence()),
                    Some(info) => format!("fence:{}", info.fence()),
                    None => "unlocked".to_owned(),
                })
            }
            Self::Stream { first, senders } => {
                let (tx, body) = channel_body();
                if let Some(first) = first {
                    tx.send(Bytes::from_static(first.as_bytes())).await.unwrap();
                }
                senders.send(tx).unwrap();
                Answer::Stream(body)
            }
            Self::Chunks(chunks) => {
                let (tx, body) = channel_body();
                tokio::spawn(async move {
                    for chunk in chunks {
                        tx.send(Bytes::from_static(chunk.as_bytes())).await.unwrap();
                    }
                });
                Answer::Stream(body)
            }
            Self::Hang(entered) => {
                let (dropped_tx, dropped_rx) = oneshot::channel();
                let _guard = OnDrop(Some(dropped_tx));
                entered.send(dropped_rx).unwrap();
                std::future::pending().await
            }
        }
    }
}

impl Streams {
    /// The body sender of the next request to reach the handler (panics after 10 s).
    pub async fn next(&mut self) -> mpsc::Sender<Bytes> {
        tokio::time::timeout(Duration::from_secs(10), self.0.recv())
            .await
            .expect("a request reaches the streaming handler within 10 s")
            .unwrap()
    }
}

impl Hangs {
    /// What completes when the server drops the handler of the next request to reach it
    /// (panics after 10 s).
    pub async fn next(&mut self) -> oneshot::Receiver<()> {
        tokio::time::timeout(Duration::from_secs(10), self.0.recv())
            .await
            .expect("a request reaches the hanging handler within 10 s")
            .unwrap()
    }
}

/// Sends its signal when dropped: tells the test the server dropped the handler.
struct OnDrop(Option<oneshot::Sender<()>>);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send(());
        }
    }
}
