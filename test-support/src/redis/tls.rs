//! A `redis-server` that also listens with TLS, on a certificate of a throwaway CA made for
//! the test with the `openssl` command.
//!
//! ```ignore
//! let server = TlsRedis::start();
//! let client = redis::Client::build_with_tls(server.tls_url(), TlsCertificates {
//!     client_tls: None,
//!     root_cert: Some(server.ca_pem()),
//! })?;
//! ```

use std::{path::PathBuf, process::Command};

use super::{RedisServer, guardian::free_port};

/// A redis-server with a plain port (for `redis-cli`) and a TLS port.
#[derive(Debug)]
pub struct TlsRedis {
    server: RedisServer,
    tls_port: u16,
    dir: PathBuf,
}

impl TlsRedis {
    /// Make a CA and a server certificate for `127.0.0.1` in a fresh directory, then start
    /// the server. Panics if `openssl` is missing or the server was built without TLS.
    ///
    /// Also installs rustls's `ring` provider as the process's crypto provider (unless one
    /// is installed already), as an application using TLS to Redis does once at startup:
    /// the engine's `redis-tls` feature enables no provider of its own.
    pub fn start() -> Self {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = crate::scratch::dir("tls");
        let openssl = |args: &[&str]| {
            let out = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .output()
                .expect("run openssl (is it installed?)");
            assert!(out.status.success(), "openssl {args:?} failed: {out:?}");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
            "-days",
            "2",
            "-subj",
            "/CN=tower-lock test CA",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=127.0.0.1",
        ]);
        std::fs::write(dir.join("ext"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext",
        ]);
        let path = |f: &str| dir.join(f).to_string_lossy().into_owned();
        let tls_port = free_port();
        let server = RedisServer::start_with([
            "--tls-port".to_owned(),
            tls_port.to_string(),
            "--tls-cert-file".to_owned(),
            path("server.crt"),
            "--tls-key-file".to_owned(),
            path("server.key"),
            "--tls-ca-cert-file".to_owned(),
            path("ca.crt"),
            "--tls-auth-clients".to_owned(),
            "no".to_owned(),
        ]);
        Self {
            server,
            tls_port,
            dir,
        }
    }

    /// The server (its plain port: `redis-cli`, `scan`, ...).
    pub fn server(&self) -> &RedisServer {
        &self.server
    }

    /// `rediss://127.0.0.1:<tls port>`.
    pub fn tls_url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.tls_port)
    }

    /// The test CA's certificate, PEM: the only root a client should trust here.
    pub fn ca_pem(&self) -> Vec<u8> {
        std::fs::read(self.dir.join("ca.crt")).expect("read the CA certificate")
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
