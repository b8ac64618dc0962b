//! When the take-over from the kubevirt hostpath-provisioner operator must not start at all, the
//! decision. Two cases, each found before this operator changes anything for the resource (no
//! finalizer, no node DaemonSet, no object of the kubevirt install touched):
//!
//! - **OLM manages the kubevirt operator** (OpenShift Virtualization, or an OperatorHub
//!   install): OLM re-creates that operator's Deployment, webhook and CRD when they are deleted,
//!   so the operator comes back, finds this operator's `observedVersion`, runs its upgrade
//!   path, brings its legacy DaemonSet back and fights this operator over the resource. Found by
//!   what OLM puts on the Deployments it makes (the labels `olm.owner`, `olm.owner.namespace`,
//!   `olm.owner.kind: ClusterServiceVersion`, and a non-controller owner reference to the
//!   `operators.coreos.com/v1alpha1` ClusterServiceVersion), or by a ClusterServiceVersion that
//!   lists the Deployment `hostpath-provisioner-operator` (while OLM is about to re-create it).
//! - **Pools on a claim in another namespace**: the kubevirt operator's pool claims are in its
//!   namespace, and a pod mounts only a claim of its own namespace, so this operator's mounters
//!   could not adopt them; it would make new, empty claims instead. It must run in that
//!   namespace.
//!
//! The operator then writes one condition of its own, [`TAKE_OVER_STOPPED`], beside whatever
//! the kubevirt operator writes (never over its conditions: the two would wake each other for
//! ever), and a Warning Event.

use super::resource::Condition;
use super::takeover::{Found, Kind};

/// The kubevirt operator's Deployment, as its `operator.yaml` and OLM's bundle name it.
pub const KUBEVIRT_OPERATOR_DEPLOYMENT: &str = "hostpath-provisioner-operator";
/// The condition type written while the take-over is stopped.
pub const TAKE_OVER_STOPPED: &str = "TakeOverStopped";
/// OLM's labels on what it makes (operator-lifecycle-manager, `pkg/lib/ownerutil`).
pub const OLM_OWNER_LABEL: &str = "olm.owner";
pub const OLM_OWNER_NAMESPACE_LABEL: &str = "olm.owner.namespace";
pub const OLM_OWNER_KIND_LABEL: &str = "olm.owner.kind";
pub const CSV_KIND: &str = "ClusterServiceVersion";
pub const OLM_GROUP: &str = "operators.coreos.com";
/// The label OLM puts on the copies of a CSV it makes in other namespaces (never on the original).
pub const OLM_COPIED_FROM: &str = "olm.copiedFrom";

/// A Deployment named [`KUBEVIRT_OPERATOR_DEPLOYMENT`], in any namespace.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperatorDeployment {
    pub namespace: String,
    pub labels: std::collections::BTreeMap<String, String>,
    /// Its owner references: (apiVersion, kind, name).
    pub owners: Vec<(String, String, String)>,
}

/// A ClusterServiceVersion: its namespace, name and the Deployments its install strategy makes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterServiceVersion {
    pub namespace: String,
    pub name: String,
    pub deployments: Vec<String>,
}

/// Why the take-over does not start, and what to do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stop {
    pub reason: &'static str,
    pub message: String,
}

/// The CSV that manages the kubevirt operator, if one does: (namespace, name).
pub fn olm_manager(deployments: &[OperatorDeployment], csvs: &[ClusterServiceVersion]) -> Option<(String, String)> {
    for deployment in deployments {
        let labelled = deployment.labels.get(OLM_OWNER_KIND_LABEL).map(String::as_str) == Some(CSV_KIND);
        if labelled {
            let name = deployment.labels.get(OLM_OWNER_LABEL).cloned().unwrap_or_default();
            let namespace =
                deployment.labels.get(OLM_OWNER_NAMESPACE_LABEL).cloned().unwrap_or(deployment.namespace.clone());
            return Some((namespace, name));
        }
        let owner = deployment
            .owners
            .iter()
            .find(|(api_version, kind, _)| kind == CSV_KIND && api_version.split('/').next() == Some(OLM_GROUP));
        if let Some((_, _, name)) = owner {
            return Some((deployment.namespace.clone(), name.clone()));
        }
    }
    csvs.iter()
        .find(|csv| csv.deployments.iter().any(|d| d == KUBEVIRT_OPERATOR_DEPLOYMENT))
        .map(|csv| (csv.namespace.clone(), csv.name.clone()))
}

/// Whether the take-over of a resource must not start. `namespace`: this operator's;
/// `found`: the objects the resource owns (as [`super::takeover::plan`] reads them).
pub fn stop(
    namespace: &str,
    deployments: &[OperatorDeployment],
    csvs: &[ClusterServiceVersion],
    found: &[Found],
) -> Option<Stop> {
    if let Some((csv_namespace, csv)) = olm_manager(deployments, csvs) {
        return Some(Stop {
            reason: "KubevirtOperatorManagedByOLM",
            message: format!(
                "the kubevirt hostpath-provisioner operator is managed by OLM (ClusterServiceVersion {csv_namespace}/{csv}): OLM re-creates its Deployment, webhook and CRD when they are deleted, and the two operators would fight over this resource, so this operator changes nothing here; keep the kubevirt operator and remove this one (kubectl -n {namespace} delete deployment {KUBEVIRT_OPERATOR_DEPLOYMENT}), or uninstall the OLM operator that ships it (its Subscription and ClusterServiceVersion, which removes the kubevirt operator for good) and this operator then takes the resource over"
            ),
        });
    }
    let mut elsewhere: Vec<String> = found
        .iter()
        .filter(|o| !o.ours && o.kind == Kind::Deployment && o.owner_index.is_some() && o.namespace != namespace)
        .map(|o| format!("{}/{}", o.namespace, o.name))
        .collect();
    elsewhere.sort();
    if let Some(first) = elsewhere.first() {
        let other = first.split('/').next().unwrap_or_default().to_owned();
        return Some(Stop {
            reason: "KubevirtPoolsInAnotherNamespace",
            message: format!(
                "the kubevirt operator's pools on a claim are mounted by {} in namespace {other}, and a pod mounts only a claim of its own namespace: this operator must run in {other} to adopt those claims, so it changes nothing here; install it in {other} (docs/operator.md, \"Coming from the kubevirt operator\")",
                elsewhere.join(", ")
            ),
        });
    }
    None
}

/// The resource's conditions with [`TAKE_OVER_STOPPED`] saying `stop`, or `None` when they
/// already say it (nothing to write: a write would wake both operators again).
pub fn conditions_with_stop(
    conditions: &[Condition],
    stop: &Stop,
    generation: Option<i64>,
    now: &str,
) -> Option<Vec<Condition>> {
    let current = conditions.iter().find(|c| c.type_ == TAKE_OVER_STOPPED);
    if current.is_some_and(|c| c.status == "True" && c.reason == stop.reason && c.message == stop.message) {
        return None;
    }
    let mut updated: Vec<Condition> = conditions.iter().filter(|c| c.type_ != TAKE_OVER_STOPPED).cloned().collect();
    updated.push(Condition {
        type_: TAKE_OVER_STOPPED.to_owned(),
        status: "True".to_owned(),
        reason: stop.reason.to_owned(),
        message: stop.message.clone(),
        observed_generation: generation,
        last_transition_time: Some(now.to_owned()),
        last_heartbeat_time: Some(now.to_owned()),
    });
    Some(updated)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> std::collections::BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The Deployment as OLM makes it for OpenShift Virtualization's CSV: its labels and its
    /// owner reference, as operator-lifecycle-manager writes them.
    fn olm_deployment() -> OperatorDeployment {
        OperatorDeployment {
            namespace: "openshift-cnv".into(),
            labels: labels(&[
                (OLM_OWNER_LABEL, "kubevirt-hyperconverged-operator.v4.16.3"),
                (OLM_OWNER_NAMESPACE_LABEL, "openshift-cnv"),
                (OLM_OWNER_KIND_LABEL, CSV_KIND),
                ("olm.deployment-spec-hash", "5c9bd7f8c4"),
                ("name", "hostpath-provisioner-operator"),
            ]),
            owners: vec![(
                "operators.coreos.com/v1alpha1".into(),
                CSV_KIND.into(),
                "kubevirt-hyperconverged-operator.v4.16.3".into(),
            )],
        }
    }

    fn hco_csv() -> ClusterServiceVersion {
        ClusterServiceVersion {
            namespace: "openshift-cnv".into(),
            name: "kubevirt-hyperconverged-operator.v4.16.3".into(),
            deployments: vec!["hco-operator".into(), "cdi-operator".into(), KUBEVIRT_OPERATOR_DEPLOYMENT.into()],
        }
    }

    fn found(namespace: &str, kind: Kind, name: &str, ours: bool, owner_index: Option<usize>) -> Found {
        Found {
            kind,
            namespace: namespace.into(),
            name: name.into(),
            ours,
            owner_index,
            has_annotations: false,
            kept: false,
        }
    }

    /// Every way OLM shows: its labels alone, its owner reference alone (labels stripped by a
    /// user), both, or only the CSV (the Deployment deleted, about to be re-created); and the
    /// ways it does not: this operator's own Deployment, a plain kubevirt install, another
    /// operator's CSV, another kind of owner.
    #[test]
    fn olm_is_found_by_its_labels_its_owner_reference_or_a_csv_and_by_nothing_else() {
        let labels_only = OperatorDeployment { owners: vec![], ..olm_deployment() };
        let owner_only =
            OperatorDeployment { labels: labels(&[("name", "hostpath-provisioner-operator")]), ..olm_deployment() };
        let ours = OperatorDeployment {
            namespace: "hostpath-provisioner".into(),
            labels: labels(&[("app.kubernetes.io/name", "hostpath-provisioner-operator")]),
            owners: vec![],
        };
        let other_owner = OperatorDeployment {
            owners: vec![("apps/v1".into(), "ReplicaSet".into(), "x".into())],
            labels: labels(&[(OLM_OWNER_KIND_LABEL, "Subscription")]),
            ..ours.clone()
        };
        let other_csv = ClusterServiceVersion { deployments: vec!["cdi-operator".into()], ..hco_csv() };
        let expected = Some(("openshift-cnv".to_owned(), "kubevirt-hyperconverged-operator.v4.16.3".to_owned()));
        let cases: [(&str, Vec<OperatorDeployment>, Vec<ClusterServiceVersion>, bool); 8] = [
            ("labels and owner", vec![ours.clone(), olm_deployment()], vec![], true),
            ("labels only", vec![labels_only], vec![], true),
            ("owner reference only", vec![owner_only], vec![], true),
            ("only the CSV", vec![ours.clone()], vec![hco_csv()], true),
            ("this operator alone", vec![ours.clone()], vec![], false),
            ("nothing", vec![], vec![], false),
            ("another operator's CSV", vec![ours.clone()], vec![other_csv], false),
            ("other owners and labels", vec![other_owner], vec![], false),
        ];
        for (case, deployments, csvs, managed) in cases {
            let found = olm_manager(&deployments, &csvs);
            assert_eq!(found.is_some(), managed, "{case}: {found:?}");
            if managed {
                assert_eq!(found, expected, "{case}");
            }
            let stop = stop("hostpath-provisioner", &deployments, &csvs, &[]);
            assert_eq!(stop.as_ref().map(|s| s.reason), managed.then_some("KubevirtOperatorManagedByOLM"), "{case}");
        }
    }

    #[test]
    fn the_olm_message_names_the_csv_and_both_ways_out() {
        let stop = stop("hostpath-provisioner", &[olm_deployment()], &[], &[]).expect("stopped");
        assert!(stop.message.contains("ClusterServiceVersion openshift-cnv/kubevirt-hyperconverged-operator.v4.16.3"));
        assert!(
            stop.message.contains("kubectl -n hostpath-provisioner delete deployment hostpath-provisioner-operator")
        );
        assert!(stop.message.contains("Subscription and ClusterServiceVersion"));
    }

    /// Pool mounters the resource owns in another namespace stop the take-over; in this
    /// operator's namespace, or owned by nobody, or this operator's own, they do not.
    #[test]
    fn pools_on_a_claim_in_another_namespace_stop_the_take_over() {
        let elsewhere = [found("openshift-cnv", Kind::Deployment, "hpp-pool-local-node-1", false, Some(0))];
        let stop_here = stop("hostpath-provisioner", &[], &[], &elsewhere).expect("stopped");
        assert_eq!(stop_here.reason, "KubevirtPoolsInAnotherNamespace");
        assert!(stop_here.message.contains("openshift-cnv/hpp-pool-local-node-1"));
        assert!(stop_here.message.contains("install it in openshift-cnv"));
        assert_eq!(stop("openshift-cnv", &[], &[], &elsewhere), None, "run in that namespace");
        let not_stopping = [
            found("openshift-cnv", Kind::Deployment, "hpp-pool-local-node-1", false, None),
            found("openshift-cnv", Kind::DaemonSet, "hostpath-provisioner-csi", false, Some(0)),
            found("other", Kind::Deployment, "hpp-pool-local-node-1", true, Some(0)),
        ];
        assert_eq!(stop("hostpath-provisioner", &[], &[], &not_stopping), None);
    }

    #[test]
    fn the_condition_is_written_once_beside_the_kubevirt_operators_own() {
        let stop = stop("hostpath-provisioner", &[olm_deployment()], &[], &[]).expect("stopped");
        let theirs = Condition {
            type_: "Available".into(),
            status: "True".into(),
            reason: "Complete".into(),
            message: "Application Available".into(),
            observed_generation: None,
            last_transition_time: None,
            last_heartbeat_time: None,
        };
        let written = conditions_with_stop(std::slice::from_ref(&theirs), &stop, Some(3), "2026-01-01T00:00:00Z")
            .expect("a new condition");
        assert_eq!(written[0], theirs, "the kubevirt operator's condition kept as it was");
        assert_eq!(written[1].type_, TAKE_OVER_STOPPED);
        assert_eq!(written[1].observed_generation, Some(3));
        assert_eq!(conditions_with_stop(&written, &stop, Some(3), "2026-01-01T00:01:00Z"), None, "nothing new");
        let other = Stop { reason: "KubevirtPoolsInAnotherNamespace", message: "x".into() };
        let replaced = conditions_with_stop(&written, &other, Some(3), "t").expect("changed");
        assert_eq!(replaced.iter().filter(|c| c.type_ == TAKE_OVER_STOPPED).count(), 1);
    }
}
