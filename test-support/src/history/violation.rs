//! [`Violation`]: a check that failed, with the minimal window of the history that shows it.

use std::{fmt, time::Duration};

use super::record::{Acquisition, History, Mode, Revocation, Write};

/// One failed check: which, what went wrong, and the events of the operations that break
/// it (nothing else of the history), in time order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The check that failed: `exclusion`, `fences`, `register` or `fifo`.
    pub check: &'static str,
    /// What went wrong, in one sentence.
    pub what: String,
    /// The window: one line per event, offsets from the history's origin.
    pub window: Vec<String>,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{} violated: {}", self.check, self.what)?;
        for line in &self.window {
            writeln!(f, "    {line}")?;
        }
        Ok(())
    }
}

/// The events of the operations a violation involves.
#[derive(Default)]
pub(super) struct Window<'h> {
    acquisitions: Vec<&'h Acquisition>,
    writes: Vec<&'h Write>,
    revocations: Vec<&'h Revocation>,
}

impl<'h> Window<'h> {
    pub(super) fn acquisition(mut self, a: &'h Acquisition) -> Self {
        self.acquisitions.push(a);
        self
    }

    pub(super) fn write(mut self, w: &'h Write) -> Self {
        self.writes.push(w);
        self
    }

    /// Adds the force releases of the key that fall within the window's span: they explain
    /// why a hold ended.
    fn with_revocations(mut self, history: &'h History) -> Self {
        let span = self.span();
        let keys: Vec<&str> = self.acquisitions.iter().map(|a| a.key.as_str()).collect();
        if let Some((from, to)) = span {
            self.revocations = history
                .revocations
                .iter()
                .filter(|r| keys.contains(&r.key.as_str()))
                .filter(|r| r.completed >= from && r.invoked <= to)
                .collect();
        }
        self
    }

    fn span(&self) -> Option<(Duration, Duration)> {
        let starts = self
            .acquisitions
            .iter()
            .map(|a| a.invoked)
            .chain(self.writes.iter().map(|w| w.invoked));
        let ends = self.acquisitions.iter().flat_map(|a| {
            let g = a.grant.as_ref();
            [
                Some(a.completed),
                g.and_then(|g| g.released),
                g.and_then(|g| g.lost_at),
            ]
            .into_iter()
            .flatten()
        });
        let ends = ends.chain(self.writes.iter().map(|w| w.completed));
        Some((starts.min()?, ends.max()?))
    }

    pub(super) fn violation(
        self,
        history: &'h History,
        check: &'static str,
        what: String,
    ) -> Violation {
        let this = self.with_revocations(history);
        let mut events: Vec<(Duration, String)> = Vec::new();
        for a in &this.acquisitions {
            let who = format!("p{}/t{} {} {}", a.process, a.task, a.key, mode(a));
            events.push((a.invoked, format!("{who}: acquire invoked")));
            match &a.grant {
                None => events.push((a.completed, format!("{who}: acquire gave up"))),
                Some(g) => {
                    events.push((
                        a.completed,
                        format!(
                            "{who}: granted fence={} token={} valid until {}",
                            g.fence,
                            g.token,
                            at(g.granted_until)
                        ),
                    ));
                    if let Some(lost) = g.lost_at {
                        events.push((lost, format!("{who}: told its lease was lost")));
                    }
                    match g.released {
                        Some(r) => events.push((r, format!("{who}: release invoked"))),
                        None => {
                            events.push((history.end(), format!("{who}: still held at the end")))
                        }
                    }
                }
            }
        }
        for w in &this.writes {
            let who = format!("p{}/t{} {} register", w.process, w.task, w.key);
            events.push((
                w.invoked,
                format!(
                    "{who}: write {} (read {}) fence={} invoked",
                    w.value, w.read, w.fence
                ),
            ));
            let answer = if w.accepted { "accepted" } else { "refused" };
            events.push((w.completed, format!("{who}: write {} {answer}", w.value)));
        }
        for r in &this.revocations {
            events.push((r.invoked, format!("admin {}: force release invoked", r.key)));
            events.push((
                r.completed,
                format!("admin {}: force release returned", r.key),
            ));
        }
        events.sort_by_key(|(t, _)| *t);
        Violation {
            check,
            what,
            window: events
                .into_iter()
                .map(|(t, line)| format!("{} {line}", at(t)))
                .collect(),
        }
    }
}

fn mode(a: &Acquisition) -> String {
    let mode = match a.mode {
        Mode::Exclusive => "exclusive".to_owned(),
        Mode::Shared { limit } => format!("shared(of {limit})"),
    };
    if a.fifo { format!("{mode} fifo") } else { mode }
}

/// An offset from the history's origin, as printed: seconds with microseconds.
pub(super) fn at(t: Duration) -> String {
    format!("+{}.{:06}s", t.as_secs(), t.subsec_micros())
}
