//! A scenario's measurements over the rounds, and its JSON report.

use std::time::Duration;

use serde_json::{Value, json};

use crate::{
    Config, Scenario, Variant,
    load::LoadOutcome,
    support::{self, percentiles, round},
};

/// One scenario's measurements, summed over the rounds.
#[derive(Default)]
pub(crate) struct Tally {
    latencies: Vec<f64>,
    errors: u64,
    measured: Duration,
    rps_by_round: Vec<f64>,
    pub(crate) skipped: Option<String>,
}

impl Tally {
    pub(crate) fn add(&mut self, outcome: LoadOutcome, slice: Duration) {
        self.rps_by_round.push(round(
            outcome.latencies.len() as f64 / slice.as_secs_f64(),
            1,
        ));
        self.latencies.extend(outcome.latencies);
        self.errors += outcome.errors;
        self.measured += slice;
    }

    pub(crate) fn rps(&self) -> Option<f64> {
        (!self.measured.is_zero())
            .then(|| self.latencies.len() as f64 / self.measured.as_secs_f64())
    }

    pub(crate) fn report(
        mut self,
        config: &Config,
        scenario: &Scenario,
        bare_rps: Option<f64>,
    ) -> Value {
        if let Some(why) = self.skipped {
            return json!({ "skipped": why });
        }
        let requests = self.latencies.len();
        let rps = self.rps();
        let p = percentiles(&mut self.latencies).unwrap_or_default();
        json!({
            "backend": (scenario.variant != Variant::Bare).then(|| scenario.backend.name()),
            "keys": if scenario.hot { "hot" } else { "distinct" },
            "connections": config.connections,
            "duration_s": self.measured.as_secs_f64(),
            "rounds": config.rounds,
            "requests": requests,
            "errors": self.errors,
            "rps": rps.map(|r| round(r, 1)),
            "rps_by_round": self.rps_by_round,
            "ratio_to_bare": rps.zip(bare_rps).map(|(r, b)| round(r / b, 3)),
            "p50_us": round(p.p50, 1),
            "p99_us": round(p.p99, 1),
            "max_us": round(p.max, 1),
            "loadavg_1m": support::loadavg(),
        })
    }
}
