//! `record get|delete KEY`: an idempotency record the engine-backed layer stored under a
//! request's lock key (status, headers, body size, when it was stored, how long it lives
//! on), or its deletion.

use std::time::UNIX_EPOCH;

use serde_json::json;
use tower_lock_core::RecordSummary;
use tower_lock_engine::{LockEngine, LockKey};

use crate::{
    args::{RecordAction, RecordArgs},
    output::{Failure, NOT_FOUND, OK, Outcome},
};

pub(crate) async fn run(engine: &LockEngine, args: &RecordArgs) -> Result<Outcome, Failure> {
    match &args.action {
        RecordAction::Get { key } => get(engine, key).await,
        RecordAction::Delete { key } => {
            let deleted = engine
                .forget_record(&LockKey::new(key).map_err(|e| Failure::usage(e.to_string()))?)
                .await?;
            let (code, text) = if deleted {
                (OK, format!("{key}: record deleted\n"))
            } else {
                (NOT_FOUND, format!("{key}: no record\n"))
            };
            Ok(Outcome::new(
                code,
                text,
                json!({"key": key, "deleted": deleted}),
            ))
        }
    }
}

async fn get(engine: &LockEngine, key: &str) -> Result<Outcome, Failure> {
    let lock_key = LockKey::new(key).map_err(|e| Failure::usage(e.to_string()))?;
    let Some(record) = engine.record(&lock_key).await? else {
        return Ok(Outcome::new(
            NOT_FOUND,
            format!("{key}: no record\n"),
            json!({"key": key, "found": false}),
        ));
    };
    let stored_ms = record
        .completed_at
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    // Read after the record: a record that expired in between shows no expiry.
    let expires_ms = engine
        .record_expiry(&lock_key)
        .await?
        .map(|left| u64::try_from(left.as_millis()).unwrap_or(u64::MAX));
    let summary = RecordSummary::decode(&record.meta);
    let mut text = format!("{key}: record\n");
    match &summary {
        Some(s) => {
            text.push_str(&format!("  status {}\n", s.status));
            for (name, value) in &s.headers {
                text.push_str(&format!("  header {name}: {value}\n"));
            }
        }
        None => text.push_str("  status ? (metadata of another version)\n"),
    }
    let expires = expires_ms.map_or_else(|| "expired".to_owned(), |ms| ms.to_string());
    text.push_str(&format!(
        "  body {} bytes{}\n  stored_at_unix_ms {stored_ms}\n  expires_in_ms {expires}\n",
        record.body.len(),
        if record.kept {
            ""
        } else {
            " (tombstone: response not kept)"
        },
    ));
    let json = json!({
        "key": key,
        "found": true,
        "status": summary.as_ref().map(|s| s.status),
        "headers": summary.as_ref().map(|s| s.headers.iter().map(|(n, v)| json!([n, v])).collect::<Vec<_>>()),
        "kept": record.kept,
        "body_bytes": record.body.len(),
        "stored_at_unix_ms": stored_ms,
        "expires_in_ms": expires_ms,
    });
    Ok(Outcome::new(OK, text, json))
}
