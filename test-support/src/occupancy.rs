//! [`Occupancy`]: who is inside the handlers of one key at once, shared or exclusive, and
//! every moment that broke a permit layer's promises (more than N shared holders, an
//! exclusive holder beside anyone).

use std::{
    sync::{
        Arc, Mutex,
        atomic::{AtomicUsize, Ordering::SeqCst},
    },
    time::Duration,
};

use tokio::sync::watch;

/// The handlers inside one key at once. A handler calls [`visit`](Self::visit) while it
/// holds its permit; the test then checks [`assert_kept`](Self::assert_kept) and what was
/// [reached](Self::most_shared), so that a test passes only if permits both limited and
/// admitted (a layer that silently serialized everything would never reach N).
#[derive(Debug)]
pub struct Occupancy {
    /// The most shared holders allowed at once.
    limit: usize,
    shared: AtomicUsize,
    exclusive: AtomicUsize,
    /// The most shared holders seen inside at once so far.
    most_shared: watch::Sender<usize>,
    exclusive_visits: AtomicUsize,
    violations: Mutex<Vec<String>>,
}

impl Occupancy {
    /// A key whose shared holders must never be more than `limit` at once.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            shared: AtomicUsize::new(0),
            exclusive: AtomicUsize::new(0),
            most_shared: watch::channel(0).0,
            exclusive_visits: AtomicUsize::new(0),
            violations: Mutex::new(Vec::new()),
        })
    }

    /// A handler's visit, holding its permit: `exclusive` or shared. A shared visit stays
    /// until `hold_until` shared holders have been inside at once (since the occupancy was
    /// made), so that a test can insist that N run side by side: if the layer admits fewer,
    /// it gives up after 10 s, a violation. Every visit yields a few times inside, giving another holder every
    /// chance to overlap it.
    pub async fn visit(&self, exclusive: bool, hold_until: usize) {
        if exclusive {
            let writers = self.exclusive.fetch_add(1, SeqCst) + 1;
            self.exclusive_visits.fetch_add(1, SeqCst);
            self.check_alone(writers, "entering");
            yield_a_few().await;
            self.check_alone(self.exclusive.load(SeqCst), "leaving");
            self.exclusive.fetch_sub(1, SeqCst);
        } else {
            let readers = self.shared.fetch_add(1, SeqCst) + 1;
            if readers > self.limit {
                self.violation(format!("{readers} shared holders, at most {}", self.limit));
            }
            self.check_no_writer("entering");
            self.most_shared
                .send_modify(|most| *most = (*most).max(readers));
            let mut most = self.most_shared.subscribe();
            let held = most.wait_for(|most| *most >= hold_until);
            if tokio::time::timeout(Duration::from_secs(10), held)
                .await
                .is_err()
            {
                self.violation(format!("{hold_until} shared holders never inside at once"));
            }
            yield_a_few().await;
            self.check_no_writer("leaving");
            self.shared.fetch_sub(1, SeqCst);
        }
    }

    fn check_alone(&self, writers: usize, when: &str) {
        let readers = self.shared.load(SeqCst);
        if writers != 1 || readers != 0 {
            self.violation(format!(
                "an exclusive holder {when} beside {} exclusive and {readers} shared",
                writers - 1
            ));
        }
    }

    fn check_no_writer(&self, when: &str) {
        let writers = self.exclusive.load(SeqCst);
        if writers != 0 {
            self.violation(format!("a shared holder {when} beside {writers} exclusive"));
        }
    }

    fn violation(&self, what: String) {
        self.violations.lock().unwrap().push(what);
    }

    /// The most shared holders that were inside at once.
    pub fn most_shared(&self) -> usize {
        *self.most_shared.borrow()
    }

    /// Wait until `n` shared holders have been inside at once (panics after 10 s).
    pub async fn reached(&self, n: usize) {
        let mut most = self.most_shared.subscribe();
        tokio::time::timeout(Duration::from_secs(10), most.wait_for(|m| *m >= n))
            .await
            .unwrap_or_else(|_| panic!("{n} shared holders inside at once within 10 s"))
            .unwrap();
    }

    /// How many exclusive visits there were.
    pub fn exclusive_visits(&self) -> usize {
        self.exclusive_visits.load(SeqCst)
    }

    /// Panics with every violation seen, if any; and if a holder is still inside.
    pub fn assert_kept(&self) {
        let violations = self.violations.lock().unwrap();
        assert!(violations.is_empty(), "violations: {violations:?}");
        assert_eq!(self.shared.load(SeqCst), 0, "shared holders still inside");
        assert_eq!(
            self.exclusive.load(SeqCst),
            0,
            "exclusive holders still inside"
        );
    }
}

async fn yield_a_few() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}
