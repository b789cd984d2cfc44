//! Whether the caller's tokio runtime has the drivers the engine's I/O needs (I/O and
//! time), found out once per runtime.
//!
//! tokio offers no way to ask: a socket or a timer made on a runtime built without
//! `enable_io` or `enable_time` panics. So the first call from each runtime makes one of
//! each inside `catch_unwind`, with this thread's panic report silenced (a panic hook that
//! passes every other panic on to the hook it replaced), and the answer is kept by runtime.
//! A panic hook the application sets later replaces that one: the probe's expected panic
//! is then reported once per runtime without a driver. Built with `panic = "abort"`,
//! nothing can be caught: every runtime is taken as complete.

use std::{
    cell::Cell,
    panic::{AssertUnwindSafe, catch_unwind},
    sync::{Mutex, Once},
    time::Duration,
};

use tokio::runtime::{Handle, Id};

/// The runtimes asked about most recently, and their answers (a process that makes
/// runtime after runtime keeps only these).
static KNOWN: Mutex<Vec<(Id, bool)>> = Mutex::new(Vec::new());
const KEPT: usize = 64;

thread_local! {
    /// This thread's last answer: a runtime's own workers find it without the lock.
    static LAST: Cell<Option<(Id, bool)>> = const { Cell::new(None) };
    /// Set while this thread probes: its panic is expected and not reported.
    static PROBING: Cell<bool> = const { Cell::new(false) };
}

/// Whether the current runtime has both drivers (`true` outside any runtime and on the
/// engine's own: nothing to add then).
pub(super) fn current_has_all() -> bool {
    let Ok(current) = Handle::try_current() else {
        return true;
    };
    let id = current.id();
    if let Some((last, has)) = LAST.get()
        && last == id
    {
        return has;
    }
    if id == super::handle().id() {
        return true;
    }
    let known = KNOWN
        .lock()
        .unwrap()
        .iter()
        .find(|(r, _)| *r == id)
        .map(|(_, has)| *has);
    let has = known.unwrap_or_else(|| {
        let has = probe();
        let mut known = KNOWN.lock().unwrap();
        if known.len() >= KEPT {
            known.remove(0);
        }
        known.push((id, has));
        has
    });
    LAST.set(Some((id, has)));
    has
}

/// Make a timer and a socket on the current runtime: `false` if either panics.
fn probe() -> bool {
    // Built with `panic = "abort"`, the probe's panic would end the process, and assuming
    // the worst would send every call of every runtime through the engine's thread: take
    // the runtime as complete (every runtime `#[tokio::main]` builds is), so a call from
    // one without a driver panics there as tokio's own calls do (a documented limit).
    if cfg!(panic = "abort") {
        return true;
    }
    if std::thread::panicking() {
        // No hook may be set now; assume the worst (the engine's runtime then serves).
        return false;
    }
    static QUIET: Once = Once::new();
    QUIET.call_once(|| {
        let reported = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !PROBING.get() {
                reported(info);
            }
        }));
    });
    PROBING.set(true);
    let made = catch_unwind(AssertUnwindSafe(|| {
        drop(tokio::time::sleep(Duration::ZERO));
        // Only the Redis backend does its I/O on the caller's runtime.
        #[cfg(feature = "redis")]
        {
            let socket = std::net::UdpSocket::bind(("127.0.0.1", 0))?;
            socket.set_nonblocking(true)?;
            drop(tokio::net::UdpSocket::from_std(socket)?);
        }
        Ok::<(), std::io::Error>(())
    }));
    PROBING.set(false);
    matches!(made, Ok(Ok(())))
}
