//! A PgBouncer of the test's own in front of a [`PostgresServer`], in transaction pooling
//! mode: each transaction may run on another server connection, so nothing a client leaves
//! on its session (a `LISTEN`, a `SET`, a prepared statement) can be relied on.
//!
//! Debian's PgBouncer (1.18) refuses to run as root: it runs as the `postgres` user, with
//! its configuration in a directory of its own, under the same guardian as the server.

use std::{
    net::TcpStream,
    path::PathBuf,
    sync::Mutex,
    time::{Duration, Instant},
};

use super::{
    PostgresServer,
    guardian::Guardian,
    server::{TEST_USER, free_port, postgres_dir},
};

/// A PgBouncer process owned by the test.
#[derive(Debug)]
pub struct PgBouncer {
    port: u16,
    dir: PathBuf,
    running: Mutex<Option<Guardian>>,
}

impl PgBouncer {
    /// Start a PgBouncer in transaction pooling mode in front of `server`, on a free port,
    /// with 20 server connections per database and user.
    pub fn start(server: &PostgresServer) -> Self {
        Self::with_pool_size(server, 20)
    }

    /// [`start`](Self::start) with `pool_size` server connections per database and user
    /// (`default_pool_size`): with 2, and other clients keeping them busy
    /// ([`BusyClients`](super::BusyClients)), consecutive transactions (and the two `Sync`s of
    /// one extended-protocol statement outside a transaction) of one client land on
    /// different server connections.
    pub fn with_pool_size(server: &PostgresServer, pool_size: u32) -> Self {
        Self::configured(server, &[("default_pool_size", &pool_size.to_string())])
    }

    /// [`start`](Self::start) with `settings` of its `[pgbouncer]` section in place of the
    /// fixture's (`("ignore_startup_parameters", "")`: none ignored; `("server_login_retry",
    /// "15")`: PgBouncer's default), or added to them (`("query_timeout", "1")`).
    pub fn configured(server: &PostgresServer, settings: &[(&str, &str)]) -> Self {
        let dir = postgres_dir("pgbouncer");
        let mut last = String::new();
        for _ in 0..5 {
            let port = free_port();
            let mut lines = vec![
                ("listen_addr", "127.0.0.1".to_owned()),
                ("listen_port", port.to_string()),
                ("unix_socket_dir", String::new()),
                ("auth_type", "trust".to_owned()),
                ("auth_file", format!("{}/users.txt", dir.display())),
                ("pool_mode", "transaction".to_owned()),
                ("max_client_conn", "1000".to_owned()),
                ("default_pool_size", "20".to_owned()),
                ("server_login_retry", "1".to_owned()),
                (
                    "ignore_startup_parameters",
                    "extra_float_digits,options".to_owned(),
                ),
                ("pidfile", format!("{}/pgbouncer.pid", dir.display())),
                ("logfile", format!("{}/pgbouncer.log", dir.display())),
            ];
            for (name, value) in settings {
                match lines.iter_mut().find(|(n, _)| n == name) {
                    Some(line) => line.1 = (*value).to_owned(),
                    None => lines.push((name, (*value).to_owned())),
                }
            }
            let mut config = format!(
                "[databases]\n* = host=127.0.0.1 port={}\n[pgbouncer]\n",
                server.port()
            );
            for (name, value) in &lines {
                config.push_str(&format!("{name} = {value}\n"));
            }
            std::fs::write(dir.join("pgbouncer.ini"), config).expect("write pgbouncer.ini");
            std::fs::write(dir.join("users.txt"), format!("\"{TEST_USER}\" \"\"\n"))
                .expect("write the auth file");
            let status = std::process::Command::new("chown")
                .args(["-R", "postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("run chown");
            assert!(status.success());
            let program = PathBuf::from("/usr/sbin/pgbouncer");
            let args = [dir.join("pgbouncer.ini").to_string_lossy().into_owned()];
            match Guardian::spawn(&program, &args, "-KILL", None) {
                Ok(mut g) => {
                    let deadline = Instant::now() + Duration::from_secs(10);
                    loop {
                        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
                            return Self {
                                port,
                                dir,
                                running: Mutex::new(Some(g)),
                            };
                        }
                        if Instant::now() >= deadline {
                            g.kill();
                            last = format!("pgbouncer on port {port} never listened");
                            break;
                        }
                        std::thread::sleep(Duration::from_millis(10));
                    }
                }
                Err(e) => last = e,
            }
        }
        panic!("could not start pgbouncer (package `pgbouncer`): {last}");
    }

    /// Stop the bouncer with `signal` (`-INT`: a safe shutdown, as a service manager's
    /// restart; `-TERM`: an immediate one; `-KILL`: a crash), wait until its port refuses
    /// connections, and start it again on the same port and configuration: every client
    /// connection is cut, and its next statement meets a new bouncer.
    pub fn restart(&self, signal: &'static str) {
        let mut running = self.running.lock().unwrap();
        if let Some(mut g) = running.take() {
            g.stop = signal;
            g.kill();
        }
        let deadline = Instant::now() + Duration::from_secs(30);
        while TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
            assert!(Instant::now() < deadline, "pgbouncer did not stop");
            std::thread::sleep(Duration::from_millis(5));
        }
        let program = PathBuf::from("/usr/sbin/pgbouncer");
        let args = [self
            .dir
            .join("pgbouncer.ini")
            .to_string_lossy()
            .into_owned()];
        loop {
            // The port may take a moment to be free again.
            let mut g = Guardian::spawn(&program, &args, "-KILL", None).expect("restart pgbouncer");
            let started = Instant::now();
            while started.elapsed() < Duration::from_secs(2) {
                if TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                    *running = Some(g);
                    return;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            g.kill();
            assert!(Instant::now() < deadline, "pgbouncer did not start again");
        }
    }

    /// `postgres://tower_lock@127.0.0.1:<port>/tower_lock`, through the bouncer.
    pub fn url(&self) -> String {
        format!("postgres://{TEST_USER}@127.0.0.1:{}/{TEST_USER}", self.port)
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(mut g) = self.running.get_mut().unwrap().take() {
            g.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
