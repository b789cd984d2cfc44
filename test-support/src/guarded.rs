//! What the fixtures' guardian shells share: each starts its server in the background,
//! prints the server's pid on its first line, then waits on our end of its stdin (see
//! `redis/guardian.rs` and `postgres/guardian.rs`).

use std::{
    io::{BufRead, BufReader},
    process::Child,
};

/// The pid the guardian `shell` printed on its first line (its stdout piped).
pub(crate) fn pid(shell: &mut Child) -> Result<u32, String> {
    let mut line = String::new();
    BufReader::new(shell.stdout.take().expect("piped stdout"))
        .read_line(&mut line)
        .map_err(|e| e.to_string())?;
    line.trim()
        .parse()
        .map_err(|_| format!("guardian printed {line:?}"))
}
