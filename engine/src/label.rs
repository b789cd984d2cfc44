//! [`HolderLabel`]: who holds a lease, in words a person on call can read (a host and a
//! process, a route), stored with the lease on every backend and shown by
//! [`holders`](crate::Backend::holders). Never part of ownership: the token alone is.

use std::{fmt, sync::Arc, sync::OnceLock};

use crate::{KeyError, key::validate};

/// The longest label accepted, in bytes (a host name is at most 253, a route template
/// rarely more than a hundred): every backend stores it beside each lease.
pub const MAX_LABEL_LEN: usize = 256;

/// A holder's label: 1 to [`MAX_LABEL_LEN`] bytes of UTF-8 with no control characters
/// (the Redis backend separates it from the token with one). Cheap to clone.
///
/// ```
/// use tower_lock_engine::HolderLabel;
///
/// let label = HolderLabel::new("web-3:4242").unwrap();
/// assert_eq!(label.with_detail("POST /orders/{id}").as_str(), "web-3:4242 POST /orders/{id}");
/// assert!(HolderLabel::new("two\nlines").is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct HolderLabel(Arc<str>);

impl HolderLabel {
    /// A label: 1 to [`MAX_LABEL_LEN`] bytes, no control characters.
    pub fn new(label: impl AsRef<str>) -> Result<Self, KeyError> {
        let label = label.as_ref();
        validate(label, MAX_LABEL_LEN)?;
        Ok(Self(Arc::from(label)))
    }

    /// This process's label, `<host name>:<process id>`: what an engine uses unless told
    /// otherwise. The host name is read once, from `/proc/sys/kernel/hostname` (Linux) or
    /// the `HOSTNAME` variable, else `unknown-host`; no dependency, no system call per
    /// engine.
    pub fn process() -> Self {
        static PROCESS: OnceLock<HolderLabel> = OnceLock::new();
        PROCESS
            .get_or_init(|| {
                let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .or_else(|| std::env::var("HOSTNAME").ok())
                    .map(|h| h.trim().to_owned())
                    .filter(|h| !h.is_empty() && !h.chars().any(char::is_control))
                    .unwrap_or_else(|| "unknown-host".to_owned());
                let mut label = format!("{host}:{}", std::process::id());
                truncate(&mut label, MAX_LABEL_LEN);
                Self(Arc::from(label))
            })
            .clone()
    }

    /// This label followed by a space and `detail` (a layer's route template), cut to
    /// [`MAX_LABEL_LEN`] bytes at a character boundary; control characters in `detail` are
    /// replaced by `?`, so what a layer adds can never make the acquisition fail.
    pub fn with_detail(&self, detail: &str) -> Self {
        let mut label = String::with_capacity(self.0.len() + 1 + detail.len());
        label.push_str(&self.0);
        label.push(' ');
        label.extend(detail.chars().map(|c| if c.is_control() { '?' } else { c }));
        truncate(&mut label, MAX_LABEL_LEN);
        Self(Arc::from(label))
    }

    /// A label read back from a backend (stored by an engine, so valid), or `None` for an
    /// empty one.
    #[cfg_attr(not(any(feature = "redis", feature = "postgres")), allow(dead_code))]
    pub(crate) fn stored(label: &str) -> Option<Self> {
        (!label.is_empty()).then(|| Self(Arc::from(label)))
    }

    /// The label's text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// Cut `s` to at most `max` bytes, at a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

impl fmt::Display for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for HolderLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl AsRef<str> for HolderLabel {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_process_label_names_the_host_and_the_pid() {
        let label = HolderLabel::process();
        assert!(
            label
                .as_str()
                .ends_with(&format!(":{}", std::process::id())),
            "{label}"
        );
    }

    #[test]
    fn a_detail_is_cut_and_cleaned_never_refused() {
        let base = HolderLabel::new("h:1").unwrap();
        let long = base.with_detail(&"é".repeat(400));
        assert!(long.as_str().len() <= MAX_LABEL_LEN);
        assert_eq!(base.with_detail("a\nb").as_str(), "h:1 a?b");
        assert!(HolderLabel::new("x".repeat(MAX_LABEL_LEN + 1)).is_err());
    }
}
