//! What `build()` checks about the server and the connected user before it hands out a
//! backend: that the server keeps what it is given (no evicting `maxmemory-policy`), and
//! that the user may publish and subscribe on the engine's wake-up channels.
//!
//! Both are refusals at build time, with a [`BackendErrorKind::Config`] error that says
//! why (its [`ConfigError`] is the refusal to match on): found later, the first would hand a held lock to a second holder under memory
//! pressure, the second would leave every waiter to its fallback timer.

use std::sync::atomic::{AtomicBool, Ordering};

use redis::Value;
use tokio::time::Instant;

use super::commands::{Commands, timed_out};
use crate::{BackendError, BackendErrorKind, ConfigError};

/// The checks of a backend built before its server answered
/// ([`start_before_redis`](super::RedisBackendBuilder::start_before_redis)): run on the
/// first call that reaches the server, and every call waits for them to pass. A refusal
/// is kept: every later call gets the [`BackendErrorKind::Config`] error `build()` would
/// have given (an evicting server or a user without channel rights does not mend itself;
/// the backend must be built again once it is fixed).
pub(crate) struct Deferred {
    prefix: String,
    cluster: bool,
    /// Whether the eviction policy is checked (not when the user opted in).
    eviction: bool,
    /// Set once the checks passed: the common case reads only this.
    passed: AtomicBool,
    /// Held while the checks run, so concurrent calls wait for them rather than run them
    /// again; holds the refusal, once there is one.
    refused: tokio::sync::Mutex<Option<BackendError>>,
}

impl Deferred {
    pub(crate) fn new(prefix: String, cluster: bool, eviction: bool) -> Self {
        Self {
            prefix,
            cluster,
            eviction,
            passed: AtomicBool::new(false),
            refused: tokio::sync::Mutex::new(None),
        }
    }

    /// `Ok` once the checks have passed (running them if nobody has yet), within
    /// `deadline`; the refusal if they failed; the error of a server that still cannot be
    /// asked (the checks then run again on the next call).
    pub(crate) async fn passed(
        &self,
        commands: &Commands,
        deadline: Instant,
    ) -> Result<(), BackendError> {
        if self.passed.load(Ordering::Acquire) {
            return Ok(());
        }
        let late = || timed_out("server checks", commands.timeout());
        let mut refused = tokio::time::timeout_at(deadline, self.refused.lock())
            .await
            .map_err(|_| late())?;
        if self.passed.load(Ordering::Acquire) {
            return Ok(());
        }
        if let Some(refusal) = refused.as_ref() {
            return Err(refusal.clone());
        }
        let checks = async {
            if self.eviction {
                eviction(commands).await?;
            }
            channels(commands, &self.prefix, self.cluster).await?;
            super::layout::check(commands, &self.prefix, self.cluster).await
        };
        match tokio::time::timeout_at(deadline, checks).await {
            Ok(Ok(())) => {
                self.passed.store(true, Ordering::Release);
                tracing::info!("redis reachable; its eviction policy and channel rights checked");
                Ok(())
            }
            Ok(Err(e)) if e.kind() == BackendErrorKind::Config => {
                tracing::error!(error = %e, "redis refused by the checks build() runs; every call fails until the backend is built again");
                *refused = Some(e.clone());
                Err(e)
            }
            Ok(Err(e)) => Err(e),
            Err(_) => Err(late()),
        }
    }
}

/// Refuse a server whose `maxmemory-policy` may evict keys (every engine key has a TTL, so
/// `volatile-*` policies evict them as readily as `allkeys-*` ones). The policy is read
/// with `CONFIG GET`, or from `INFO memory` where `CONFIG` is renamed or refused; a server
/// that answers neither is refused too (the policy cannot be vouched for).
pub(super) async fn eviction(pool: &Commands) -> Result<(), BackendError> {
    let mut config = redis::cmd("CONFIG");
    config.arg("GET").arg("maxmemory-policy");
    let from_config = match pool.query_unchecked::<Value>("CONFIG GET", &config).await {
        Ok(reply) => {
            let words = strings(&reply);
            words
                .iter()
                .position(|w| w.eq_ignore_ascii_case("maxmemory-policy"))
                .and_then(|i| words.get(i + 1).cloned())
        }
        // Renamed away or refused to this user: try INFO.
        Err(e) if e.kind() == BackendErrorKind::Protocol => None,
        Err(e) => return Err(e),
    };
    let policies = match from_config {
        Some(policy) => vec![policy],
        None => {
            let mut info = redis::cmd("INFO");
            info.arg("memory");
            match pool.query_unchecked::<Value>("INFO memory", &info).await {
                // In a cluster, one text per primary.
                Ok(reply) => strings(&reply)
                    .iter()
                    .flat_map(|text| text.lines())
                    .filter_map(|line| line.trim().strip_prefix("maxmemory_policy:"))
                    .map(str::to_owned)
                    .collect(),
                Err(e) if e.kind() == BackendErrorKind::Protocol => {
                    return Err(
                        BackendError::from(ConfigError::EvictionPolicyUnreadable).with_source(e)
                    );
                }
                Err(e) => return Err(e),
            }
        }
    };
    if policies.is_empty() {
        return Err(ConfigError::EvictionPolicyUnreported.into());
    }
    match policies
        .iter()
        .find(|p| !p.eq_ignore_ascii_case("noeviction"))
    {
        None => Ok(()),
        Some(policy) => Err(ConfigError::EvictingPolicy(policy.clone()).into()),
    }
}

/// Refuse a connected user that may not subscribe to, or publish on, the engine's wake-up
/// channels (`<prefix>:*`; sharded on a cluster). Asked with `ACL DRYRUN` (Redis 7) for
/// the user `ACL WHOAMI` names; where the user may not run `ACL` (or the server is older),
/// the publish right is tried for real, on a channel no lock uses (nobody listens: it
/// changes nothing). A server without ACLs (Redis < 6) is not checked.
pub(super) async fn channels(
    pool: &Commands,
    prefix: &str,
    cluster: bool,
) -> Result<(), BackendError> {
    let (kind, publish, subscribe) = if cluster {
        ("swake", "SPUBLISH", "SSUBSCRIBE")
    } else {
        ("wake", "PUBLISH", "SUBSCRIBE")
    };
    // The hash tag of a real lock is 16 hex digits: no lock's channel is this one.
    let channel = format!("{prefix}:{{build-check}}:{kind}:");
    let refused = |user: Option<&str>, command: &'static str, why: &str| {
        BackendError::from(ConfigError::ChannelRights {
            user: user.map(str::to_owned),
            command,
            reason: why.to_owned(),
            prefix: prefix.to_owned(),
        })
    };
    let whoami = pool
        .query_unchecked::<String>("ACL WHOAMI", redis::cmd("ACL").arg("WHOAMI"))
        .await;
    let user = match whoami {
        Ok(user) => Some(user),
        Err(e) if e.kind() == BackendErrorKind::Protocol => None,
        Err(e) => return Err(e),
    };
    if let Some(user) = &user {
        let mut asked = true;
        for command in [subscribe, publish] {
            let mut dryrun = redis::cmd("ACL");
            dryrun.arg("DRYRUN").arg(user).arg(command).arg(&channel);
            if command == publish {
                dryrun.arg("x");
            }
            match pool.query_unchecked::<Value>("ACL DRYRUN", &dryrun).await {
                Ok(Value::Okay) => {}
                Ok(reply) => {
                    let why = strings(&reply).join(" ");
                    if why != "OK" {
                        return Err(refused(Some(user), command, &why));
                    }
                }
                // Redis 6 (no DRYRUN), or a user without the right to ask.
                Err(e) if e.kind() == BackendErrorKind::Protocol => {
                    asked = false;
                    break;
                }
                Err(e) => return Err(e),
            }
        }
        if asked {
            return Ok(());
        }
    }
    let mut probe = redis::cmd(publish);
    probe.arg(&channel).arg("");
    match pool.query_unchecked::<Value>("PUBLISH", &probe).await {
        Ok(_) => Ok(()),
        Err(e) if code(&e) == Some("NOPERM") => {
            Err(refused(user.as_deref(), publish, "NOPERM").with_source(e))
        }
        // Any other refusal says nothing about channel rights.
        Err(e) if e.kind() == BackendErrorKind::Protocol => Ok(()),
        Err(e) => Err(e),
    }
}

/// The server's error code behind a backend error, if it is a server's answer.
fn code(e: &BackendError) -> Option<&str> {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<redis::RedisError>())
        .and_then(redis::RedisError::code)
}

/// Every text in a reply, depth first (a string, an array or map of them, a cluster's
/// per-node answers).
fn strings(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect(value, &mut out);
    out
}

fn collect(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::BulkString(bytes) => out.push(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => out.push(text.clone()),
        Value::Okay => out.push("OK".to_owned()),
        Value::Array(items) | Value::Set(items) => {
            for item in items {
                collect(item, out);
            }
        }
        Value::Map(pairs) => {
            for (k, v) in pairs {
                collect(k, out);
                collect(v, out);
            }
        }
        _ => {}
    }
}
