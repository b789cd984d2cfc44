//! The process a [`RedisServer`](super::RedisServer) runs in: `redis-server` under a tiny
//! `sh` guardian that kills it when the test process's end of a pipe closes (see the
//! server's module docs), started on libfaketime for a server whose clock a test steps;
//! and the free port and the `PING` that tell when it is up.

use std::{
    io::{Read, Write},
    net::{Ipv4Addr, SocketAddrV4, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, ChildStdin, Command, Stdio},
    time::{Duration, Instant},
};

#[derive(Debug)]
pub(super) struct Guardian {
    shell: Child,
    /// Closing it (drop) makes the guardian kill the server.
    lifeline: Option<ChildStdin>,
    pub(super) pid: u32,
}

/// The environment that runs `redis-server` on libfaketime, its offset read from `file`
/// at every clock reading.
///
/// Debian's `redis-server` allocates with the system jemalloc, whose first allocation (in
/// a library constructor, before libfaketime's own) reads the clock: libfaketime then
/// resolves the real clock functions, which allocates, and the process deadlocks. glibc's
/// `libc_malloc_debug`, preloaded first, serves `malloc` instead (jemalloc is then only
/// reached by Redis's statistics), which breaks that cycle.
fn faketime_env(file: &std::path::Path) -> Vec<(String, String)> {
    let find = |name: &str| {
        let dirs = std::fs::read_dir("/usr/lib")
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.to_string_lossy().ends_with("-linux-gnu"));
        dirs.flat_map(|d| [d.join(name), d.join("faketime").join(name)])
            .find(|p| p.exists())
            .unwrap_or_else(|| panic!("{name} not found (install the faketime package)"))
            .to_string_lossy()
            .into_owned()
    };
    vec![
        (
            "LD_PRELOAD".to_owned(),
            format!(
                "{} {}",
                find("libc_malloc_debug.so.0"),
                find("libfaketime.so.1")
            ),
        ),
        (
            "FAKETIME_TIMESTAMP_FILE".to_owned(),
            file.to_string_lossy().into_owned(),
        ),
        ("FAKETIME_NO_CACHE".to_owned(), "1".to_owned()),
        // Redis's own timers and the event loop keep the real monotonic clock.
        ("DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
        ("FAKETIME_DONT_FAKE_MONOTONIC".to_owned(), "1".to_owned()),
    ]
}

impl Guardian {
    pub(super) fn spawn(
        port: u16,
        config: Option<&str>,
        extra: &[String],
        clock: Option<&PathBuf>,
    ) -> Result<Self, String> {
        let script = r#"redis-server "$@" >/dev/null 2>&1 & echo $!; read _; kill -9 $! 2>/dev/null; wait $!"#;
        let mut shell = Command::new("sh")
            .args(["-c", script, "sh"])
            // A config file, if any, must come first.
            .args(config)
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            // DEBUG SLEEP (see `freeze`) from loopback clients; Redis 7 refuses it otherwise.
            .args(["--enable-debug-command", "local"])
            .args(extra)
            .envs(clock.map(|f| faketime_env(f)).unwrap_or_default())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("spawn redis-server (is it installed?): {e}"))?;
        let pid = crate::guarded::pid(&mut shell)?;
        let lifeline = shell.stdin.take().expect("piped stdin");
        let mut g = Self {
            shell,
            lifeline: Some(lifeline),
            pid,
        };
        match wait_for_ping(port, Duration::from_secs(10)) {
            Ok(()) => Ok(g),
            Err(e) => {
                g.kill();
                Err(e)
            }
        }
    }

    pub(super) fn kill(&mut self) {
        let _ = Command::new("kill")
            .args(["-9", &self.pid.to_string()])
            .stderr(Stdio::null())
            .status();
        // Closing the lifeline ends the guardian's `read`; then reap the guardian.
        drop(self.lifeline.take());
        let _ = self.shell.wait();
    }
}

pub(crate) fn free_port() -> u16 {
    TcpListener::bind(SocketAddrV4::new(Ipv4Addr::LOCALHOST, 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free loopback port")
}

/// PING over a raw socket until the server answers `+PONG` (no client library needed).
pub(super) fn wait_for_ping(port: u16, limit: Duration) -> Result<(), String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) {
            let _ = s.set_read_timeout(Some(limit));
            let mut buf = [0u8; 64];
            if s.write_all(b"PING\r\n").is_ok()
                && let Ok(n) = s.read(&mut buf)
                && buf[..n].starts_with(b"+PONG")
            {
                return Ok(());
            }
        }
        if Instant::now() >= deadline {
            return Err(format!("redis-server on port {port} never answered PING"));
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
