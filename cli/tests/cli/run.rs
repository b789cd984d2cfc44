//! Running the binary: its exit code, stdout (parsed when `--json`) and stderr.

use std::{io::Write, process::Stdio};

use serde_json::Value;

/// What one run of the tool gave.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) code: i32,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
}

impl Ran {
    /// Stdout as one JSON document.
    pub(crate) fn json(&self) -> Value {
        serde_json::from_str(&self.stdout).unwrap_or_else(|e| panic!("not JSON ({e}): {self:?}"))
    }
}

/// Run `tower-lock-cli` with `args`, `stdin` written to its standard input, off the
/// runtime's threads (the engines under test keep running meanwhile).
pub(crate) async fn cli(args: Vec<String>, stdin: &'static str) -> Ran {
    tokio::task::spawn_blocking(move || {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_tower-lock-cli"))
            .args(&args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run tower-lock-cli");
        // A closed stdin reads as an empty answer.
        let _ = child
            .stdin
            .take()
            .expect("piped")
            .write_all(stdin.as_bytes());
        let out = child.wait_with_output().expect("tower-lock-cli ran");
        Ran {
            code: out.status.code().expect("exited, not killed"),
            stdout: String::from_utf8(out.stdout).expect("UTF-8 stdout"),
            stderr: String::from_utf8(out.stderr).expect("UTF-8 stderr"),
        }
    })
    .await
    .expect("the run's thread")
}

/// `store` followed by `more`.
pub(crate) fn args(store: &[String], more: &[&str]) -> Vec<String> {
    store
        .iter()
        .cloned()
        .chain(more.iter().map(|s| (*s).to_owned()))
        .collect()
}
