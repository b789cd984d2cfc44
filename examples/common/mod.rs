//! Shared by the examples: the engine they lock on, and the address they listen on.

use std::{env, net::SocketAddr};

use tower_lock::LockEngine;

/// The in-process engine; the Redis engine when `REDIS_URL` is set; else the Postgres
/// engine when `DATABASE_URL` is set. (`REDIS_URL` is the explicit choice of a lock server:
/// a shell that has a `DATABASE_URL` for other reasons keeps it.)
pub(crate) async fn engine_from_env() -> LockEngine {
    let set = |name| env::var(name).ok().filter(|url| !url.is_empty());
    if let Some(url) = set("REDIS_URL") {
        redis_engine(&url).await
    } else if let Some(url) = set("DATABASE_URL") {
        postgres_engine(&url).await
    } else {
        println!(
            "lock engine: in-process (set REDIS_URL to lock on Redis, DATABASE_URL on Postgres)"
        );
        LockEngine::in_memory()
    }
}

/// The one place the examples switch to Redis.
#[cfg(feature = "redis")]
async fn redis_engine(url: &str) -> LockEngine {
    match tower_lock::engine::redis::RedisBackend::connect(url).await {
        Ok(backend) => {
            println!("lock engine: Redis at {url}");
            LockEngine::new(backend)
        }
        Err(e) => {
            eprintln!("cannot use REDIS_URL={url}: {e}");
            std::process::exit(1);
        }
    }
}

/// Built without the `redis` feature: there is no Redis backend to switch to.
#[cfg(not(feature = "redis"))]
async fn redis_engine(url: &str) -> LockEngine {
    println!(
        "REDIS_URL={url} is set but tower-lock was built without the `redis` feature; using in-process"
    );
    LockEngine::in_memory()
}

/// The one place the examples switch to Postgres: the engine's tables in the schema
/// `tower_lock`, created (or brought up to date) first, as an application's deployment
/// would with `migrate()`.
#[cfg(feature = "postgres")]
pub(crate) async fn postgres_engine(url: &str) -> LockEngine {
    use tower_lock::engine::postgres::PostgresBackend;
    let builder = PostgresBackend::builder(url);
    let built = match builder.migrate().await {
        Ok(()) => builder.build().await,
        Err(e) => Err(e),
    };
    match built {
        Ok(backend) => {
            println!(
                "lock engine: Postgres at {url} (schema {})",
                backend.schema()
            );
            LockEngine::new(backend)
        }
        Err(e) => {
            eprintln!("cannot use DATABASE_URL={url}: {e}");
            std::process::exit(1);
        }
    }
}

/// Built without the `postgres` feature: there is no Postgres backend to switch to.
#[cfg(not(feature = "postgres"))]
pub(crate) async fn postgres_engine(url: &str) -> LockEngine {
    println!(
        "DATABASE_URL={url} is set but tower-lock was built without the `postgres` feature \
         (cargo run --features postgres); using in-process"
    );
    LockEngine::in_memory()
}

/// 127.0.0.1 and `PORT` (default `default_port`; `PORT=0` picks a free port).
#[allow(dead_code, reason = "the engine example listens on nothing")]
pub(crate) fn listen_addr(default_port: u16) -> SocketAddr {
    let port = env::var("PORT")
        .ok()
        .and_then(|p| p.parse().ok())
        .unwrap_or(default_port);
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// The signed-in account of a request: what an authentication layer puts in the request
/// extensions, and what idempotency records are scoped by (two accounts sending the same
/// `Idempotency-Key` never see each other's stored responses).
#[allow(dead_code, reason = "only the HTTP examples sign requests in")]
#[derive(Clone, Debug)]
pub(crate) struct Account(pub(crate) String);

impl std::fmt::Display for Account {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The examples' stand-in for authentication: `Authorization: Bearer <account>`, the token
/// being the account's name. A real service verifies a signed token here.
#[allow(dead_code, reason = "only the HTTP examples sign requests in")]
pub(crate) fn authenticate(authorization: Option<&[u8]>) -> Option<Account> {
    let token = authorization?.strip_prefix(b"Bearer ")?;
    let name = std::str::from_utf8(token).ok()?.trim();
    let valid = !name.is_empty()
        && name.len() <= 64
        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-');
    valid.then(|| Account(name.to_owned()))
}
