//! [`Sharing`]: how a layer with permits takes its keys (`permits(n)`, `shared_for([..])`):
//! which methods share a key, how many at once, and which take it alone.

use http::Method;

use super::{LockedMethods, methods};
use crate::{config_error::ConfigError, engine::Mode};

/// A layer's permits: its requests take a key as one of N shared holders, or alone.
#[derive(Debug)]
pub(crate) struct Sharing {
    /// Shared holders per key at once (`u32::MAX`: no limit).
    permits: u32,
    /// The methods that share a key (`None`: every locked method); the other locked
    /// methods take it alone.
    shared: Option<Box<[Method]>>,
}

impl Sharing {
    /// The permits the settings ask for (`None`: the plain lock), and the methods locked
    /// with them: those of `shared_for` are locked too, whatever `methods` says.
    pub(crate) fn from_settings(
        locked: LockedMethods,
        permits: Option<u32>,
        shared_for: Option<Vec<String>>,
    ) -> Result<(LockedMethods, Option<Self>), ConfigError> {
        if permits == Some(0) {
            return Err(ConfigError::ZeroPermits);
        }
        let shared = match shared_for {
            None => None,
            Some(names) if names.is_empty() => return Err(ConfigError::NoSharedMethods),
            Some(names) => Some(methods::parse(names)?),
        };
        Ok(match (permits, shared) {
            (None, None) => (locked, None),
            (Some(permits), None) => (
                // A limit of N at once is as much about reads (an export, a report) as
                // writes: without `methods`, `GET` and `HEAD` take a permit too (a CORS
                // preflight and `TRACE` still pass), so `permits(n)` on a `GET` endpoint
                // cannot silently limit nothing.
                locked.with_reads_by_default(),
                Some(Self {
                    permits,
                    shared: None,
                }),
            ),
            (permits, Some(shared)) => (
                locked.and(&shared),
                Some(Self {
                    permits: permits.unwrap_or(u32::MAX),
                    shared: Some(shared),
                }),
            ),
        })
    }

    /// How a request with `method` (one the layer locks) takes its key: one of its shared
    /// leases, alone (a limit of 1) for the methods that do not share.
    pub(crate) fn take(&self, method: &str) -> Mode {
        match &self.shared {
            Some(shared) if !methods::names(shared, method) => Mode::Shared { limit: 1 },
            _ => Mode::Shared {
                limit: self.permits,
            },
        }
    }

    /// Shared holders per key at once (`u32::MAX`: no limit).
    pub(crate) fn permits(&self) -> u32 {
        self.permits
    }

    /// The methods that share a key (`None`: every locked method).
    pub(crate) fn shared_methods(&self) -> Option<&[Method]> {
        self.shared.as_deref()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|&n| n.to_owned()).collect())
    }

    fn sharing(permits: Option<u32>, shared: Option<Vec<String>>) -> (LockedMethods, Sharing) {
        let locked = LockedMethods::from_names(None).unwrap();
        let (locked, sharing) = Sharing::from_settings(locked, permits, shared).unwrap();
        (locked, sharing.expect("permits"))
    }

    #[test]
    fn neither_setting_is_the_plain_lock() {
        let locked = LockedMethods::from_names(None).unwrap();
        let (_, sharing) = Sharing::from_settings(locked, None, None).unwrap();
        assert!(sharing.is_none());
    }

    #[test]
    fn permits_alone_share_every_locked_method() {
        let (locked, s) = sharing(Some(3), None);
        assert_eq!(s.take("POST"), Mode::Shared { limit: 3 });
        assert_eq!(s.take("PUT"), Mode::Shared { limit: 3 });
        // Reads are limited too (an export), never a CORS preflight.
        assert!(locked.locks("GET") && locked.locks("HEAD") && locked.locks("POST"));
        assert!(!locked.locks("OPTIONS") && !locked.locks("TRACE"));
        let (named, _) = Sharing::from_settings(
            LockedMethods::from_names(names(&["POST"])).unwrap(),
            Some(3),
            None,
        )
        .unwrap();
        assert!(
            !named.locks("GET"),
            "methods named by the builder stay as named"
        );
    }

    #[test]
    fn shared_for_alone_admits_any_number_of_readers_and_one_writer() {
        let (locked, s) = sharing(None, names(&["GET", "HEAD"]));
        assert_eq!(s.take("GET"), Mode::Shared { limit: u32::MAX });
        assert_eq!(s.take("HEAD"), Mode::Shared { limit: u32::MAX });
        assert_eq!(s.take("PUT"), Mode::Shared { limit: 1 });
        assert!(locked.locks("GET") && locked.locks("HEAD") && locked.locks("PUT"));
        assert!(!locked.locks("OPTIONS"));
    }

    #[test]
    fn head_shares_wherever_get_does() {
        let (locked, s) = sharing(None, names(&["GET"]));
        assert!(locked.locks("HEAD"));
        assert_eq!(s.take("HEAD"), Mode::Shared { limit: u32::MAX });
    }

    #[test]
    fn both_limit_the_readers() {
        let (_, s) = sharing(Some(4), names(&["GET"]));
        assert_eq!(s.take("GET"), Mode::Shared { limit: 4 });
        assert_eq!(s.take("DELETE"), Mode::Shared { limit: 1 });
    }

    #[test]
    fn zero_permits_and_bad_shared_methods_are_refused() {
        let locked = || LockedMethods::from_names(None).unwrap();
        let err = |p, s| Sharing::from_settings(locked(), p, s).unwrap_err();
        assert_eq!(err(Some(0), None), ConfigError::ZeroPermits);
        assert_eq!(err(None, names(&[])), ConfigError::NoSharedMethods);
        assert_eq!(
            err(None, names(&["get"])),
            ConfigError::InvalidMethod("get".to_owned())
        );
    }
}
