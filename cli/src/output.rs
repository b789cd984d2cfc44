//! What a command prints (text for people, one JSON document with `--json`) and the exit
//! code it ends with (see the crate docs' table).

use std::process::ExitCode;

use serde_json::{Value, json};
use tower_lock_engine::{BackendError, LockError};

/// Done (0) or nothing there (1).
pub(crate) const OK: u8 = 0;
/// The key is free, the record absent, nothing held to release.
pub(crate) const NOT_FOUND: u8 = 1;
/// Bad arguments or an invalid key.
pub(crate) const USAGE: u8 = 2;
/// The backend is unavailable or failed.
pub(crate) const BACKEND: u8 = 3;
/// A release not confirmed.
pub(crate) const NOT_CONFIRMED: u8 = 4;

/// A command's result: its text, its JSON document and its exit code.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) code: u8,
    pub(crate) text: String,
    pub(crate) json: Value,
}

impl Outcome {
    pub(crate) fn new(code: u8, text: String, json: Value) -> Self {
        Self { code, text, json }
    }

    pub(crate) fn exit(self, json: bool) -> ExitCode {
        if json {
            println!("{}", self.json);
        } else {
            print!("{}", self.text);
        }
        ExitCode::from(self.code)
    }
}

/// A command that could not run: a usage error or the backend's.
#[derive(Debug)]
pub(crate) struct Failure {
    code: u8,
    message: String,
}

impl Failure {
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: USAGE,
            message: message.into(),
        }
    }

    pub(crate) fn backend(message: impl Into<String>) -> Self {
        Self {
            code: BACKEND,
            message: message.into(),
        }
    }

    /// On stderr as text; with `--json`, also `{"error": ..., "exit": ...}` on stdout so a
    /// script parsing stdout always gets one document.
    pub(crate) fn exit(self, json: bool) -> ExitCode {
        eprintln!("tower-lock-cli: {}", self.message);
        if json {
            println!("{}", json!({"error": self.message, "exit": self.code}));
        }
        ExitCode::from(self.code)
    }
}

impl From<LockError> for Failure {
    fn from(e: LockError) -> Self {
        match e {
            LockError::InvalidKey(_) | LockError::InvalidValue(_) => Self::usage(e.to_string()),
            LockError::Unsupported(what) => {
                Self::usage(format!("this backend cannot do it ({what})"))
            }
            other => Self::backend(other.to_string()),
        }
    }
}

impl From<BackendError> for Failure {
    fn from(e: BackendError) -> Self {
        Self::backend(e.to_string())
    }
}
