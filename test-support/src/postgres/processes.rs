//! The server's processes as `/proc` shows them, and signals to them: what the fixtures
//! use to crash, freeze and restart a cluster the way a machine does.

use std::process::{Command, Stdio};

/// Whether process `pid` has ended (gone, or a zombie not yet reaped).
pub(super) fn exited(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |stat| {
        stat.rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with('Z'))
    })
}

/// Send `sig` (`-STOP`, `-CONT`) to `pids`, each of them a process of ours; one already
/// gone is no failure.
pub(super) fn signal(sig: &str, pids: &[u32]) {
    if pids.is_empty() {
        return;
    }
    let _ = Command::new("kill")
        .arg(sig)
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status();
}

/// The processes whose parent is `pid`, from `/proc/<pid>/stat` (its fourth field; the
/// second, the command in parentheses, may hold spaces, so fields count from the last `)`).
pub(super) fn children_of(pid: u32) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|child| {
            std::fs::read_to_string(format!("/proc/{child}/stat")).is_ok_and(|stat| {
                stat.rsplit_once(')')
                    .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                    .and_then(|ppid| ppid.parse::<u32>().ok())
                    == Some(pid)
            })
        })
        .collect()
}
