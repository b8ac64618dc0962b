//! Counting API requests: the API server's `apiserver_request_total` (everyone's requests) and
//! its audit log (exact, per user; the provisioners run as ServiceAccounts of their own, see
//! `setup.rs`).

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use anyhow::{Context, Result};
use kube::Client;
use serde_json::Value;

/// A Kubernetes verb (`create`, `patch`, `watch`, ...) on a resource (`persistentvolumes`,
/// `events.events.k8s.io`, `persistentvolumeclaims/status`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ApiKey {
    pub verb: String,
    pub resource: String,
}

impl ApiKey {
    pub fn new(verb: &str, resource: &str) -> ApiKey {
        ApiKey { verb: verb.to_string(), resource: resource.to_string() }
    }

    /// Changes something: create, update, patch, delete, deletecollection.
    pub fn is_write(&self) -> bool {
        matches!(self.verb.as_str(), "create" | "update" | "patch" | "delete" | "deletecollection")
    }

    pub fn is_event(&self) -> bool {
        self.resource == "events" || self.resource == "events.events.k8s.io"
    }

    pub fn label(&self) -> String {
        format!("{} {}", self.verb, self.resource)
    }
}

pub type Counts = BTreeMap<ApiKey, u64>;

/// `a - b`, key by key, never below zero; keys that end at zero are dropped.
pub fn minus(a: &Counts, b: &Counts) -> Counts {
    a.iter()
        .filter_map(|(k, v)| {
            let d = v.saturating_sub(b.get(k).copied().unwrap_or(0));
            (d > 0).then(|| (k.clone(), d))
        })
        .collect()
}

pub fn sum(counts: &Counts, pick: impl Fn(&ApiKey) -> bool) -> u64 {
    counts.iter().filter(|(k, _)| pick(k)).map(|(_, v)| v).sum()
}

fn resource_key(resource: &str, group: &str, subresource: &str) -> String {
    let mut key = resource.to_string();
    if !group.is_empty() {
        key = format!("{key}.{group}");
    }
    if !subresource.is_empty() {
        key = format!("{key}/{subresource}");
    }
    key
}

/// The metric's verb label (HTTP-ish, upper case) as a Kubernetes verb.
fn k8s_verb(metric_verb: &str) -> String {
    match metric_verb {
        "POST" => "create",
        "PUT" => "update",
        "PATCH" | "APPLY" => "patch",
        "DELETE" => "delete",
        "DELETECOLLECTION" => "deletecollection",
        "WATCH" | "WATCHLIST" => "watch",
        other => return other.to_ascii_lowercase(),
    }
    .to_string()
}

/// Resource requests counted by the API server so far (`apiserver_request_total`, all codes),
/// non-resource requests (health, metrics) left out. Watches are counted when they end.
pub async fn scrape_apiserver(client: &Client) -> Result<Counts> {
    Ok(parse_request_total(&apiserver_metrics(client).await?))
}

/// kube-apiserver's `/metrics` text.
pub async fn apiserver_metrics(client: &Client) -> Result<String> {
    let request = http::Request::get("/metrics").body(Vec::new())?;
    client.request_text(request).await.context("GET /metrics from kube-apiserver")
}

/// Sum of the samples of metric `name` whose labels `pick` accepts.
pub fn metric_sum(text: &str, name: &str, pick: impl Fn(&BTreeMap<String, String>) -> bool) -> f64 {
    let prefix = format!("{name}{{");
    text.lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .filter_map(|rest| rest.rsplit_once("} "))
        .filter(|(labels, _)| pick(&parse_labels(labels)))
        .filter_map(|(_, value)| value.trim().parse::<f64>().ok())
        .sum()
}

fn parse_request_total(text: &str) -> Counts {
    let mut counts = Counts::new();
    for line in text.lines().filter(|l| l.starts_with("apiserver_request_total{")) {
        let Some((labels, value)) = line["apiserver_request_total{".len()..].rsplit_once("} ") else { continue };
        let labels = parse_labels(labels);
        let get = |k: &str| labels.get(k).map(String::as_str).unwrap_or("");
        if get("resource").is_empty() {
            continue;
        }
        let key = ApiKey {
            verb: k8s_verb(get("verb")),
            resource: resource_key(get("resource"), get("group"), get("subresource")),
        };
        *counts.entry(key).or_default() += value.trim().parse::<f64>().unwrap_or(0.0) as u64;
    }
    counts
}

/// `a="x",b="y"` (Prometheus text format label values escape `\` and `"`).
fn parse_labels(text: &str) -> BTreeMap<String, String> {
    let mut labels = BTreeMap::new();
    let mut rest = text;
    while let Some((name, after)) = rest.split_once("=\"") {
        let mut value = String::new();
        let mut chars = after.char_indices();
        let mut end = after.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => value.extend(chars.next().map(|(_, c)| c)),
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        labels.insert(name.trim_start_matches(',').trim().to_string(), value);
        rest = &after[end..];
    }
    labels
}

/// Requests by user, read from the audit log (which the policy limits to the provisioners).
#[derive(Clone, Debug, Default)]
pub struct AuditCounts {
    /// user name -> requests.
    pub by_user: BTreeMap<String, Counts>,
    /// Answers with a status code of 400 or more, by user and request.
    pub failed: BTreeMap<String, Counts>,
}

impl AuditCounts {
    /// All users together.
    pub fn total(&self) -> Counts {
        let mut total = Counts::new();
        for counts in self.by_user.values() {
            for (k, v) in counts {
                *total.entry(k.clone()).or_default() += v;
            }
        }
        total
    }

    pub fn failed_total(&self) -> u64 {
        self.failed.values().map(|c| c.values().sum::<u64>()).sum()
    }
}

/// The API server's audit log, read incrementally.
pub struct AuditLog {
    path: PathBuf,
    offset: Mutex<u64>,
}

impl AuditLog {
    pub fn new(path: &Path) -> AuditLog {
        AuditLog { path: path.to_path_buf(), offset: Mutex::new(0) }
    }

    /// Skips everything logged so far.
    pub fn mark(&self) -> Result<()> {
        let len = std::fs::metadata(&self.path).map(|m| m.len()).unwrap_or(0);
        *self.offset.lock().expect("audit offset") = len;
        Ok(())
    }

    /// Counts the complete lines logged since the last `mark`/`read_new`, and moves past them.
    /// A watch counts once, when it starts (stage ResponseStarted); everything else when it
    /// completes (ResponseComplete).
    pub fn read_new(&self) -> Result<AuditCounts> {
        let mut offset = self.offset.lock().expect("audit offset");
        let mut file = match std::fs::File::open(&self.path) {
            Ok(file) => file,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => return Ok(AuditCounts::default()),
            Err(err) => return Err(err).with_context(|| format!("opening {}", self.path.display())),
        };
        file.seek(SeekFrom::Start(*offset))?;
        let mut text = String::new();
        file.read_to_string(&mut text)?;
        let complete = text.rfind('\n').map_or(0, |i| i + 1);
        *offset += complete as u64;
        let mut counts = AuditCounts::default();
        for line in text[..complete].lines() {
            let Ok(event) = serde_json::from_str::<Value>(line) else { continue };
            let str_at = |pointer: &str| event.pointer(pointer).and_then(Value::as_str).unwrap_or("");
            let (verb, stage) = (str_at("/verb"), str_at("/stage"));
            let counted = if verb == "watch" { stage == "ResponseStarted" } else { stage == "ResponseComplete" };
            if !counted {
                continue;
            }
            let key = ApiKey {
                verb: verb.to_string(),
                resource: resource_key(
                    str_at("/objectRef/resource"),
                    str_at("/objectRef/apiGroup"),
                    str_at("/objectRef/subresource"),
                ),
            };
            let user = str_at("/user/username").to_string();
            let code = event.pointer("/responseStatus/code").and_then(Value::as_u64).unwrap_or(0);
            if code >= 400 {
                *counts.failed.entry(user.clone()).or_default().entry(key.clone()).or_default() += 1;
            }
            *counts.by_user.entry(user).or_default().entry(key).or_default() += 1;
        }
        Ok(counts)
    }
}

/// The audit policy: metadata of every request by users in `groups`, nothing else.
pub fn audit_policy(groups: &[String]) -> Value {
    serde_json::json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            { "level": "Metadata", "userGroups": groups },
            { "level": "None" },
        ],
    })
}

/// Requests the bench itself made, counted where it makes them (exact for its writes).
#[derive(Debug, Default)]
pub struct BenchCalls(Mutex<Counts>);

impl BenchCalls {
    pub fn add(&self, verb: &str, resource: &str) {
        *self.0.lock().expect("bench calls").entry(ApiKey::new(verb, resource)).or_default() += 1;
    }

    pub fn snapshot(&self) -> Counts {
        self.0.lock().expect("bench calls").clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_request_total_lines() {
        let text = "# HELP x\n\
            apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"persistentvolumes\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 7\n\
            apiserver_request_total{code=\"201\",component=\"apiserver\",dry_run=\"\",group=\"events.k8s.io\",resource=\"events\",scope=\"resource\",subresource=\"\",verb=\"POST\",version=\"v1\"} 3\n\
            apiserver_request_total{code=\"200\",component=\"apiserver\",dry_run=\"\",group=\"\",resource=\"\",scope=\"\",subresource=\"/metrics\",verb=\"GET\",version=\"\"} 2\n";
        let counts = parse_request_total(text);
        assert_eq!(counts[&ApiKey::new("create", "persistentvolumes")], 7);
        assert_eq!(counts[&ApiKey::new("create", "events.events.k8s.io")], 3);
        assert_eq!(counts.len(), 2);
        let created = metric_sum(text, "apiserver_request_total", |l| l.get("verb").is_some_and(|v| v == "POST"));
        assert_eq!(created, 10.0);
    }
}
