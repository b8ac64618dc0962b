//! The alert rules and the Grafana dashboard we ship name only metrics that `/metrics` serves: a
//! renamed metric would otherwise leave an alert that can never fire and a panel that stays empty.

use std::collections::BTreeSet;
use std::path::Path;

use crate::serving::metrics::{
    BlockVolumeLabel, ClaimClass, Metrics, Outcome, PoolLabel, StuckLabel, VolumeClass, WatchLabel,
};

const RULES: &str = "deploy/helm/hostpath-provisioner/files/alerts.rules.yaml";
const DASHBOARD: &str = "deploy/helm/hostpath-provisioner/files/grafana-dashboard.json";

/// Metrics the rules may name that Prometheus makes itself rather than scrapes from us.
const MADE_BY_PROMETHEUS: [&str; 1] = [
    // 1 when a scrape of the target succeeded, 0 when it failed: tells a pod that does not
    // answer at all from a provisioner that answers "not ready".
    "up",
];

/// PromQL words that are not metric names when not followed by `(`.
const KEYWORDS: [&str; 11] =
    ["by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "bool", "offset"];

/// Aggregation operators: followed by `(` or by a `by`/`without` clause, never metric names.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Modifiers whose parenthesised group lists label names, not series.
const LABEL_LIST_MODIFIERS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

/// The metric names a PromQL expression selects: identifiers outside label matchers, strings,
/// ranges and label lists that are not function or aggregation names.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i = skip_string(&chars, i);
        } else if c == '{' || c == '[' {
            let close = if c == '{' { '}' } else { ']' };
            i += 1;
            while i < chars.len() && chars[i] != close {
                i = if matches!(chars[i], '"' | '\'' | '`') { skip_string(&chars, i) } else { i + 1 };
            }
            i += 1;
        } else if c.is_ascii_digit() || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit)) {
            // Numbers and durations (`0.95`, `1e9`, `5m`).
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.' || chars[i] == '_') {
                i += 1;
            }
        } else if c.is_ascii_alphabetic() || c == '_' || c == ':' {
            let start = i;
            while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':') {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut next = i;
            while next < chars.len() && chars[next].is_whitespace() {
                next += 1;
            }
            let call = chars.get(next) == Some(&'(');
            if call && LABEL_LIST_MODIFIERS.contains(&word.as_str()) {
                while next < chars.len() && chars[next] != ')' {
                    next += 1;
                }
                i = next + 1;
            } else if !call && !KEYWORDS.contains(&word.as_str()) && !AGGREGATIONS.contains(&word.as_str()) {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// The index after the string literal starting at `start`.
fn skip_string(chars: &[char], start: usize) -> usize {
    let quote = chars[start];
    let mut i = start + 1;
    while i < chars.len() && chars[i] != quote {
        i += if chars[i] == '\\' && quote != '`' { 2 } else { 1 };
    }
    i + 1
}

/// Metrics with one sample in every labelled family: a family appears in `/metrics` only once it
/// has a sample.
fn metrics_with_every_family() -> Metrics {
    let metrics = Metrics::new();
    let outcome = Outcome { result: "success".into(), reason: "none".into() };
    let pool = PoolLabel { pool: "legacy".into(), root: "/var/hpvolumes".into() };
    metrics.provisions.get_or_create(&outcome).inc();
    metrics.deletions.get_or_create(&outcome).inc();
    for family in [
        &metrics.pool_capacity_bytes,
        &metrics.pool_free_bytes,
        &metrics.pool_usable,
        &metrics.background_deletions_pending,
        &metrics.orphaned_volume_bytes,
        &metrics.pool_shares_os_disk,
    ] {
        family.get_or_create(&pool).set(1);
    }
    metrics
        .trash_stuck_bytes
        .get_or_create(&StuckLabel { pool: "legacy".into(), root: "/var/hpvolumes".into(), reason: "busy".into() })
        .set(1);
    metrics.watch_restarts.get_or_create(&WatchLabel { watch: "claims".into() }).inc();
    metrics.block_volume_exposed(&BlockVolumeLabel { pool: "legacy".into(), pv: "pvc-1".into() }, true);
    metrics.waiting_claims.report("uid", "node", std::time::Duration::from_secs(60));
    let claim = ClaimClass { class: "hostpath".into(), source: String::new() };
    metrics.library.provisioned(&claim, 1.0);
    metrics.library.provision_failed(&claim);
    let volume = VolumeClass { class: "hostpath".into() };
    metrics.library.deleted(&volume, 1.0);
    metrics.library.delete_failed(&volume);
    metrics
}

/// Every sample name `/metrics` can serve, from its `# TYPE` lines (samples of a counter end in
/// `_total`, of a histogram in `_bucket`, `_sum` and `_count`).
fn served_names() -> BTreeSet<String> {
    let text = metrics_with_every_family().encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let mut fields = rest.split(' ');
        let (Some(name), Some(kind)) = (fields.next(), fields.next()) else { continue };
        match kind {
            "counter" => {
                names.insert(format!("{name}_total"));
            }
            "histogram" => {
                for suffix in ["_bucket", "_sum", "_count"] {
                    names.insert(format!("{name}{suffix}"));
                }
            }
            _ => {
                names.insert(name.to_owned());
            }
        }
    }
    names
}

fn read(relative: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(relative);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// The `expr:` values of the rule file (kept on one line each, which this checks).
fn rule_expressions() -> Vec<String> {
    let text = read(RULES);
    let exprs: Vec<String> = text
        .lines()
        .filter_map(|line| line.trim_start().strip_prefix("expr:"))
        .map(|expr| expr.trim().to_owned())
        .collect();
    for expr in &exprs {
        assert!(!expr.is_empty() && !expr.starts_with(['|', '>']), "{RULES}: keep each expr on one line: {expr:?}");
    }
    exprs
}

/// Every `expr` of the dashboard's panels, and the selectors of its `label_values(...)` variables.
fn dashboard_expressions() -> Vec<String> {
    fn walk(value: &serde_json::Value, out: &mut Vec<String>) {
        match value {
            serde_json::Value::Object(map) => {
                for (key, value) in map {
                    match (key.as_str(), value) {
                        ("expr", serde_json::Value::String(expr)) => out.push(expr.clone()),
                        ("definition", serde_json::Value::String(definition)) => {
                            // label_values(<series selector>, <label>): the label is no metric.
                            let inner = definition.strip_prefix("label_values(").and_then(|d| d.strip_suffix(')'));
                            let selector = inner.and_then(|i| i.rsplit_once(',')).map(|(selector, _)| selector);
                            out.push(selector.unwrap_or(definition).to_owned());
                        }
                        _ => walk(value, out),
                    }
                }
            }
            serde_json::Value::Array(items) => items.iter().for_each(|item| walk(item, out)),
            _ => {}
        }
    }
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let mut out = Vec::new();
    walk(&dashboard, &mut out);
    out
}

#[test]
fn metric_names_are_read_from_promql() {
    let expr = r#"histogram_quantile(0.95, sum by (le, class) (rate(a_bucket{job=~"x{1}", b="c"}[5m]))) / on (pool) group_left b_bytes offset 5m > bool 1e3 or max without(node) (c:rule) and d"#;
    let expected: BTreeSet<String> = ["a_bucket", "b_bytes", "c:rule", "d"].map(String::from).into();
    assert_eq!(metric_names(expr), expected);
}

#[test]
fn every_metric_the_alert_rules_name_is_served() {
    let served = served_names();
    let exprs = rule_expressions();
    assert!(exprs.len() >= 6, "the rule file has lost alerts: {exprs:?}");
    for expr in exprs {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no metric found in {expr:?}");
        for name in names {
            assert!(
                served.contains(&name) || MADE_BY_PROMETHEUS.contains(&name.as_str()),
                "{RULES} names {name}, which /metrics does not serve (expr {expr:?})"
            );
        }
    }
}

#[test]
fn every_metric_the_dashboard_names_is_served() {
    let served = served_names();
    let exprs = dashboard_expressions();
    assert!(exprs.len() >= 20, "the dashboard has lost panels: {exprs:?}");
    for expr in exprs {
        let names = metric_names(&expr);
        assert!(!names.is_empty(), "no metric found in {expr:?}");
        for name in names {
            assert!(served.contains(&name), "{DASHBOARD} names {name}, which /metrics does not serve (expr {expr:?})");
        }
    }
}

#[test]
fn the_sig_storage_library_names_are_among_those_served() {
    let served = served_names();
    for name in [
        "controller_persistentvolumeclaim_provision_total",
        "controller_persistentvolumeclaim_provision_failed_total",
        "controller_persistentvolumeclaim_provision_duration_seconds_bucket",
        "controller_persistentvolume_delete_total",
        "controller_persistentvolume_delete_failed_total",
        "controller_persistentvolume_delete_duration_seconds_bucket",
        "hostpath_provisioner_build_info",
        "kubevirt_hpp_pool_path_shared_with_os",
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
        "process_max_fds",
        "process_start_time_seconds",
    ] {
        assert!(served.contains(name), "{name} not served: {served:?}");
    }
}

#[test]
fn the_dashboard_panels_are_well_formed() {
    let dashboard: serde_json::Value = serde_json::from_str(&read(DASHBOARD)).expect("the dashboard is JSON");
    let panels = dashboard["panels"].as_array().expect("panels");
    let mut ids = BTreeSet::new();
    for panel in panels {
        let title = panel["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without a title: {panel}");
        assert!(ids.insert(panel["id"].as_u64().expect("numeric id")), "duplicate panel id in {title}");
        let grid = &panel["gridPos"];
        let (x, w) = (grid["x"].as_u64().expect("x"), grid["w"].as_u64().expect("w"));
        assert!(x + w <= 24, "{title} is wider than the dashboard");
        if panel["type"] == "row" {
            continue;
        }
        assert_eq!(panel["datasource"]["uid"], "${datasource}", "{title} must use the datasource variable");
        let targets = panel["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "{title} has no query");
        for target in targets {
            let expr = target["expr"].as_str().unwrap_or_default();
            assert!(expr.contains(r#"job=~"$job""#), "{title}: filter by the job variable: {expr}");
        }
    }
}
