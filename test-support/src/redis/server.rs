//! A `redis-server` of the test's own, on a free loopback port.
//!
//! ```ignore
//! let server = RedisServer::start();
//! let backend = RedisBackend::connect(server.url()).await?;
//! server.cli(["CLIENT", "PAUSE", "500", "ALL"]);
//! server.freeze(Duration::from_millis(800)).join().unwrap(); // DEBUG SLEEP
//! server.kill();    // SIGKILL: a crash, not a shutdown
//! server.restart(); // same port, empty data set
//! let stepped = RedisServer::start_with_clock();
//! stepped.set_clock(-5); // the server's clock 5 s behind the real one
//! ```
//!
//! The server runs under a tiny `sh` guardian (`guardian.rs`) that reads our end of a
//! pipe: when the test process exits for any reason (even a panic or an abort, or a shared
//! server in a `static` that is never dropped), the pipe closes and the guardian kills the
//! server. No stray servers survive a test run. Persistence is off, so nothing is written
//! to disk.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::PathBuf,
    process::{Command, Stdio},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use super::guardian::{Guardian, free_port, wait_for_ping};

/// A redis-server process owned by the test.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    /// A config file to start from (Sentinel needs one it can rewrite), then extra
    /// `redis-server` arguments; kept for a restart.
    config: Option<String>,
    args: Vec<String>,
    /// The file the server's clock offset is read from (see [`RedisServer::start_with_clock`]).
    clock: Option<PathBuf>,
    running: Mutex<Option<Guardian>>,
}

impl RedisServer {
    /// Start a server on a free port and wait until it answers PING.
    pub fn start() -> Self {
        Self::start_with::<_, &str>([])
    }

    /// Like [`RedisServer::start`], with extra `redis-server` arguments (for example
    /// `["--replicaof", "127.0.0.1", "6379"]`); they are used again by a restart.
    pub fn start_with<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        Self::start_from(None, args.into_iter().map(Into::into).collect(), None)
    }

    /// A server whose clock the test steps with [`RedisServer::set_clock`]: `TIME`, the
    /// scripts' clock and key expiry all follow it (libfaketime, package `faketime`).
    pub fn start_with_clock() -> Self {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let file =
            std::env::temp_dir().join(format!("tower-lock-clock-{}-{n}", std::process::id()));
        std::fs::write(&file, "+0").expect("write the clock offset file");
        // A shared server is never dropped, and so never removes it.
        crate::scratch::remove_at_exit(&file, None);
        let server = Self::start_from(None, Vec::new(), Some(file));
        server.set_clock(0);
        server
    }

    /// Step the clock of a [`RedisServer::start_with_clock`] server to `offset_secs` from
    /// the real time (negative: behind it), at once, and check that `TIME` follows.
    pub fn set_clock(&self, offset_secs: i64) {
        let file = self
            .clock
            .as_ref()
            .expect("a server started with start_with_clock");
        std::fs::write(file, format!("{offset_secs:+}s")).expect("write the clock offset");
        let real = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let time = self.cli(["TIME"]);
        let server: i64 = time
            .lines()
            .next()
            .and_then(|l| l.parse().ok())
            .expect("TIME");
        let expected = i64::try_from(real).unwrap() + offset_secs;
        assert!(
            (server - expected).abs() <= 1,
            "the server's clock did not follow the step to {offset_secs:+} s: {server} vs {expected}"
        );
    }

    /// A Sentinel (`redis-server <config> --sentinel`) on a free port; `config` is written
    /// to a file of its own first (Sentinel rewrites it as it learns).
    pub fn start_sentinel(config: &str, path: &std::path::Path) -> Self {
        std::fs::write(path, config).expect("write the sentinel config");
        Self::start_from(
            Some(path.to_string_lossy().into_owned()),
            vec!["--sentinel".to_owned()],
            None,
        )
    }

    fn start_from(config: Option<String>, args: Vec<String>, clock: Option<PathBuf>) -> Self {
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            match Guardian::spawn(port, config.as_deref(), &args, clock.as_ref()) {
                Ok(g) => {
                    return Self {
                        port,
                        config,
                        args,
                        clock,
                        running: Mutex::new(Some(g)),
                    };
                }
                // Someone took the port between our probe and the server's bind: try again.
                Err(e) => last = e,
            }
        }
        panic!("could not start redis-server: {last}");
    }

    /// One server per test binary, started on first use and killed when the process exits.
    /// Tests sharing it keep apart by key prefix; never kill, pause or restart it.
    pub fn shared() -> &'static Arc<Self> {
        static SHARED: OnceLock<Arc<RedisServer>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(Self::start()))
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kill the server with SIGKILL (a crash) and wait until its port refuses connections.
    pub fn kill(&self) {
        if let Some(mut g) = self.running.lock().unwrap().take() {
            g.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "redis-server did not die");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Suspend the server's process (SIGSTOP): it neither answers nor gossips, its
    /// connections stay open and what clients send meanwhile waits in the socket buffers,
    /// to be executed on [`RedisServer::resume`] (a process paused by the OS, a VM
    /// migration, a long GC-like stall).
    pub fn suspend(&self) {
        self.signal("-STOP");
    }

    /// Continue a [`RedisServer::suspend`]ed server (SIGCONT).
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, signal: &str) {
        let running = self.running.lock().unwrap();
        let pid = running.as_ref().expect("the server runs").pid;
        let status = Command::new("kill")
            .args([signal, &pid.to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill {signal} {pid} failed");
    }

    /// Start the server again on the same port (empty data set: persistence is off).
    pub fn restart(&self) {
        self.kill();
        let g = Guardian::spawn(
            self.port,
            self.config.as_deref(),
            &self.args,
            self.clock.as_ref(),
        )
        .expect("restart redis-server on the same port");
        *self.running.lock().unwrap() = Some(g);
    }

    /// Run `redis-cli` against this server and return its output (trimmed). Panics if the
    /// command fails to run; Redis errors come back as text.
    pub fn cli<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli");
        assert!(out.status.success(), "redis-cli failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Run several commands on one `redis-cli` connection, in order, and return the
    /// replies (one line each, trimmed): for commands that depend on their connection,
    /// like `WAIT` behind a write. Arguments must not contain blanks or quotes.
    pub fn cli_pipe(&self, commands: &[&[&str]]) -> String {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("run redis-cli");
        let mut input = String::new();
        for command in commands {
            input.push_str(&command.join(" "));
            input.push('\n');
        }
        child
            .stdin
            .take()
            .expect("piped stdin")
            .write_all(input.as_bytes())
            .expect("write to redis-cli");
        let out = child.wait_with_output().expect("run redis-cli");
        assert!(out.status.success(), "redis-cli failed: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Like [`RedisServer::cli`], but `None` when `redis-cli` fails (the server is down).
    pub fn try_cli<I, S>(&self, args: I) -> Option<String>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<std::ffi::OsStr>,
    {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stderr(Stdio::null())
            .output()
            .ok()?;
        let text = String::from_utf8_lossy(&out.stdout).trim().to_owned();
        (out.status.success() && !text.starts_with("Could not connect")).then_some(text)
    }

    /// Every key matching `pattern` (SCAN, not KEYS).
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        let out = self.cli(["--scan", "--pattern", pattern]);
        out.lines()
            .filter(|l| !l.is_empty())
            .map(str::to_owned)
            .collect()
    }

    /// Make the whole server stop processing for `d` (`DEBUG SLEEP`): commands already on
    /// the wire are executed only afterwards, so clients time out although their commands
    /// land. Returns once the server is seen frozen; join the handle to wait for the thaw.
    pub fn freeze(&self, d: Duration) -> std::thread::JoinHandle<()> {
        let port = self.port;
        let secs = format!("{:.3}", d.as_secs_f64());
        let sleeper = std::thread::spawn(move || {
            let status = Command::new("redis-cli")
                .args([
                    "-h",
                    "127.0.0.1",
                    "-p",
                    &port.to_string(),
                    "DEBUG",
                    "SLEEP",
                    &secs,
                ])
                .stdout(Stdio::null())
                .status()
                .expect("run redis-cli");
            assert!(status.success());
        });
        // Frozen means: a PING goes unanswered for a while.
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
            s.write_all(b"PING\r\n").unwrap();
            let mut buf = [0u8; 16];
            if s.read(&mut buf).is_err() {
                return sleeper;
            }
            assert!(Instant::now() < deadline, "the server never froze");
        }
    }

    /// Make the server refuse every other client with `-BUSY` for about `d`: a read-only
    /// script busy-loops on `TIME` (past the `busy-reply-threshold`, set to 100 ms here, the
    /// server answers `-BUSY` instead of queueing). Unlike [`freeze`](Self::freeze), the
    /// server answers at once, with a refusal. Returns once a PING is refused (so `d` must
    /// be well over 100 ms); join the handle to wait for the end (`SCRIPT KILL` ends it
    /// early).
    pub fn busy(&self, d: Duration) -> std::thread::JoinHandle<()> {
        self.cli(["CONFIG", "SET", "busy-reply-threshold", "100"]);
        let port = self.port;
        let micros = d.as_micros().to_string();
        let script = "local t = redis.call('TIME') \
            local stop = t[1] * 1000000 + t[2] + tonumber(ARGV[1]) \
            repeat t = redis.call('TIME') until t[1] * 1000000 + t[2] >= stop \
            return 1";
        let looper = std::thread::spawn(move || {
            let out = Command::new("redis-cli")
                .args(["-h", "127.0.0.1", "-p", &port.to_string()])
                .args(["EVAL", script, "0", &micros])
                .stderr(Stdio::null())
                .output()
                .expect("run redis-cli");
            // Killed (SCRIPT KILL) is an end too; anything else is a broken fixture.
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.trim() == "1" || text.contains("killed"), "{text}");
        });
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect");
            s.write_all(b"PING\r\n").unwrap();
            let mut buf = [0u8; 64];
            let n = s.read(&mut buf).unwrap_or(0);
            if buf[..n].starts_with(b"-BUSY") {
                return looper;
            }
            assert!(Instant::now() < deadline, "the server never answered BUSY");
        }
    }

    /// Block until the server answers PING (for example after `CLIENT PAUSE`).
    pub fn wait_ready(&self) {
        wait_for_ping(self.port, Duration::from_secs(10)).expect("redis-server answers PING");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        if let Some(mut g) = self.running.get_mut().unwrap().take() {
            g.kill();
        }
        if let Some(file) = &self.clock {
            let _ = std::fs::remove_file(file);
        }
    }
}
