//! A process run as the `postgres` user under a guardian shell: the shell sends the
//! process its stop signal when our end of the shell's stdin closes, so a test that dies
//! leaves no server behind.

use std::{
    path::Path,
    process::{Child, ChildStdin, Command, Stdio},
};

/// A process run as the `postgres` user under a guardian shell.
#[derive(Debug)]
pub(super) struct Guardian {
    shell: Child,
    lifeline: Option<ChildStdin>,
    pub(super) pid: u32,
    /// The signal that stops it on a kill or a drop.
    pub(super) stop: &'static str,
}

impl Guardian {
    /// Run `program args` as the `postgres` user under a guardian shell that sends `stop`
    /// to it when our end of its stdin closes; its standard error is appended to `log` (a
    /// file the `postgres` user may write), or dropped.
    pub(super) fn spawn(
        program: &Path,
        args: &[String],
        stop: &'static str,
        log: Option<&Path>,
    ) -> Result<Self, String> {
        let script = format!(
            r#"log=$1; shift; "$@" >/dev/null 2>>"$log" & echo $!; read _; kill {stop} $! 2>/dev/null; wait $!"#
        );
        let mut shell = Command::new("runuser")
            .args(["-u", "postgres", "--", "sh", "-c", &script, "sh"])
            .arg(log.unwrap_or(Path::new("/dev/null")))
            .arg(program)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn {} (is it installed?): {e}", program.display()))?;
        let pid = crate::guarded::pid(&mut shell)?;
        Ok(Self {
            lifeline: shell.stdin.take(),
            shell,
            pid,
            stop,
        })
    }

    pub(super) fn kill(&mut self) {
        let _ = Command::new("kill")
            .args([self.stop, &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        // Closing the lifeline ends the guardian's `read`; it then waits for the process.
        drop(self.lifeline.take());
        let _ = self.shell.wait();
    }
}
