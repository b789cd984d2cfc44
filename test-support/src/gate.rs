//! A gate handlers wait at until the test lets them through.

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{mpsc, watch};

/// A gate handlers wait at until the test opens it, telling the test when each arrives
/// (with a label, for example the request's sequence number) and counting how many are
/// inside their handler at once.
///
/// ```ignore
/// let (gate, mut control) = gate();
/// // in the handler: let _inside = gate.pass(label).await; ... answer
/// let who = control.arrived().await; // a handler is inside, and waits
/// control.let_one();                 // let the earliest waiting handler through
/// control.open();                    // let every waiting (and later) handler through
/// control.close();                   // handlers arriving from now on wait again
/// assert_eq!(control.most_inside(), 1);
/// ```
#[derive(Clone, Debug)]
pub struct Gate {
    shared: Arc<Shared>,
    state: watch::Receiver<State>,
    arrived: mpsc::UnboundedSender<String>,
}

/// The test's side of a [`Gate`].
#[derive(Debug)]
pub struct GateControl {
    shared: Arc<Shared>,
    state: watch::Sender<State>,
    arrived: mpsc::UnboundedReceiver<String>,
}

#[derive(Debug, Default)]
struct Shared {
    /// Arrivals so far: the next arrival's ticket.
    tickets: AtomicUsize,
    inside: AtomicUsize,
    most_inside: AtomicUsize,
}

#[derive(Clone, Copy, Debug, Default)]
struct State {
    open: bool,
    /// Tickets below this pass even while the gate is closed.
    admitted: usize,
}

/// A handler between its arrival at the gate and its end (drop it when the handler
/// answers).
#[derive(Debug)]
pub struct Inside(Arc<Shared>);

impl Drop for Inside {
    fn drop(&mut self) {
        self.0.inside.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A closed gate and its control.
pub fn gate() -> (Gate, GateControl) {
    let shared = Arc::new(Shared::default());
    let (state_tx, state_rx) = watch::channel(State::default());
    let (arrived_tx, arrived_rx) = mpsc::unbounded_channel();
    (
        Gate {
            shared: shared.clone(),
            state: state_rx,
            arrived: arrived_tx,
        },
        GateControl {
            shared,
            state: state_tx,
            arrived: arrived_rx,
        },
    )
}

impl Gate {
    /// Count this handler inside, report arrival as `who`, then wait until the gate lets
    /// it through.
    pub async fn pass(&self, who: String) -> Inside {
        let now = self.shared.inside.fetch_add(1, Ordering::SeqCst) + 1;
        self.shared.most_inside.fetch_max(now, Ordering::SeqCst);
        let inside = Inside(self.shared.clone());
        let ticket = self.shared.tickets.fetch_add(1, Ordering::SeqCst);
        let _ = self.arrived.send(who);
        let mut state = self.state.clone();
        state
            .wait_for(|s| s.open || ticket < s.admitted)
            .await
            .unwrap();
        inside
    }
}

impl GateControl {
    /// The label of the next handler to arrive (panics after 10 s).
    pub async fn arrived(&mut self) -> String {
        tokio::time::timeout(Duration::from_secs(10), self.arrived.recv())
            .await
            .expect("a handler arrives within 10 s")
            .unwrap()
    }

    /// The label of a handler that has already arrived, if any (does not wait).
    pub fn try_arrived(&mut self) -> Option<String> {
        self.arrived.try_recv().ok()
    }

    /// Let the earliest handler still waiting (or the next to arrive) through.
    pub fn let_one(&self) {
        self.state.send_modify(|s| s.admitted += 1);
    }

    /// Let waiting and later handlers through.
    pub fn open(&self) {
        self.state.send_modify(|s| s.open = true);
    }

    /// Make handlers arriving from now on wait again.
    pub fn close(&self) {
        let arrived = self.shared.tickets.load(Ordering::SeqCst);
        self.state.send_modify(|s| {
            s.open = false;
            s.admitted = s.admitted.max(arrived);
        });
    }

    /// How many handlers are inside (waiting at the gate or past it) now.
    pub fn inside(&self) -> usize {
        self.shared.inside.load(Ordering::SeqCst)
    }

    /// The most handlers that were ever inside at once.
    pub fn most_inside(&self) -> usize {
        self.shared.most_inside.load(Ordering::SeqCst)
    }
}
