//! `release KEY [--holder TOKEN|LABEL] [--yes]`: the admin force release, which hands the
//! key to the next waiter (with a higher fence) in the same atomic step, after a
//! confirmation.
//!
//! `--holder` is checked by reading the holders first: a hand-off between that read and the
//! release would release the new holder (a window of one round trip, which a person typing
//! the command cannot hit on purpose; a script that must never should not force-release).

use std::io::{BufRead, Write};

use serde_json::json;
use tower_lock_engine::LockEngine;

use crate::{
    args::ReleaseArgs,
    output::{Failure, NOT_CONFIRMED, NOT_FOUND, OK, Outcome},
    status::{describe, holder_json},
};

pub(crate) async fn run(engine: &LockEngine, args: &ReleaseArgs) -> Result<Outcome, Failure> {
    let key = args.key.as_str();
    let lock = engine.lock(key);
    lock.key()?;
    let holders = lock.holders().await?;
    if holders.is_empty() {
        return Ok(Outcome::new(
            NOT_FOUND,
            format!("{key}: free, nothing released\n"),
            json!({"key": key, "released": false, "reason": "free"}),
        ));
    }
    if let Some(wanted) = &args.holder
        && !holders
            .iter()
            .any(|h| h.token.as_str() == wanted || h.label() == Some(wanted.as_str()))
    {
        return Ok(Outcome::new(
            NOT_FOUND,
            format!("{key}: not held by {wanted}, nothing released\n"),
            json!({
                "key": key,
                "released": false,
                "reason": "other-holder",
                "holders": holders.iter().map(holder_json).collect::<Vec<_>>(),
            }),
        ));
    }
    if !args.yes && !confirm(key, &holders.iter().map(describe).collect::<Vec<_>>()) {
        return Ok(Outcome::new(
            NOT_CONFIRMED,
            "not confirmed, nothing released\n".to_owned(),
            json!({"key": key, "released": false, "reason": "not-confirmed"}),
        ));
    }
    let released = engine.admin().force_release(key).await?;
    let json = json!({
        "key": key,
        "released": released,
        "holders": holders.iter().map(holder_json).collect::<Vec<_>>(),
    });
    Ok(if released {
        Outcome::new(OK, format!("{key}: released\n"), json)
    } else {
        Outcome::new(NOT_FOUND, format!("{key}: free, nothing released\n"), json)
    })
}

/// Ask on stderr, read a line on stdin: `y` or `yes` confirms.
fn confirm(key: &str, holders: &[String]) -> bool {
    let mut err = std::io::stderr();
    let _ = writeln!(err, "{key} is held by:");
    for h in holders {
        let _ = writeln!(err, "  {h}");
    }
    let _ = write!(
        err,
        "Release it (the holder's lease is lost; the next waiter gets the key)? [y/N] "
    );
    let _ = err.flush();
    let mut line = String::new();
    if std::io::stdin().lock().read_line(&mut line).is_err() {
        return false;
    }
    matches!(line.trim(), "y" | "Y" | "yes" | "YES")
}
