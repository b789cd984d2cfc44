//! [`Recorder`]: records a soak's [`History`] as it runs, from any thread or runtime of the
//! test process, on one clock (`std::time::Instant`).

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use tower_lock::Lease;

use super::record::{Acquisition, Grant, History, Mode, Outage, Revocation, Write};

/// Records a history as a soak runs. Cheap to clone; every clone writes to one history,
/// with instants measured from one origin.
#[derive(Clone, Debug)]
pub struct Recorder {
    origin: Instant,
    history: Arc<Mutex<History>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self::new()
    }
}

impl Recorder {
    /// A recorder whose origin is now.
    pub fn new() -> Self {
        Self {
            origin: Instant::now(),
            history: Arc::default(),
        }
    }

    /// Now, as an offset from the origin.
    pub fn now(&self) -> Duration {
        self.since(Instant::now())
    }

    fn since(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    /// `acquire` is about to be called: the invocation instant is now. Record the outcome
    /// on what this returns ([`Acquiring::granted`]); dropped without one, the acquisition
    /// is recorded as not granted.
    pub fn acquiring(
        &self,
        process: u32,
        task: u32,
        key: &str,
        mode: Mode,
        fifo: bool,
    ) -> Acquiring {
        let invoked = self.now();
        Acquiring {
            recorder: self.clone(),
            acquisition: Some(Acquisition {
                process,
                task,
                key: key.to_owned(),
                mode,
                fifo,
                invoked,
                completed: invoked,
                grant: None,
            }),
        }
    }

    /// A register write, with instants from [`now`](Self::now).
    pub fn write(&self, write: Write) {
        self.history.lock().unwrap().writes.push(write);
    }

    /// A force release of `key`, invoked at `invoked` (from [`now`](Self::now)) and
    /// returned now.
    pub fn revocation(&self, key: &str, invoked: Duration) {
        let completed = self.now();
        self.history.lock().unwrap().revocations.push(Revocation {
            key: key.to_owned(),
            invoked,
            completed,
        });
    }

    /// The backend lost its state from `began` (from [`now`](Self::now)) until now.
    pub fn outage(&self, began: Duration) {
        let ended = self.now();
        self.history
            .lock()
            .unwrap()
            .outages
            .push(Outage { began, ended });
    }

    /// The register of `key` ended at `value`.
    pub fn final_value(&self, key: &str, value: u64) {
        self.history
            .lock()
            .unwrap()
            .finals
            .insert(key.to_owned(), value);
    }

    /// An acquisition recorded whole, by another process (a holder process that reports
    /// its grant): its instants must already be offsets of this recorder's origin.
    pub fn record(&self, acquisition: Acquisition) {
        self.push(acquisition);
    }

    /// The history recorded so far.
    pub fn history(&self) -> History {
        self.history.lock().unwrap().clone()
    }

    fn push(&self, acquisition: Acquisition) {
        self.history.lock().unwrap().acquisitions.push(acquisition);
    }
}

/// An acquisition in flight.
#[derive(Debug)]
pub struct Acquiring {
    recorder: Recorder,
    acquisition: Option<Acquisition>,
}

impl Acquiring {
    /// `acquire` returned `lease`: the grant's instant is now. Must be called on the
    /// lease's runtime (it watches the lease's lost signal there).
    pub fn granted(mut self, lease: &Lease) -> Holding {
        let mut acquisition = self.acquisition.take().expect("recorded once");
        acquisition.completed = self.recorder.now();
        acquisition.grant = Some(Grant {
            token: lease.token().as_str().to_owned(),
            fence: lease.fence().get(),
            granted_until: self.recorder.since(lease.valid_until().into_std()),
            lost_at: None,
            released: None,
        });
        // The instant the holder is told: a task waiting on `lost()` sees it a moment
        // late, never early, which only makes the exclusion check stricter.
        let told = Arc::new(Mutex::new(None));
        let watcher = {
            let (signal, told, recorder) =
                (lease.lost_signal(), told.clone(), self.recorder.clone());
            tokio::spawn(async move {
                signal.lost().await;
                *told.lock().unwrap() = Some(recorder.now());
            })
        };
        Holding {
            recorder: self.recorder.clone(),
            acquisition: Some(acquisition),
            told,
            watcher,
        }
    }
}

impl Drop for Acquiring {
    fn drop(&mut self) {
        if let Some(mut acquisition) = self.acquisition.take() {
            acquisition.completed = self.recorder.now();
            self.recorder.push(acquisition);
        }
    }
}

/// A granted acquisition whose lease is held.
#[derive(Debug)]
pub struct Holding {
    recorder: Recorder,
    acquisition: Option<Acquisition>,
    told: Arc<Mutex<Option<Duration>>>,
    watcher: tokio::task::JoinHandle<()>,
}

impl Holding {
    /// The lease is about to be released or dropped: the hold ends now. The lease says
    /// whether, and since when, the holder knows it was lost: its validity deadline, if
    /// that passed (`is_lost()` is true from that instant on), or the instant `lost()`
    /// resolved.
    pub fn releasing(mut self, lease: &Lease) {
        let released = self.recorder.now();
        let until = self.recorder.since(lease.valid_until().into_std());
        let told = *self.told.lock().unwrap();
        let lost_at = lease
            .is_lost()
            .then(|| told.map_or(until, |t| t.min(until)).min(released));
        let mut acquisition = self.acquisition.take().expect("recorded once");
        let grant = acquisition.grant.as_mut().expect("granted");
        grant.granted_until = until;
        grant.lost_at = lost_at.or(told);
        grant.released = Some(released);
        self.recorder.push(acquisition);
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        self.watcher.abort();
        // Never told how it ended: it held to the end of the history.
        if let Some(mut acquisition) = self.acquisition.take() {
            if let Some(grant) = acquisition.grant.as_mut() {
                grant.lost_at = *self.told.lock().unwrap();
            }
            self.recorder.push(acquisition);
        }
    }
}
