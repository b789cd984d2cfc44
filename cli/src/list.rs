//! `list [--held] [--waiting] [--prefix-match STR]`: the keys someone holds or waits for,
//! a page at a time, each held one with its holders' labels. Never a blocking `KEYS`:
//! on Redis a `SCAN` of each node (a Cluster's primaries one after another, a Sentinel's
//! primary), on Postgres the engine's listing (a range of the key rows' index).
//!
//! The cursor (`--cursor`, printed as `next`) is the node's index and its `SCAN` cursor on
//! Redis (`SCAN` may return a key twice across pages, never skips one present throughout),
//! the last key of the page on Postgres.

use std::collections::BTreeMap;

use serde_json::json;
use tower_lock_engine::{LockEngine, LockKey};

use crate::{
    args::{ListArgs, Store},
    connect::{self, DEFAULT_PREFIX, Which},
    output::{Failure, OK, Outcome},
};

/// One listed key.
struct Listed {
    held: bool,
    waiting: bool,
}

pub(crate) async fn run(store: &Store, args: &ListArgs) -> Result<Outcome, Failure> {
    let engine = connect::engine(store).await?;
    let limit = args.limit.max(1);
    let (found, next) = match connect::which(store)? {
        Which::Postgres(_) => postgres_page(&engine, args, limit).await?,
        which => {
            let prefix = store.prefix.as_deref().unwrap_or(DEFAULT_PREFIX);
            let nodes = redis_nodes(&which).await?;
            redis_page(&nodes, prefix, args, limit).await?
        }
    };
    let mut text = String::new();
    let mut keys = Vec::new();
    for (key, listed) in found {
        if (args.held && !listed.held) || (args.waiting && !listed.waiting) {
            continue;
        }
        let holders = if listed.held {
            engine.lock(&key).holders().await.unwrap_or_default()
        } else {
            Vec::new()
        };
        let waiters = if listed.waiting {
            engine.lock(&key).waiters().await.unwrap_or(0)
        } else {
            0
        };
        let labels: Vec<&str> = holders.iter().map(|h| h.label().unwrap_or("-")).collect();
        text.push_str(&format!(
            "{key}\t{}\twaiters={waiters}\t{}\n",
            if holders.is_empty() { "free" } else { "held" },
            labels.join(",")
        ));
        keys.push(json!({
            "key": key,
            "held": !holders.is_empty(),
            "waiters": waiters,
            "holders": holders.iter().map(crate::status::holder_json).collect::<Vec<_>>(),
        }));
    }
    if let Some(next) = &next {
        text.push_str(&format!("next: --cursor {next}\n"));
    }
    Ok(Outcome::new(OK, text, json!({"keys": keys, "next": next})))
}

async fn postgres_page(
    engine: &LockEngine,
    args: &ListArgs,
    limit: usize,
) -> Result<(BTreeMap<String, Listed>, Option<String>), Failure> {
    let after = match &args.cursor {
        Some(c) => Some(LockKey::new(c).map_err(|e| Failure::usage(format!("--cursor: {e}")))?),
        None => None,
    };
    let page = engine
        .admin()
        .active_keys(after.as_ref(), &args.prefix_match, limit)
        .await?;
    let next = (page.len() == limit).then(|| page[page.len() - 1].key.as_str().to_owned());
    let found = page
        .into_iter()
        .map(|k| {
            (
                k.key.as_str().to_owned(),
                Listed {
                    held: k.held,
                    waiting: k.waiting,
                },
            )
        })
        .collect();
    Ok((found, next))
}

/// The nodes whose keys to scan, as URLs.
async fn redis_nodes(which: &Which<'_>) -> Result<Vec<String>, Failure> {
    match which {
        Which::Redis(url) => Ok(vec![(*url).to_owned()]),
        Which::Cluster(seeds) => {
            let seed = seeds
                .first()
                .ok_or_else(|| Failure::usage("no cluster node"))?;
            let mut conn = connection(seed).await?;
            let slots: Vec<Vec<Value2>> = redis::cmd("CLUSTER")
                .arg("SLOTS")
                .query_async(&mut conn)
                .await
                .map_err(|e| Failure::backend(format!("CLUSTER SLOTS: {e}")))?;
            let mut nodes: Vec<String> = slots
                .iter()
                .filter_map(|range| match range.get(2) {
                    Some(Value2::Array(primary)) => match (primary.first(), primary.get(1)) {
                        (Some(Value2::BulkString(ip)), Some(Value2::Int(port))) => {
                            Some(with_address(seed, &String::from_utf8_lossy(ip), *port))
                        }
                        _ => None,
                    },
                    _ => None,
                })
                .collect();
            nodes.sort();
            nodes.dedup();
            Ok(nodes)
        }
        Which::Sentinel(sentinels, service) => {
            let first = sentinels
                .first()
                .ok_or_else(|| Failure::usage("no sentinel"))?;
            let mut conn = connection(first).await?;
            let (ip, port): (String, i64) = redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(*service)
                .query_async(&mut conn)
                .await
                .map_err(|e| Failure::backend(format!("SENTINEL get-master-addr-by-name: {e}")))?;
            Ok(vec![with_address("redis://", &ip, port)])
        }
        Which::Postgres(_) => unreachable!("Postgres is listed by the engine"),
    }
}

type Value2 = redis::Value;

/// `url` (its scheme and credentials) pointing at `ip:port` instead.
fn with_address(url: &str, ip: &str, port: i64) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("redis", url));
    let auth = rest
        .split('/')
        .next()
        .and_then(|authority| authority.rsplit_once('@'))
        .map_or(String::new(), |(auth, _)| format!("{auth}@"));
    format!("{scheme}://{auth}{ip}:{port}")
}

async fn connection(url: &str) -> Result<redis::aio::MultiplexedConnection, Failure> {
    let client = redis::Client::open(url).map_err(|e| Failure::usage(format!("{url}: {e}")))?;
    client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| Failure::backend(format!("{url}: {e}")))
}

/// `SCAN` each node from the cursor until `limit` keys are found or every node is done.
async fn redis_page(
    nodes: &[String],
    prefix: &str,
    args: &ListArgs,
    limit: usize,
) -> Result<(BTreeMap<String, Listed>, Option<String>), Failure> {
    let (mut node, mut cursor) = match &args.cursor {
        Some(c) => c
            .split_once(':')
            .and_then(|(n, c)| Some((n.parse::<usize>().ok()?, c.parse::<u64>().ok()?)))
            .ok_or_else(|| Failure::usage("--cursor: not a cursor this command printed"))?,
        None => (0, 0),
    };
    // Every kind of the key's Redis keys, filtered here: `lock` (held) and `queue` (waited
    // for) of the keys beginning with `--prefix-match`.
    let pattern = format!("{}:{{*}}:*", glob_escape(prefix));
    let mut found = BTreeMap::new();
    while node < nodes.len() {
        let mut conn = connection(&nodes[node]).await?;
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await
                .map_err(|e| Failure::backend(format!("SCAN: {e}")))?;
            for redis_key in batch {
                if let Some((kind, key)) = parse(&redis_key, prefix)
                    && key.starts_with(&args.prefix_match)
                {
                    let listed = found.entry(key.to_owned()).or_insert(Listed {
                        held: false,
                        waiting: false,
                    });
                    match kind {
                        "lock" => listed.held = true,
                        "queue" => listed.waiting = true,
                        _ => {}
                    }
                }
            }
            cursor = next;
            if cursor == 0 || found.len() >= limit {
                break;
            }
        }
        if cursor == 0 {
            node += 1;
        }
        if found.len() >= limit {
            break;
        }
    }
    // Drop the ghost entries of other kinds (a tombstone's `fence`, a record).
    found.retain(|_, l: &mut Listed| l.held || l.waiting);
    let next = (node < nodes.len()).then(|| format!("{node}:{cursor}"));
    Ok((found, next))
}

/// `P:{T}:<kind>:K` → (`kind`, `K`).
fn parse<'a>(redis_key: &'a str, prefix: &str) -> Option<(&'a str, &'a str)> {
    let rest = redis_key.strip_prefix(prefix)?.strip_prefix(":{")?;
    let (_, rest) = rest.split_once("}:")?;
    rest.split_once(':')
}

/// `s` with the `SCAN` pattern's special characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_key_names_its_kind_and_lock_key() {
        assert_eq!(
            parse("tower-lock:{0123456789abcdef}:lock:a/b:c", "tower-lock"),
            Some(("lock", "a/b:c"))
        );
        assert_eq!(parse("other:{0}:lock:k", "tower-lock"), None);
        assert_eq!(
            with_address("redis://:pw@10.0.0.1:7000/0", "10.0.0.2", 7001),
            "redis://:pw@10.0.0.2:7001"
        );
        assert_eq!(glob_escape("a*b"), "a\\*b");
    }
}
