//! Scratch paths in the temporary directory that are gone once the test process is.
//!
//! A fixture kept for the whole binary (a `static`, never dropped), a test that panicked
//! before its fixture's `Drop`, and marker files written by a child process would each
//! leave their files in `/tmp` after every run, and a machine that runs the suite all day
//! collects thousands of them. [`remove_at_exit`] removes a path when this process exits,
//! however it exits.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::atomic::{AtomicU32, Ordering},
};

/// A fresh directory `tower-lock-<kind>-<pid>-<n>` in the temporary directory, removed
/// when this process exits (see [`remove_at_exit`]).
pub fn dir(kind: &str) -> PathBuf {
    static MADE: AtomicU32 = AtomicU32::new(0);
    let n = MADE.fetch_add(1, Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tower-lock-{kind}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make a scratch directory");
    remove_at_exit(&dir, None);
    dir
}

/// Remove `path` (a file or a directory tree) when this process exits, however it exits
/// (a panic, an abort, `SIGKILL`): a shell waits on a pipe whose write end this process
/// holds until it exits; then, if `pid_file` is given, for up to 10 s while that file
/// exists (a server in the directory, stopped by its own guardian at the same moment,
/// removes it as it stops); then removes `path`. A server still writing in the directory
/// may recreate an entry while it is being removed, so the removal is tried up to five
/// times, 100 ms apart, until the path is gone. A path already removed costs nothing.
pub fn remove_at_exit(path: &Path, pid_file: Option<&Path>) {
    let script = r#"read _
if [ -n "$2" ]; then i=0; while [ -e "$2" ] && [ "$i" -lt 100 ]; do sleep 0.1; i=$((i+1)); done; fi
for _ in 1 2 3 4 5; do rm -rf "$1" 2>/dev/null; [ -e "$1" ] || exit 0; sleep 0.1; done"#;
    let spawned = Command::new("sh")
        .args(["-c", script, "sh"])
        .arg(path)
        .arg(pid_file.map(Path::as_os_str).unwrap_or_default())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn();
    if let Ok(mut sweeper) = spawned {
        // The write end lives as long as the process: its exit closes it.
        std::mem::forget(sweeper.stdin.take());
    }
}
