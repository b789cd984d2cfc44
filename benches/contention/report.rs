//! The JSON report: its configuration header, merging figures in, and the human-readable
//! form.

use std::collections::BTreeMap;

use serde_json::{Value, json};

use crate::config::{Config, Hold};
use crate::support;

/// The configuration part of every report, so a JSON line says what produced it.
pub(crate) fn header(config: &Config, bench: &str) -> Value {
    let hold_mode = match config.hold_mode {
        Hold::Spin => "spin",
        Hold::Sleep => "sleep",
    };
    json!({
        "bench": bench,
        "label": config.label,
        "backend": config.backend,
        "fifo": config.fifo,
        "workers": config.workers,
        "keys": config.keys,
        "iterations": config.iterations,
        "hold_us": config.hold.as_micros() as u64,
        "hold_mode": hold_mode,
        "ttl_ms": config.ttl.as_millis() as u64,
        "engines": config.engines,
        "threads": config.threads,
        "overtake_slack_us": config.overtake_slack.as_micros() as u64,
        "stagger_us": config.stagger.as_micros() as u64,
        // Other load on the machine, for judging the figures: 1-minute load average.
        "loadavg_1m": support::loadavg(),
    })
}

pub(crate) fn extend(report: &mut Value, fields: Value) {
    let (Value::Object(r), Value::Object(f)) = (report, fields) else {
        unreachable!("both are JSON objects");
    };
    r.extend(f);
}

pub(crate) fn print_human(report: &Value) {
    let Value::Object(fields) = report else {
        return;
    };
    let shown: BTreeMap<_, _> = fields
        .iter()
        .filter(|(k, _)| k.as_str() != "redis_command_calls")
        .collect();
    for (k, v) in shown {
        eprintln!("{k:>30}: {v}");
    }
}
