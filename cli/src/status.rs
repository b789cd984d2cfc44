//! `status KEY`: free or held; each holder with its label, fence, mode and lease left; how
//! many wait; the last fence the store remembers for the key (the next grant's is above
//! it: what a storage system's high-water mark may be at most).

use serde_json::{Value, json};
use tower_lock_engine::{Holder, LockEngine, LockError, Mode};

use crate::output::{Failure, NOT_FOUND, OK, Outcome};

pub(crate) async fn run(engine: &LockEngine, key: &str) -> Result<Outcome, Failure> {
    let lock = engine.lock(key);
    lock.key()?;
    let holders = lock.holders().await?;
    let waiters = lock.waiters().await?;
    let last_fence = match engine.admin().last_fence(key).await {
        Ok(fence) => fence.map(|f| f.get()),
        Err(LockError::Unsupported(_)) => None,
        Err(e) => return Err(e.into()),
    };
    let held = !holders.is_empty();
    let mut text = format!("{key}: {}\n", if held { "held" } else { "free" });
    for holder in &holders {
        text.push_str(&format!("  holder {}\n", describe(holder)));
    }
    text.push_str(&format!("  waiters {waiters}\n"));
    if let Some(fence) = last_fence {
        text.push_str(&format!("  last_fence {fence}\n"));
    }
    let json = json!({
        "key": key,
        "state": if held { "held" } else { "free" },
        "holders": holders.iter().map(holder_json).collect::<Vec<_>>(),
        "waiters": waiters,
        "last_fence": last_fence,
    });
    Ok(Outcome::new(if held { OK } else { NOT_FOUND }, text, json))
}

/// `lock`, `shared` or `shared-alone`.
pub(crate) fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Shared { limit: 1 } => "shared-alone",
        Mode::Shared { .. } => "shared",
        _ => "lock",
    }
}

/// One line: label, token, fence, mode, lease left.
pub(crate) fn describe(holder: &Holder) -> String {
    format!(
        "label={} token={} fence={} mode={} lease_left={}",
        holder.label().unwrap_or("-"),
        holder.token.as_str(),
        holder
            .fence
            .map_or_else(|| "-".to_owned(), |f| f.get().to_string()),
        mode_name(holder.mode),
        holder.ttl.map_or_else(
            || "no-expiry".to_owned(),
            |t| format!("{}ms", t.as_millis())
        ),
    )
}

pub(crate) fn holder_json(holder: &Holder) -> Value {
    json!({
        "label": holder.label(),
        "token": holder.token.as_str(),
        "fence": holder.fence.map(|f| f.get()),
        "mode": mode_name(holder.mode),
        "lease_left_ms": holder.ttl.map(|t| u64::try_from(t.as_millis()).unwrap_or(u64::MAX)),
    })
}
