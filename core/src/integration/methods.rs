//! [`LockedMethods`]: which request methods a layer locks, and the checks of the method
//! names a builder was given.

use http::Method;

use crate::config_error::ConfigError;

/// The safe methods of RFC 9110 §9.2.1: a client asks nothing to change with them, so the
/// default leaves them unlocked (a CORS preflight `OPTIONS`, a status `GET`, a `HEAD`
/// never wait behind a write, nor meet a `423`).
const SAFE: [Method; 4] = [Method::GET, Method::HEAD, Method::OPTIONS, Method::TRACE];

/// The methods registered in RFC 9110 and RFC 5789 (`PATCH`), each in its one spelling.
const STANDARD: [Method; 9] = [
    Method::GET,
    Method::HEAD,
    Method::POST,
    Method::PUT,
    Method::DELETE,
    Method::CONNECT,
    Method::OPTIONS,
    Method::TRACE,
    Method::PATCH,
];

/// Which methods take a lock; the others pass through unlocked, with no key extracted.
#[derive(Debug, Clone)]
pub(crate) enum LockedMethods {
    /// Every method but the safe ones (the default): extension methods are locked too.
    Unsafe,
    /// Exactly these (the builder's `methods([..])`), safe ones included if named.
    Only(Box<[Method]>),
    /// Every method but the safe ones, and these too (the default with `shared_for([..])`,
    /// whose methods are locked, shared, whatever the default says of them).
    UnsafeAnd(Box<[Method]>),
}

impl LockedMethods {
    /// The methods named by `names` (`None`: the default), checked: at least one, each a
    /// method token, none a standard method in the wrong case.
    pub(crate) fn from_names(names: Option<Vec<String>>) -> Result<Self, ConfigError> {
        let Some(names) = names else {
            return Ok(Self::Unsafe);
        };
        if names.is_empty() {
            return Err(ConfigError::NoMethods);
        }
        Ok(Self::Only(parse(names)?))
    }

    /// These methods and `more` (added when not named already).
    pub(crate) fn and(self, more: &[Method]) -> Self {
        let add = |methods: Vec<Method>| {
            let mut methods = methods;
            for m in more {
                if !methods.contains(m) {
                    methods.push(m.clone());
                }
            }
            methods.into_boxed_slice()
        };
        match self {
            Self::Unsafe => Self::UnsafeAnd(add(Vec::new())),
            Self::Only(methods) => Self::Only(add(methods.into_vec())),
            Self::UnsafeAnd(methods) => Self::UnsafeAnd(add(methods.into_vec())),
        }
    }

    /// The default and `GET` and `HEAD` (the default of a layer with permits); methods
    /// named by the builder stay as named.
    pub(crate) fn with_reads_by_default(self) -> Self {
        match self {
            Self::Unsafe => Self::Unsafe.and(&[Method::GET, Method::HEAD]),
            named => named,
        }
    }

    /// Whether a request with `method` takes a lock.
    pub(crate) fn locks(&self, method: &str) -> bool {
        match self {
            Self::Unsafe => !is_safe(method),
            Self::Only(methods) => names(methods, method),
            Self::UnsafeAnd(more) => !is_safe(method) || names(more, method),
        }
    }
}

fn is_safe(method: &str) -> bool {
    SAFE.iter().any(|safe| safe.as_str() == method)
}

/// Whether `methods` holds the method spelled `method`.
pub(crate) fn names(methods: &[Method], method: &str) -> bool {
    methods.iter().any(|m| m.as_str() == method)
}

/// Method names as given to a builder, checked: each a method token, none a standard
/// method in the wrong case. `HEAD` goes with `GET`: a list that names `GET` names `HEAD`
/// too, because a `HEAD` is a `GET` without its body (RFC 9110 §9.3.2) and routers run
/// the `GET` handler for it (axum, actix-web): a read left out would run beside a writer.
pub(crate) fn parse(names: Vec<String>) -> Result<Box<[Method]>, ConfigError> {
    let mut methods = names
        .into_iter()
        .map(|name| match Method::from_bytes(name.as_bytes()) {
            // `post` parses as an extension method that no client sends for `POST`.
            Ok(method) if !is_miscased(&name) => Ok(method),
            _ => Err(ConfigError::InvalidMethod(name)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if methods.contains(&Method::GET) && !methods.contains(&Method::HEAD) {
        methods.push(Method::HEAD);
    }
    Ok(methods.into_boxed_slice())
}

/// Whether `name` is a standard method spelled in another case (`post`, `Get`).
pub(crate) fn is_miscased(name: &str) -> bool {
    STANDARD
        .iter()
        .any(|m| m.as_str() != name && m.as_str().eq_ignore_ascii_case(name))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(names: &[&str]) -> Option<Vec<String>> {
        Some(names.iter().map(|&n| n.to_owned()).collect())
    }

    #[test]
    fn the_default_locks_every_method_but_the_safe_ones() {
        let methods = LockedMethods::from_names(None).unwrap();
        for method in ["GET", "HEAD", "OPTIONS", "TRACE"] {
            assert!(!methods.locks(method), "{method}");
        }
        for method in ["POST", "PUT", "PATCH", "DELETE", "CONNECT", "PURGE"] {
            assert!(methods.locks(method), "{method}");
        }
    }

    #[test]
    fn a_list_locks_exactly_what_it_names() {
        let methods = LockedMethods::from_names(names(&["GET", "PURGE"])).unwrap();
        assert!(methods.locks("GET") && methods.locks("PURGE"));
        assert!(!methods.locks("POST") && !methods.locks("get"));
    }

    #[test]
    fn more_methods_are_added_to_the_default_or_to_a_list() {
        let more = [Method::GET];
        let default = LockedMethods::from_names(None).unwrap().and(&more);
        assert!(default.locks("GET") && default.locks("POST") && default.locks("PURGE"));
        assert!(!default.locks("HEAD") && !default.locks("OPTIONS"));
        let list = LockedMethods::from_names(names(&["PUT"]))
            .unwrap()
            .and(&more);
        assert!(list.locks("GET") && list.locks("PUT") && !list.locks("POST"));
    }

    #[test]
    fn a_list_that_names_get_names_head_too() {
        let methods = LockedMethods::from_names(names(&["GET", "PUT"])).unwrap();
        assert!(methods.locks("HEAD"));
        let methods = LockedMethods::from_names(names(&["PUT"])).unwrap();
        assert!(!methods.locks("HEAD"));
    }

    #[test]
    fn names_that_cannot_be_methods_are_refused() {
        for bad in ["", "PO ST", "post", "Get"] {
            let err = LockedMethods::from_names(names(&["PUT", bad])).unwrap_err();
            assert_eq!(err, ConfigError::InvalidMethod(bad.to_owned()));
        }
        assert_eq!(
            LockedMethods::from_names(names(&[])).unwrap_err(),
            ConfigError::NoMethods
        );
    }
}
