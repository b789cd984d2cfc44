//! The Grafana dashboard in the repository (`dashboards/grafana.json`) queries only series
//! the layers record, with only the labels they carry, and shows every one of them:
//! each PromQL expression is read against `tower_lock::metrics::SERIES`.

use std::collections::BTreeSet;

use serde_json::Value;
use tower_lock::{
    RejectionKind,
    metrics::{SERIES, Series, SeriesKind},
};

const DASHBOARD: &str = include_str!("../../dashboards/grafana.json");

/// The suffixes a Prometheus exporter with bucket bounds gives a histogram's series.
const HISTOGRAM_SUFFIXES: [&str; 3] = ["_bucket", "_sum", "_count"];

/// Every PromQL expression of the dashboard: the panels' targets (rows' panels included)
/// and the template variables' queries.
fn expressions(dashboard: &Value) -> Vec<String> {
    fn panels(list: &Value, out: &mut Vec<String>) {
        for panel in list.as_array().into_iter().flatten() {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    out.push(expr.to_owned());
                }
            }
            panels(&panel["panels"], out);
        }
    }
    let mut out = Vec::new();
    panels(&dashboard["panels"], &mut out);
    for var in dashboard["templating"]["list"]
        .as_array()
        .into_iter()
        .flatten()
    {
        if var["type"] == "query" {
            let query = var["query"]["query"].as_str().or(var["query"].as_str());
            out.push(query.expect("a query variable has a query").to_owned());
        }
    }
    out
}

/// The series `name` queries, and whether it names a histogram's bucket series (which adds
/// the `le` label).
fn series_of(name: &str) -> Option<(&'static Series, bool)> {
    if let Some(series) = SERIES.iter().find(|s| s.name == name) {
        return Some((series, false));
    }
    HISTOGRAM_SUFFIXES.iter().find_map(|suffix| {
        let base = name.strip_suffix(suffix)?;
        let series = SERIES
            .iter()
            .find(|s| s.name == base && s.kind == SeriesKind::Histogram)?;
        Some((series, *suffix == "_bucket"))
    })
}

/// The metric names in `expr` (every `tower_lock_…` word), each with its label matchers
/// (`{…}` right after it) as (label, value).
fn metrics_in(expr: &str) -> Vec<(String, Vec<(String, String)>)> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(at) = rest.find("tower_lock_") {
        let word = &rest[at..];
        let end = word
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(word.len());
        let (name, after) = word.split_at(end);
        let mut matchers = Vec::new();
        if let Some(body) = after.strip_prefix('{') {
            let body = &body[..body.find('}').expect("a closed label matcher")];
            for matcher in body.split(',') {
                let op = matcher.find(['=', '!']).expect("a label matcher");
                let value = matcher[op..].trim_start_matches(['=', '!', '~']).trim();
                let value = value.trim_matches('"').to_owned();
                matchers.push((matcher[..op].trim().to_owned(), value));
            }
        }
        out.push((name.to_owned(), matchers));
        rest = after;
    }
    out
}

/// The labels `expr` groups by (`by (…)`, `without (…)`) or reads (`label_values(m, l)`).
fn grouping_labels(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    for opener in ["by (", "without ("] {
        for (at, _) in expr.match_indices(opener) {
            let list = &expr[at + opener.len()..];
            let list = &list[..list.find(')').expect("a closed grouping")];
            out.extend(list.split(',').map(|l| l.trim().to_owned()));
        }
    }
    if let Some(args) = expr.strip_prefix("label_values(") {
        let label = args.trim_end_matches(')').rsplit(',').next().unwrap();
        out.push(label.trim().to_owned());
    }
    out
}

#[test]
fn every_metric_the_dashboard_queries_is_one_the_layers_record() {
    let dashboard: Value = serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let exprs = expressions(&dashboard);
    assert!(exprs.len() >= SERIES.len(), "{exprs:#?}");
    let reasons: BTreeSet<&str> = [
        RejectionKind::MissingKey,
        RejectionKind::MalformedKey,
        RejectionKind::Locked,
        RejectionKind::Conflict,
        RejectionKind::TimedOut,
        RejectionKind::QueueFull,
        RejectionKind::BackendUnavailable,
        RejectionKind::FingerprintMismatch,
        RejectionKind::NotReplayable,
        RejectionKind::RequestTooLarge,
        RejectionKind::UnreadableBody,
        RejectionKind::Misconfigured,
    ]
    .map(RejectionKind::as_str)
    .into();
    let mut shown = BTreeSet::new();
    for expr in &exprs {
        let metrics = metrics_in(expr);
        assert!(!metrics.is_empty(), "queries no tower-lock series: {expr}");
        // The labels the expression may name: those of its series (and `le` of a bucket).
        let mut labels = BTreeSet::new();
        for (name, matchers) in &metrics {
            let (series, bucket) = series_of(name)
                .unwrap_or_else(|| panic!("{name} is not a series the layers record: {expr}"));
            shown.insert(series.name);
            labels.extend(series.labels.iter().copied());
            if bucket {
                labels.insert("le");
            }
            for (label, value) in matchers {
                assert!(
                    series.labels.contains(&label.as_str()),
                    "{name} has no label {label:?}: {expr}"
                );
                if label == "reason" {
                    assert!(
                        reasons.contains(value.as_str()),
                        "no reason {value:?}: {expr}"
                    );
                }
            }
        }
        for label in grouping_labels(expr) {
            assert!(
                labels.contains(label.as_str()),
                "groups by {label:?}, a label none of its series has: {expr}"
            );
        }
    }
    let all: BTreeSet<&str> = SERIES.iter().map(|s| s.name).collect();
    let unshown: Vec<_> = all.difference(&shown).collect();
    assert!(
        unshown.is_empty(),
        "series the dashboard does not show: {unshown:?}"
    );
}

/// The checker above catches what it is for: a misspelt series, a label a series lacks.
#[test]
fn the_dashboard_check_refuses_a_series_or_a_label_the_layers_do_not_record() {
    assert!(series_of("tower_lock_hold_seconds_bucket").is_some());
    assert!(series_of("tower_lock_requests_holding_bucket").is_none());
    assert!(series_of("tower_lock_held_total").is_none());
    let metrics = metrics_in(r#"sum by (layer) (rate(tower_lock_acquired_total{route="x"}[5m]))"#);
    assert_eq!(
        metrics,
        [(
            "tower_lock_acquired_total".to_owned(),
            vec![("route".to_owned(), "x".to_owned())]
        )]
    );
    let (series, _) = series_of(&metrics[0].0).unwrap();
    assert!(!series.labels.contains(&"route"));
    assert_eq!(
        grouping_labels("sum by (layer, le) (x) / sum without (mode) (y)"),
        ["layer", "le", "mode"]
    );
}
