//! The shipped alerting rules load in Prometheus (`promtool check rules`), fire on the series of a
//! broken node and stay quiet on a healthy one (`promtool test rules` with
//! tests/alert_rules.test.yaml), and each links to a runbook section of docs/operating.md that exists.
//! promtool is built from the Go module proxy and cached by hack/build-promtool.sh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The node provisioner's rules, and the operator's (which the operator wraps in a PrometheusRule).
const RULES: [&str; 2] =
    ["deploy/helm/hostpath-provisioner/files/alerts.rules.yaml", "deploy/operator/monitoring/alerts.rules.yaml"];
const RULE_TESTS: &str = "tests/alert_rules.test.yaml";
/// Where each alert's runbook is, one section per alert.
const RUNBOOKS: &str = "docs/operating.md";

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// The cached promtool, built once per test run (two builds at once would fight over the cache).
fn promtool() -> &'static Path {
    static PROMTOOL: OnceLock<PathBuf> = OnceLock::new();
    PROMTOOL.get_or_init(|| {
        let output = Command::new("bash")
            .arg(repo().join("hack/build-promtool.sh"))
            .output()
            .expect("running hack/build-promtool.sh");
        let log = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "hack/build-promtool.sh failed:\n{log}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let path = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        assert!(path.is_file(), "hack/build-promtool.sh printed no promtool path:\n{stdout}\n{log}");
        path
    })
}

fn run_promtool(args: &[&str]) -> String {
    let output = Command::new(promtool()).args(args).current_dir(repo()).output().expect("running promtool");
    let text = format!("{}{}", String::from_utf8_lossy(&output.stdout), String::from_utf8_lossy(&output.stderr));
    assert!(output.status.success(), "promtool {} failed:\n{text}", args.join(" "));
    text
}

#[test]
fn alert_rules_load_in_prometheus() {
    for file in RULES {
        let text = run_promtool(&["check", "rules", file]);
        let alerts = alert_names_in(file).len();
        assert!(alerts > 0, "{file} has no alert");
        assert!(text.contains(&format!("SUCCESS: {alerts} rules found")), "{file}: {text}");
    }
}

#[test]
fn each_alert_fires_on_a_broken_node_and_not_on_a_healthy_one() {
    let text = run_promtool(&["test", "rules", RULE_TESTS]);
    assert!(text.contains("SUCCESS"), "{text}");
    // Every alert of the rule file has a test case.
    let tests = std::fs::read_to_string(repo().join(RULE_TESTS)).expect("reading the rule tests");
    for alert in alert_names() {
        assert!(tests.contains(&format!("alertname: {alert}\n")), "{alert} has no promtool test case");
    }
}

/// GitHub's anchor of a Markdown heading: lower case, spaces to dashes, punctuation dropped.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

fn alert_names_in(file: &str) -> Vec<String> {
    let rules = std::fs::read_to_string(repo().join(file)).expect("reading the rules");
    rules.lines().filter_map(|l| l.trim().strip_prefix("- alert:")).map(|a| a.trim().to_owned()).collect()
}

fn alert_names() -> Vec<String> {
    RULES.iter().flat_map(|file| alert_names_in(file)).collect()
}

#[test]
fn each_alert_links_to_its_runbook_in_the_operating_guide() {
    let rules: String =
        RULES.iter().map(|file| std::fs::read_to_string(repo().join(file)).expect("reading the rules")).collect();
    let readme = std::fs::read_to_string(repo().join(RUNBOOKS)).expect("reading the runbooks");
    let anchors: Vec<String> =
        readme.lines().filter_map(|l| l.strip_prefix('#')).map(|h| anchor(h.trim_start_matches('#'))).collect();
    let links: Vec<&str> =
        rules.lines().filter_map(|l| l.trim().strip_prefix("runbook:")).map(|u| u.trim().trim_matches('"')).collect();
    let alerts = alert_names();
    assert_eq!(links.len(), alerts.len(), "every alert names its runbook");
    // A relative runbook_url leads nowhere from Alertmanager: the chart writes absolute ones.
    assert!(
        !rules.lines().any(|l| l.trim().starts_with("runbook_url:")),
        "the rule file must not carry relative runbook_urls"
    );
    for (alert, link) in alerts.iter().zip(&links) {
        let target = link
            .strip_prefix(&format!("{RUNBOOKS}#"))
            .unwrap_or_else(|| panic!("{alert}: {link} is not a runbook anchor"));
        assert_eq!(target, alert.to_lowercase(), "{alert} links to another alert's runbook");
        assert!(anchors.iter().any(|a| a == target), "{RUNBOOKS} has no section #{target} for {alert}");
    }
}
