//! What the benches share: the engine constructors (the one place that names the Redis
//! backend and the lock layer, so switching them on is a one-line change each), a tiny
//! command-line parser, percentiles, process memory, and a minimal Redis client for
//! `INFO commandstats` / `DBSIZE`.
//!
//! Each bench includes this module and uses a different part of it.
#![allow(dead_code)]

use std::{
    collections::BTreeMap,
    io::{BufRead, BufReader, Read, Write},
    net::TcpStream,
    str::FromStr,
    time::Duration,
};

use tower_lock::LockEngine;

// The counting allocator is a `GlobalAlloc`, which only `unsafe` can implement.
#[allow(unsafe_code)]
pub(crate) mod counting;

// ---------------------------------------------------------------------------------------
// Construction of the engines and the layer under test.
// ---------------------------------------------------------------------------------------

/// What a bench prints (and `benches/run.sh` looks for) when the Redis backend is missing.
pub(crate) const REDIS_NOT_BUILT: &str = "redis backend not built";

/// An engine over the Redis backend at `url`, its keys under `prefix`: the single place
/// the benches construct it.
#[cfg(feature = "redis")]
pub(crate) async fn redis_engine(url: &str, prefix: &str) -> Result<LockEngine, String> {
    use tower_lock::engine::redis::RedisBackend;
    let backend = RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?;
    Ok(LockEngine::new(backend))
}

/// An engine over the Redis backend on the cluster whose nodes `urls` lists
/// (comma-separated), its keys under `prefix`.
#[cfg(feature = "redis-cluster")]
pub(crate) async fn redis_cluster_engine(urls: &str, prefix: &str) -> Result<LockEngine, String> {
    use tower_lock::engine::redis::RedisBackend;
    let backend = RedisBackend::cluster(urls.split(','))
        .prefix(prefix)
        .build()
        .await
        .map_err(|e| format!("cannot connect to the Redis cluster at {urls}: {e}"))?;
    Ok(LockEngine::new(backend))
}

/// Built without the `redis-cluster` feature: a clear error.
#[cfg(not(feature = "redis-cluster"))]
pub(crate) async fn redis_cluster_engine(urls: &str, prefix: &str) -> Result<LockEngine, String> {
    let _ = (urls, prefix);
    Err(format!(
        "{REDIS_NOT_BUILT} (tower-lock was built without the `redis-cluster` feature)"
    ))
}

/// Built without the `redis` feature: a clear error, so `--backend redis` fails loudly
/// instead of silently measuring something else.
#[cfg(not(feature = "redis"))]
pub(crate) async fn redis_engine(url: &str, prefix: &str) -> Result<LockEngine, String> {
    let _ = (url, prefix);
    Err(format!(
        "{REDIS_NOT_BUILT} (tower-lock was built without the `redis` feature)"
    ))
}

/// The request header carrying the lock key in the HTTP benches. The request path carries
/// the same key (`/items/{key}`), so the layer can be keyed on either.
pub(crate) const KEY_HEADER: &str = "x-lock-key";

/// `router` wrapped in the lock layer over `engine`, keyed by [`KEY_HEADER`], waiting for a
/// held key (FIFO if `fifo`): the single place the benches construct `LockLayer`. The
/// layer waits rather than rejecting, so a hot key measures queueing, not `423`s.
pub(crate) fn with_lock_layer(
    router: axum::Router,
    engine: LockEngine,
    fifo: bool,
) -> axum::Router {
    use axum::http::HeaderName;
    use tower_lock::{LockLayer, key::HeaderKey};
    let layer = LockLayer::builder(engine)
        .key(HeaderKey::new(HeaderName::from_static(KEY_HEADER)))
        // The benches send `GET`s, which the default leaves unlocked (a safe method).
        .methods(["GET"])
        .wait(Duration::from_secs(30))
        .fifo(fifo)
        .build()
        .expect("the bench's layer configuration is valid");
    // Routes already made services (see `app`) take the layer once, here.
    router.layer(layer)
}

/// The trivial service the layer wraps: one route answering `200 ok`.
///
/// Made a service with `with_state(())`, as `axum::serve` does: a router whose handler is
/// still boxed re-applies every layer to it on each request it serves (a clone of the
/// handler, the layer's service and a box), which a served router never does, so benches
/// that call the router directly (`oneshot`) would count that for the layer.
pub(crate) fn app() -> axum::Router {
    axum::Router::new()
        .route("/items/{key}", axum::routing::get(|| async { "ok" }))
        .with_state(())
}

/// The same service locking the path's key by hand inside the handler: what the layer
/// saves a user from writing, and a stand-in figure while the layer is not in the build.
/// (It releases when the handler returns; the layer holds until the body is sent.)
pub(crate) fn app_locking_in_handler(engine: LockEngine) -> axum::Router {
    use axum::{
        extract::{Path, State},
        http::StatusCode,
    };
    async fn handler(
        State(engine): State<LockEngine>,
        Path(key): Path<String>,
    ) -> Result<&'static str, StatusCode> {
        let lease = engine
            .lock(&key)
            .acquire()
            .await
            .map_err(|_| StatusCode::SERVICE_UNAVAILABLE)?;
        lease
            .release()
            .await
            .map_err(|_| StatusCode::INTERNAL_SERVER_ERROR)?;
        Ok("ok")
    }
    axum::Router::new()
        .route("/items/{key}", axum::routing::get(handler))
        .with_state(engine)
}

// ---------------------------------------------------------------------------------------
// Command line.
// ---------------------------------------------------------------------------------------

/// The command line as `--name value` / `--name=value` options and `--flag`s.
///
/// Hand-rolled to keep the benches free of a CLI dependency. `cargo bench` passes `--bench`
/// to every harness-less bench; `cargo test --all-targets` runs them without it.
pub(crate) struct Args {
    options: BTreeMap<String, Option<String>>,
    benching: bool,
}

impl Args {
    /// Parse `std::env::args()`. `flags` are the options that take no value.
    pub(crate) fn parse(flags: &[&str]) -> Result<Self, String> {
        Self::parse_from(std::env::args().skip(1), flags)
    }

    fn parse_from(args: impl Iterator<Item = String>, flags: &[&str]) -> Result<Self, String> {
        let mut options = BTreeMap::new();
        let mut benching = false;
        let mut args = args.peekable();
        while let Some(arg) = args.next() {
            let Some(name) = arg.strip_prefix("--") else {
                return Err(format!("unexpected argument `{arg}` (see --help)"));
            };
            if name == "bench" {
                benching = true;
                continue;
            }
            let (name, value) = match name.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None if flags.contains(&name) => (name.to_string(), None),
                None => {
                    let value = args
                        .next()
                        .ok_or_else(|| format!("--{name} needs a value (see --help)"))?;
                    (name.to_string(), Some(value))
                }
            };
            options.insert(name, value);
        }
        Ok(Self { options, benching })
    }

    /// `false` when run by `cargo test` (which runs harness-less benches once, without
    /// `--bench`): the bench then does a quick smoke run instead of a measurement.
    pub(crate) fn benching(&self) -> bool {
        self.benching
    }

    /// `true` if `--name` was given.
    pub(crate) fn flag(&self, name: &str) -> bool {
        self.options.contains_key(name)
    }

    /// The value of `--name`, parsed, or `default`.
    pub(crate) fn get<T: FromStr>(&self, name: &str, default: T) -> Result<T, String> {
        match self.options.get(name) {
            None => Ok(default),
            Some(None) => Err(format!("--{name} needs a value")),
            Some(Some(v)) => v
                .parse()
                .map_err(|_| format!("--{name}: cannot parse `{v}`")),
        }
    }

    /// The value of `--name`, if given.
    pub(crate) fn string(&self, name: &str) -> Option<String> {
        self.options.get(name).cloned().flatten()
    }

    /// Fail on options the bench does not know, so a typo is not silently a default.
    pub(crate) fn reject_unknown(&self, known: &[&str]) -> Result<(), String> {
        match self.options.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(format!("unknown option --{k} (see --help)")),
            None => Ok(()),
        }
    }
}

/// The Redis URL from `--redis-url`, else `REDIS_URL`.
pub(crate) fn redis_url(args: &Args) -> Option<String> {
    args.string("redis-url").or_else(redis_url_from_env)
}

/// The Redis URL from `REDIS_URL`, if set and not empty.
pub(crate) fn redis_url_from_env() -> Option<String> {
    std::env::var("REDIS_URL").ok().filter(|u| !u.is_empty())
}

// ---------------------------------------------------------------------------------------
// Statistics.
// ---------------------------------------------------------------------------------------

/// Percentiles of a sample, in the unit of the sample.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Percentiles {
    pub(crate) p50: f64,
    pub(crate) p99: f64,
    pub(crate) max: f64,
}

/// Nearest-rank percentiles (no interpolation: every figure is a value that occurred).
/// `None` for an empty sample.
pub(crate) fn percentiles(sample: &mut [f64]) -> Option<Percentiles> {
    if sample.is_empty() {
        return None;
    }
    sample.sort_by(f64::total_cmp);
    let rank = |p: f64| {
        let i = ((p / 100.0) * sample.len() as f64).ceil() as usize;
        sample[i.clamp(1, sample.len()) - 1]
    };
    Some(Percentiles {
        p50: rank(50.0),
        p99: rank(99.0),
        max: sample[sample.len() - 1],
    })
}

/// `d` in microseconds.
pub(crate) fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// Round to `places` decimals, so the JSON stays readable.
pub(crate) fn round(x: f64, places: i32) -> f64 {
    let f = 10f64.powi(places);
    (x * f).round() / f
}

// ---------------------------------------------------------------------------------------
// Process memory.
// ---------------------------------------------------------------------------------------

/// Resident set size of this process in KiB, from `/proc/self/statm` (resident pages times
/// the page size the kernel handed us in the aux vector). `None` off Linux.
pub(crate) fn rss_kib() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * page_size()? / 1024)
}

/// Peak resident set size in KiB (`VmHWM` in `/proc/self/status`).
pub(crate) fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// The page size, from `AT_PAGESZ` in `/proc/self/auxv` (pairs of native-endian words):
/// no libc call needed, and right on 16K/64K-page machines too.
fn page_size() -> Option<u64> {
    const AT_PAGESZ: u64 = 6;
    let mut auxv = Vec::new();
    std::fs::File::open("/proc/self/auxv")
        .ok()?
        .read_to_end(&mut auxv)
        .ok()?;
    const W: usize = std::mem::size_of::<usize>();
    auxv.chunks_exact(2 * W).find_map(|pair| {
        let word = |b: &[u8]| usize::from_ne_bytes(b.try_into().expect("word-sized")) as u64;
        (word(&pair[..W]) == AT_PAGESZ).then(|| word(&pair[W..]))
    })
}

/// The 1-minute load average: other load on the machine, for judging the figures.
pub(crate) fn loadavg() -> Option<f64> {
    std::fs::read_to_string("/proc/loadavg")
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

// ---------------------------------------------------------------------------------------
// A minimal Redis client for the server's own statistics.
// ---------------------------------------------------------------------------------------

/// A blocking connection speaking just enough RESP for `INFO` and `DBSIZE`.
///
/// Deliberately separate from the engine's own connections: the statistics must come from
/// the server, not from the code under test, and must work before the backend exists.
pub(crate) struct RedisStats {
    reader: BufReader<TcpStream>,
}

impl RedisStats {
    /// Connect to the server named by `url` (`redis://[user:password@]host[:port][/db]`),
    /// selecting its database.
    pub(crate) fn connect(url: &str) -> Result<Self, String> {
        let rest = url
            .strip_prefix("redis://")
            .ok_or_else(|| format!("only redis:// URLs are supported, not `{url}`"))?;
        let rest = rest.split('?').next().unwrap_or(rest);
        let (rest, db) = match rest.split_once('/') {
            Some((r, db)) if !db.is_empty() => (r, Some(db)),
            Some((r, _)) => (r, None),
            None => (rest, None),
        };
        let (auth, hostport) = match rest.rsplit_once('@') {
            Some((a, h)) => (Some(a), h),
            None => (None, rest),
        };
        let addr = if hostport.contains(':') {
            hostport.to_string()
        } else {
            format!("{hostport}:6379")
        };
        let stream = TcpStream::connect(&addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .map_err(|e| e.to_string())?;
        let mut conn = Self {
            reader: BufReader::new(stream),
        };
        if let Some(auth) = auth {
            let args: Vec<&str> = match auth.split_once(':') {
                Some(("", password)) => vec!["AUTH", password],
                Some((user, password)) => vec!["AUTH", user, password],
                None => vec!["AUTH", auth],
            };
            conn.command(&args)?;
        }
        if let Some(db) = db {
            conn.command(&["SELECT", db])?;
        }
        Ok(conn)
    }

    /// Calls per command since the server started (or since `CONFIG RESETSTAT`), from
    /// `INFO commandstats`. Redis counts the commands a Lua script runs (`redis.call`) as
    /// well as the `EVALSHA` itself, so this is the server's real work.
    pub(crate) fn command_calls(&mut self) -> Result<BTreeMap<String, u64>, String> {
        let info = self.command(&["INFO", "commandstats"])?;
        Ok(info
            .lines()
            .filter_map(|line| {
                // cmdstat_evalsha:calls=12,usec=...
                let (name, stats) = line.strip_prefix("cmdstat_")?.split_once(':')?;
                let calls = stats.split(',').find_map(|s| s.strip_prefix("calls="))?;
                Some((name.to_string(), calls.parse().ok()?))
            })
            .collect())
    }

    /// Number of keys in the selected database (give a run its own database, `/N` in the
    /// URL, and this counts exactly what the run left behind).
    pub(crate) fn dbsize(&mut self) -> Result<u64, String> {
        self.command(&["DBSIZE"])?
            .parse()
            .map_err(|_| "DBSIZE: not a number".to_string())
    }

    /// Send one command; the reply as text (simple string, integer or bulk string).
    fn command(&mut self, args: &[&str]) -> Result<String, String> {
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        let io = |e: std::io::Error| format!("redis: {e}");
        self.reader
            .get_mut()
            .write_all(req.as_bytes())
            .map_err(io)?;
        let mut line = String::new();
        self.reader.read_line(&mut line).map_err(io)?;
        let line = line.trim_end();
        match line.split_at_checked(1) {
            Some(("+" | ":", v)) => Ok(v.to_string()),
            Some(("-", e)) => Err(format!("redis error: {e}")),
            Some(("$", len)) => {
                let len: usize = len.parse().map_err(|_| "redis: bad bulk length")?;
                let mut body = vec![0; len + 2];
                self.reader.read_exact(&mut body).map_err(io)?;
                body.truncate(len);
                String::from_utf8(body).map_err(|_| "redis: reply is not UTF-8".to_string())
            }
            _ => Err(format!("redis: unexpected reply `{line}`")),
        }
    }
}

/// Commands the server ran between two `command_calls` snapshots, leaving out the
/// `INFO` calls the measurement itself makes.
pub(crate) fn commands_between(
    before: &BTreeMap<String, u64>,
    after: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(name, _)| name.as_str() != "info")
        .filter_map(|(name, &n)| {
            let d = n.saturating_sub(before.get(name).copied().unwrap_or(0));
            (d > 0).then(|| (name.clone(), d))
        })
        .collect()
}
