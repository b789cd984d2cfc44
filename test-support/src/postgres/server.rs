//! A throwaway Postgres cluster of the test's own, on a free loopback port.
//!
//! ```ignore
//! let server = PostgresServer::start(); // initdb + postgres, as the `postgres` user
//! let url = server.url();               // postgres://tower_lock@127.0.0.1:<port>/tower_lock
//! server.kill();                        // immediate shutdown (SIGQUIT): a crash
//! server.crash();                       // kill -9 of every server process
//! server.restart();                     // same port, same data (recovered)
//! server.restart_clean();               // fast shutdown (SIGINT), then the same
//! server.pause();                       // every process SIGSTOPped: frozen, sockets open
//! server.resume();                      // SIGCONT, in the reverse order
//! ```
//!
//! Postgres refuses to run as root, so the cluster is made and run as the `postgres` system
//! user Debian's package creates, in a temporary directory that user owns (data directory
//! and a private socket directory). Flushing to disk is off (`fsync`, `full_page_writes`):
//! a crash of the server process still loses nothing (every commit's WAL is written to the
//! OS, which keeps it), only a crash of the machine would. Authentication is `trust`, on loopback only.
//! The server runs under a `sh` guardian that reads our end of a pipe, as the Redis fixture
//! does: when the test process exits for any reason the guardian stops the server.

use std::{
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::{Arc, Mutex, OnceLock},
    time::{Duration, Instant},
};

use super::{
    guardian::Guardian,
    processes::{children_of, exited, signal},
};

/// The role and database made for the tests.
pub const TEST_USER: &str = "tower_lock";

/// A Postgres cluster owned by the test.
#[derive(Debug)]
pub struct PostgresServer {
    port: u16,
    dir: PathBuf,
    bin: PathBuf,
    running: Mutex<Option<Guardian>>,
    /// The processes [`PostgresServer::pause`] stopped, postmaster first.
    paused: Mutex<Vec<u32>>,
}

/// Where Debian keeps the newest installed Postgres's programs.
fn bin_dir() -> PathBuf {
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .expect("Postgres is not installed (Debian's package `postgresql`)")
        .flatten()
        .map(|e| e.path().join("bin"))
        .filter(|p| p.join("postgres").exists())
        .collect();
    versions.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    versions
        .pop()
        .expect("no /usr/lib/postgresql/<version>/bin/postgres")
}

/// Run `program args` as the `postgres` user; panics if it fails.
pub(super) fn as_postgres(program: &Path, args: &[&str]) {
    let out = Command::new("runuser")
        .args(["-u", "postgres", "--"])
        .arg(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("run runuser");
    assert!(
        out.status.success(),
        "{} failed: {}",
        program.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A fresh directory owned by the `postgres` user, private to it.
pub(super) fn postgres_dir(name: &str) -> PathBuf {
    static MADE: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("tower-lock-{name}-{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("make a temporary directory");
    let status = Command::new("chown")
        .args(["-R", "postgres:postgres"])
        .arg(&dir)
        .status()
        .expect("run chown");
    assert!(status.success(), "chown to the postgres user failed");
    let status = Command::new("chmod")
        .arg("700")
        .arg(&dir)
        .status()
        .expect("run chmod");
    assert!(status.success());
    // Once its server (stopped by its guardian at the same moment) has removed its pid file.
    crate::scratch::remove_at_exit(&dir, Some(&dir.join("data").join("postmaster.pid")));
    dir
}

impl PostgresServer {
    /// Make a cluster (`initdb`), start it on a free port, and make the test role and
    /// database ([`TEST_USER`]).
    pub fn start() -> Self {
        let bin = bin_dir();
        let dir = postgres_dir("pg");
        let data = dir.join("data");
        as_postgres(
            &bin.join("initdb"),
            &[
                "-D",
                data.to_str().expect("a UTF-8 temporary path"),
                "-U",
                "postgres",
                "-A",
                "trust",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
        );
        std::fs::create_dir_all(dir.join("socket")).expect("make the socket directory");
        let status = Command::new("chown")
            .args(["postgres:postgres"])
            .arg(dir.join("socket"))
            .status()
            .expect("run chown");
        assert!(status.success());
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let server = Self {
                port,
                dir: dir.clone(),
                bin: bin.clone(),
                running: Mutex::new(None),
                paused: Mutex::new(Vec::new()),
            };
            match server.spawn() {
                Ok(g) => {
                    *server.running.lock().unwrap() = Some(g);
                    server.psql_in("postgres", &format!("CREATE ROLE {TEST_USER} LOGIN"));
                    server.psql_in(
                        "postgres",
                        &format!("CREATE DATABASE {TEST_USER} OWNER {TEST_USER}"),
                    );
                    return server;
                }
                Err(e) => last = e,
            }
        }
        panic!("could not start postgres: {last}");
    }

    /// One cluster per test binary, started on first use and stopped when the process
    /// exits. Tests sharing it keep apart by schema; never kill or restart it.
    pub fn shared() -> &'static Arc<Self> {
        static SHARED: OnceLock<Arc<PostgresServer>> = OnceLock::new();
        SHARED.get_or_init(|| Arc::new(Self::start()))
    }

    fn spawn(&self) -> Result<Guardian, String> {
        let data = self.dir.join("data");
        let socket = self.dir.join("socket");
        let args = [
            "-D".to_owned(),
            data.to_string_lossy().into_owned(),
            "-p".to_owned(),
            self.port.to_string(),
            "-k".to_owned(),
            socket.to_string_lossy().into_owned(),
            "-c".to_owned(),
            "listen_addresses=127.0.0.1".to_owned(),
            "-c".to_owned(),
            "fsync=off".to_owned(),
            "-c".to_owned(),
            "full_page_writes=off".to_owned(),
            "-c".to_owned(),
            "max_connections=300".to_owned(),
            "-c".to_owned(),
            "unix_socket_permissions=0700".to_owned(),
        ];
        // In the socket directory, which the `postgres` user owns: why a start failed.
        let log = socket.join("server.log");
        let g = Guardian::spawn(&self.bin.join("postgres"), &args, "-QUIT", Some(&log))?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let ready = Command::new(self.bin.join("pg_isready"))
                .args(["-h", "127.0.0.1", "-p", &self.port.to_string(), "-q"])
                .status()
                .is_ok_and(|s| s.success());
            if ready {
                return Ok(g);
            }
            // A postmaster that refused to start (the data directory's lock or the shared
            // memory still held a moment by the last processes of the one before) has
            // exited: said at once, so that `restart` tries again, rather than after the
            // whole deadline (which left it no time to).
            let failed = if exited(g.pid) {
                "exited while starting"
            } else if Instant::now() >= deadline {
                "never became ready"
            } else {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            let mut g = g;
            g.kill();
            return Err(format!(
                "postgres on port {} {failed}: {}",
                self.port,
                last_lines(&log)
            ));
        }
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://tower_lock@127.0.0.1:<port>/tower_lock`.
    pub fn url(&self) -> String {
        format!("postgres://{TEST_USER}@127.0.0.1:{}/{TEST_USER}", self.port)
    }

    /// Run SQL in the test database as the superuser with `psql` and return its unaligned
    /// output (trimmed).
    pub fn psql(&self, sql: &str) -> String {
        self.psql_in(TEST_USER, sql)
    }

    /// A database `name` of its own on this cluster, owned by [`TEST_USER`], with
    /// `settings` (`("idle_session_timeout", "1s")`) as its defaults (`ALTER DATABASE … SET`:
    /// every session opened there afterwards starts with them): one cluster serves several
    /// server configurations. Its URL (as [`TEST_USER`]).
    pub fn database(&self, name: &str, settings: &[(&str, &str)]) -> String {
        self.psql_in(
            "postgres",
            &format!("CREATE DATABASE \"{name}\" OWNER {TEST_USER}"),
        );
        for (setting, value) in settings {
            self.psql_in(
                "postgres",
                &format!("ALTER DATABASE \"{name}\" SET {setting} = '{value}'"),
            );
        }
        format!("postgres://{TEST_USER}@127.0.0.1:{}/{name}", self.port)
    }

    /// Run SQL in database `database` as the superuser with `psql` and return its unaligned
    /// output (trimmed).
    pub fn psql_in(&self, database: &str, sql: &str) -> String {
        let out = Command::new("psql")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(["-U", "postgres", "-d", database, "-X", "-q", "-A", "-t"])
            .args(["-v", "ON_ERROR_STOP=1", "-c", sql])
            .stdin(Stdio::null())
            .output()
            .expect("run psql");
        assert!(
            out.status.success(),
            "psql failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_owned()
    }

    /// Stop the server the way a crash does (an immediate shutdown, SIGQUIT: no checkpoint,
    /// every connection cut) and wait until its port refuses connections.
    pub fn kill(&self) {
        // A stopped process would take the shutdown signal only once continued.
        self.resume();
        if let Some(mut g) = self.running.lock().unwrap().take() {
            g.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "postgres did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Crash the server the way `kill -9` does: SIGKILL the postmaster and every process it
    /// started, at once (no shutdown of any kind: WAL still in the server's shared memory,
    /// such as an asynchronous commit's not yet written, is lost), and wait until its port
    /// refuses connections. [`restart`](Self::restart) then recovers from the data directory.
    pub fn crash(&self) {
        self.resume();
        if let Some(mut g) = self.running.lock().unwrap().take() {
            // Stopped first, so that it forks no backend between the listing of its children
            // and their kill: a backend left alive keeps the shared memory, and the next
            // postmaster refuses to start beside it.
            signal("-STOP", &[g.pid]);
            let mut pids = vec![g.pid];
            pids.extend(children_of(g.pid));
            signal("-KILL", &pids);
            // (Its shutdown signal then finds nobody; the guardian ends.)
            g.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "postgres did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// Restart the server the way an operator does (`pg_ctl restart -m fast`: SIGINT, every
    /// session ended with an error, a checkpoint, then a start on the same port and data).
    pub fn restart_clean(&self) {
        self.resume();
        if let Some(mut g) = self.running.lock().unwrap().take() {
            signal("-INT", &[g.pid]);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !exited(g.pid) {
                assert!(Instant::now() < deadline, "postgres did not shut down");
                std::thread::sleep(Duration::from_millis(5));
            }
            // (Its immediate-shutdown signal then finds nobody; the guardian ends.)
            g.kill();
        }
        self.restart();
    }

    /// Freeze the server the way a stalled machine does: SIGSTOP the postmaster (so that it
    /// forks nothing more), then every process it started (backends, background workers).
    /// Connections stay open and nothing answers on them, nor on a new one, until
    /// [`resume`](Self::resume). A kill, a restart or a drop resumes first.
    pub fn pause(&self) {
        let mut paused = self.paused.lock().unwrap();
        let Some(pid) = self.running.lock().unwrap().as_ref().map(|g| g.pid) else {
            return;
        };
        signal("-STOP", &[pid]);
        paused.push(pid);
        let children = children_of(pid);
        signal("-STOP", &children);
        paused.extend(children);
    }

    /// Let every process [`pause`](Self::pause) stopped run again, children first.
    pub fn resume(&self) {
        let mut paused = std::mem::take(&mut *self.paused.lock().unwrap());
        paused.reverse();
        signal("-CONT", &paused);
    }

    /// Start the server again on the same port, on the same data (it recovers first).
    pub fn restart(&self) {
        self.kill();
        // The last backends may hold the data directory's lock a moment after the port
        // closed.
        let deadline = Instant::now() + Duration::from_secs(30);
        let g = loop {
            match self.spawn() {
                Ok(g) => break g,
                Err(e) => {
                    assert!(Instant::now() < deadline, "restart postgres: {e}");
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
        };
        *self.running.lock().unwrap() = Some(g);
    }
}

impl Drop for PostgresServer {
    fn drop(&mut self) {
        self.resume();
        if let Some(mut g) = self.running.get_mut().unwrap().take() {
            g.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The last lines of the server's log, for a failure's message.
fn last_lines(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

/// A loopback port nobody listens on right now.
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free loopback port")
}
