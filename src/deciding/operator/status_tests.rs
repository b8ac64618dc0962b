use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use serde_json::{Value, json};

use super::*;
use crate::deciding::operator::render::{Environment, render};

const NOW: &str = "2026-11-25T18:00:00Z";
const LATER: &str = "2026-11-25T18:05:00Z";

fn resource(spec: Value) -> HostPathProvisioner {
    serde_json::from_value(json!({"metadata": {"name": "hpp", "uid": "u", "generation": 3}, "spec": spec}))
        .expect("resource")
}

fn environment() -> Environment {
    Environment {
        namespace: "ns".into(),
        image: "img".into(),
        openshift: false,
        prometheus: false,
        held_pools: Vec::new(),
        pool_roots: Vec::new(),
        image_pull_secrets: Vec::new(),
    }
}

fn observe(resource: &HostPathProvisioner, rollout: Option<Rollout>, now: &str) -> Status {
    let rendered = render(resource, &environment());
    status(&Observed {
        resource,
        rendered: &rendered,
        apply_failure: None,
        rollout,
        superseded_by: None,
        pools_on_claim: &[],
        held_back: &[],
        version: "0.1.0",
        now,
    })
}

fn find<'a>(status: &'a Status, type_: &str) -> &'a Condition {
    status.conditions.iter().find(|c| c.type_ == type_).unwrap_or_else(|| panic!("no {type_}"))
}

fn summary(status: &Status) -> Vec<(String, String, String)> {
    status.conditions.iter().map(|c| (c.type_.clone(), c.status.clone(), c.reason.clone())).collect()
}

fn rolled(desired: i32) -> Rollout {
    Rollout { desired, updated: desired, available: desired, current: true }
}

fn pools() -> Value {
    json!({"storagePools": [{"name": "fast", "path": "/mnt/ssd"}, {"name": "slow", "path": "/mnt/hdd"}]})
}

fn triple(t: &str, s: &str, r: &str) -> (String, String, String) {
    (t.into(), s.into(), r.into())
}

#[test]
fn a_complete_rollout_is_available_and_every_pool_ready() {
    let status = observe(&resource(pools()), Some(rolled(3)), NOW);
    assert_eq!(
        summary(&status),
        [
            triple("Available", "True", "AsExpected"),
            triple("Progressing", "False", "AsExpected"),
            triple("Degraded", "False", "AsExpected"),
            triple("NotActedUpon", "False", "AllFieldsActedUpon"),
        ]
    );
    assert!(status.conditions.iter().all(|c| c.observed_generation == Some(3)));
    assert_eq!(status.observed_version.as_deref(), Some("0.1.0"));
    assert_eq!(status.target_version.as_deref(), Some("0.1.0"));
    let pools: Vec<_> = status
        .storage_pool_statuses
        .iter()
        .map(|p| (p.name.as_str(), p.phase.as_str(), p.desired_ready, p.current_ready))
        .collect();
    assert_eq!(pools, [("fast", "Ready", 3, 3), ("slow", "Ready", 3, 3)]);
}

#[test]
fn a_rollout_in_progress_is_progressing_and_pools_mounting() {
    let rollout = Rollout { desired: 3, updated: 1, available: 2, current: true };
    let status = observe(&resource(pools()), Some(rollout), NOW);
    assert_eq!(find(&status, "Available").reason, "NodesNotReady");
    assert_eq!(find(&status, "Progressing").status, "True");
    assert!(find(&status, "Progressing").message.contains("1 of 3 nodes run the current pod template"));
    assert_eq!(status.observed_version, None, "not observed before the rollout completes");
    assert_eq!(status.storage_pool_statuses[0].phase, "Mounting");
    assert_eq!(status.storage_pool_statuses[0].current_ready, 2);
    // A template the DaemonSet controller has not seen yet is a rollout too.
    let unseen = Rollout { current: false, ..rolled(3) };
    assert_eq!(find(&observe(&resource(pools()), Some(unseen), NOW), "Progressing").status, "True");
}

#[test]
fn no_selected_node_is_not_available_and_says_why() {
    let status = observe(&resource(pools()), Some(rolled(0)), NOW);
    let available = find(&status, "Available");
    assert_eq!((available.status.as_str(), available.reason.as_str()), ("False", "NoNodeSelected"));
    assert!(available.message.contains("spec.workload selects no node"));
    // Before the DaemonSet controller has counted the nodes, zero means nothing yet.
    let unseen = Rollout { current: false, ..rolled(0) };
    assert_eq!(find(&observe(&resource(pools()), Some(unseen), NOW), "Available").reason, "Deploying");
}

#[test]
fn a_problem_is_degraded_with_its_reason_and_the_pool_stays_preparing() {
    let spec = json!({"storagePools": [
        {"name": "fast", "path": "/mnt/ssd"},
        {"name": "blocky", "path": "/mnt/b", "pvcTemplate": {"volumeMode": "Block"}},
    ]});
    let status = observe(&resource(spec), Some(rolled(2)), NOW);
    let degraded = find(&status, "Degraded");
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "BlockPoolNotSupported"));
    assert!(degraded.message.contains("\"blocky\""));
    let phases: Vec<_> = status.storage_pool_statuses.iter().map(|p| (p.name.as_str(), p.phase.as_str())).collect();
    assert_eq!(phases, [("fast", "Ready"), ("blocky", "Preparing")]);
}

#[test]
fn an_apply_failure_comes_first_in_degraded() {
    let resource = resource(pools());
    let rendered = render(&resource, &environment());
    let status = status(&Observed {
        resource: &resource,
        rendered: &rendered,
        apply_failure: Some("DaemonSet kubevirt-hostpath-provisioner: forbidden".into()),
        rollout: Some(rolled(1)),
        superseded_by: None,
        pools_on_claim: &[],
        held_back: &[],
        version: "0.1.0",
        now: NOW,
    });
    assert_eq!(find(&status, "Degraded").reason, "ApplyFailed");
    assert_eq!(status.observed_version, None, "an object that failed to apply is not observed");
}

#[test]
fn csi_only_fields_are_reported_as_not_acted_upon() {
    let spec = json!({"featureGates": ["Snapshotting"], "storagePools": [
        {"name": "a", "path": "/a", "snapshotProvider": "reflink", "overlayClassName": "overlay"}
    ]});
    let status = observe(&resource(spec), Some(rolled(1)), NOW);
    let ignored = find(&status, "NotActedUpon");
    assert_eq!(ignored.status, "True");
    for field in [
        "spec.featureGates (Snapshotting)",
        "spec.storagePools[0].snapshotProvider",
        "spec.storagePools[0].overlayClassName",
    ] {
        assert!(ignored.message.contains(field), "{field} missing from {}", ignored.message);
    }
    assert_eq!(find(&status, "Degraded").status, "False", "accepted fields are not a fault");
}

#[test]
fn an_unchanged_cluster_gives_an_unchanged_status() {
    let mut resource = resource(pools());
    let first = observe(&resource, Some(rolled(2)), NOW);
    resource.status = Some(first.clone());
    let again = observe(&resource, Some(rolled(2)), LATER);
    assert_eq!(first, again, "no write, so no wake-up loop");
    // A change moves only the conditions that changed.
    let rollout = Rollout { available: 1, ..rolled(2) };
    let changed = observe(&resource, Some(rollout), LATER);
    assert_eq!(find(&changed, "Available").last_transition_time.as_deref(), Some(LATER));
    assert_eq!(find(&changed, "Degraded").last_transition_time.as_deref(), Some(NOW));
    assert_eq!(changed.observed_version.as_deref(), Some("0.1.0"), "the version once observed stays");
}

#[test]
fn the_oldest_resource_acts_and_the_others_are_superseded() {
    let at = |name: &str, second: i64, deleting: bool| {
        let mut r = resource(pools());
        r.metadata.name = Some(name.into());
        r.metadata.creation_timestamp = Some(Time(jiff::Timestamp::from_second(second).expect("time")));
        if deleting {
            r.metadata.deletion_timestamp = Some(Time(jiff::Timestamp::from_second(second + 1).expect("time")));
        }
        r
    };
    assert_eq!(acting_resource(&[at("young", 20, false), at("old", 10, false)]).as_deref(), Some("old"));
    assert_eq!(acting_resource(&[at("b", 10, false), at("a", 10, false)]).as_deref(), Some("a"));
    assert_eq!(acting_resource(&[at("young", 20, false), at("old", 10, true)]).as_deref(), Some("young"));
    assert_eq!(acting_resource(&[]), None);
    let young = at("young", 20, false);
    let rendered = render(&young, &environment());
    let status = status(&Observed {
        resource: &young,
        rendered: &rendered,
        apply_failure: None,
        rollout: None,
        superseded_by: Some("old".into()),
        pools_on_claim: &[],
        held_back: &[],
        version: "0.1.0",
        now: NOW,
    });
    assert_eq!(find(&status, "Degraded").reason, "Superseded");
    assert!(find(&status, "Available").message.contains("delete this one or merge its pools into \"old\""));
    assert!(status.storage_pool_statuses.iter().all(|p| p.phase == "Preparing"));
}

#[test]
fn a_pool_on_a_claim_prepares_mounts_and_is_ready_by_its_mounters() {
    let resource = resource(json!({"storagePools": [
        {"name": "big", "path": "/mnt/big", "pvcTemplate": {"resources": {"requests": {"storage": "1Gi"}}}},
    ]}));
    let rendered = render(&resource, &environment());
    let phase = |state: PoolOnClaimState, held_back: &[String]| {
        let status = status(&Observed {
            resource: &resource,
            rendered: &rendered,
            apply_failure: None,
            rollout: Some(rolled(2)),
            superseded_by: None,
            pools_on_claim: &[state],
            held_back,
            version: "0.1.0",
            now: NOW,
        });
        let pool = status.storage_pool_statuses[0].clone();
        (pool.phase, pool.desired_ready, pool.current_ready, find(&status, "Degraded").clone())
    };
    let state = |ready, claims_made| PoolOnClaimState {
        name: "big".into(),
        desired: 2,
        ready,
        claims_made,
        claim_statuses: Vec::new(),
    };
    assert_eq!(phase(state(0, false), &[]).0, "Preparing");
    assert_eq!(phase(state(1, true), &[]).0, "Mounting");
    let (ready, desired, current, degraded) = phase(state(2, true), &[]);
    assert_eq!((ready.as_str(), desired, current, degraded.status.as_str()), ("Ready", 2, 2, "False"));
    let held = ["storage pool \"old\" ... pvc-1".to_owned()];
    let degraded = phase(state(2, true), &held).3;
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "PoolHeldBack"));
    assert!(degraded.message.contains("pvc-1"), "{}", degraded.message);
}

fn with_observed_version(observed: Option<&str>) -> HostPathProvisioner {
    let mut resource = resource(pools());
    resource.status = Some(Status {
        conditions: observe(&resource, Some(rolled(2)), NOW).conditions,
        operator_version: observed.map(str::to_owned),
        target_version: observed.map(str::to_owned),
        observed_version: observed.map(str::to_owned),
        ..Default::default()
    });
    resource
}

#[test]
fn releases_of_this_project_order_by_semantic_versioning() {
    use std::cmp::Ordering::*;
    for (a, b, order) in [
        ("0.2.0", "0.1.0", Greater),
        ("0.1.0", "0.1.0", Equal),
        ("0.10.0", "0.9.9", Greater),
        ("1.0.0", "0.99.99", Greater),
        ("0.2.0-rc.1", "0.2.0", Less),
        ("0.2.0-rc.2", "0.2.0-rc.10", Less),
        ("0.2.0-rc.1", "0.2.0-beta.1", Greater),
        ("0.2.0-alpha", "0.2.0-alpha.1", Less),
        ("0.2.0-1", "0.2.0-alpha", Less),
        ("0.2.0+abc", "0.2.0", Equal),
        ("0.2.0-rc-1", "0.1.0", Greater),
    ] {
        assert_eq!(release_precedence(a, b), Some(order), "{a} against {b}");
    }
    // Not one of ours: the kubevirt operator's tags, `latest`, malformed.
    for other in ["v0.20.0", "latest", "", "0.2", "0.2.0.1", "01.2.0", "0.2.x", "0.2.0-", "0.2.0-rc..1"] {
        assert_eq!(release_precedence(other, "0.1.0"), None, "{other:?}");
        assert_eq!(release_precedence("0.1.0", other), None, "{other:?}");
    }
}

#[test]
fn an_observed_version_above_ours_is_refused_and_ours_or_older_is_acted_upon() {
    let newer = newer_version_observed(&with_observed_version(Some("0.3.0")), "0.2.0");
    assert_eq!(newer, Some(NewerVersion { observed: "0.3.0".into(), own: "0.2.0".into() }));
    for acted_upon in [None, Some("0.2.0"), Some("0.1.0"), Some("0.2.0-rc.1"), Some("0.2.0+other-build")] {
        assert_eq!(newer_version_observed(&with_observed_version(acted_upon), "0.2.0"), None, "{acted_upon:?}");
    }
    // An upgrade to 0.3.0 that never completed (observedVersion still older): the rollback
    // is meant to undo it.
    let mut unfinished = with_observed_version(Some("0.2.0"));
    unfinished.status.as_mut().expect("status").target_version = Some("0.3.0".into());
    assert_eq!(newer_version_observed(&unfinished, "0.2.0"), None);
    // A pre-release operator refuses its own release, which comes after it.
    assert!(newer_version_observed(&with_observed_version(Some("0.2.0")), "0.2.0-rc.1").is_some());
}

#[test]
fn the_kubevirt_operators_version_left_by_a_take_over_never_blocks_the_move() {
    // After a take-over observedVersion holds the kubevirt operator's release until our first
    // rollout completes; its numbers (v0.20.0) are above ours but of another project.
    for theirs in ["v0.20.0", "v1.0.0", "latest", "v0.0.1"] {
        assert_eq!(newer_version_observed(&with_observed_version(Some(theirs)), "0.1.0"), None, "{theirs}");
    }
    // A build of the kubevirt operator that writes its version without the `v`: still its own
    // while it carries its finalizer, and once taken over our first status write names us
    // in targetVersion.
    let mut theirs = with_observed_version(Some("4.14.0"));
    theirs.metadata.finalizers = Some(vec![KUBEVIRT_FINALIZER.into(), "other".into()]);
    assert_eq!(newer_version_observed(&theirs, "0.1.0"), None, "the kubevirt operator's resource");
    theirs.metadata.finalizers = None;
    theirs.status.as_mut().expect("status").target_version = Some("0.1.0".into());
    assert_eq!(newer_version_observed(&theirs, "0.1.0"), None, "taken over, our rollout not complete yet");
    let mut resource = with_observed_version(Some("v0.20.0"));
    resource.status.as_mut().expect("status").operator_version = Some("0.1.0".into());
    let rendered = render(&resource, &environment());
    let status = status(&Observed {
        resource: &resource,
        rendered: &rendered,
        apply_failure: None,
        rollout: Some(rolled(2)),
        superseded_by: None,
        pools_on_claim: &[],
        held_back: &[],
        version: "0.1.0",
        now: NOW,
    });
    assert_eq!(status.observed_version.as_deref(), Some("0.1.0"), "the completed rollout records ours");
}

#[test]
fn a_refused_resource_says_why_in_degraded_and_keeps_what_the_newer_operator_wrote() {
    let resource = with_observed_version(Some("0.3.0"));
    let before = resource.status.clone().expect("status");
    let newer = newer_version_observed(&resource, "0.2.0").expect("refused");
    let refused = refused_status(&resource, &newer, LATER);
    let degraded = find(&refused, DEGRADED);
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", NEWER_VERSION_OBSERVED));
    for words in
        ["0.3.0", "0.2.0", "newer operator", "kubectl patch hostpathprovisioner hpp --subresource=status --type merge"]
    {
        assert!(degraded.message.contains(words), "{words}: {}", degraded.message);
    }
    assert_eq!(degraded.last_transition_time.as_deref(), Some(LATER));
    assert_eq!(refused.observed_version.as_deref(), Some("0.3.0"), "never lowered");
    assert_eq!(refused.target_version.as_deref(), Some("0.3.0"));
    assert_eq!(refused.operator_version.as_deref(), Some("0.2.0"), "which operator runs");
    let types: Vec<&str> = refused.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(types, [AVAILABLE, PROGRESSING, DEGRADED, NOT_ACTED_UPON], "in place");
    for kept in [AVAILABLE, PROGRESSING, NOT_ACTED_UPON] {
        assert_eq!(find(&refused, kept), find(&before, kept), "{kept} as the newer operator left it");
    }
    // Unchanged facts, unchanged status: nothing is written again.
    let mut again = resource.clone();
    again.status = Some(refused.clone());
    assert_eq!(refused_status(&again, &newer, "2026-11-25T19:00:00Z"), refused);
}

/// A pool listed once per disk is one pool: one status, served and counted once.
#[test]
fn a_pool_over_several_disks_has_one_status() {
    let resource = resource(json!({"storagePools": [
        {"name": "data", "path": "/mnt/disk1"}, {"name": "fast", "path": "/mnt/ssd"}, {"name": "data", "path": "/mnt/disk2"}
    ]}));
    let status = observe(&resource, Some(rolled(2)), NOW);
    let names: Vec<_> = status.storage_pool_statuses.iter().map(|p| p.name.as_str()).collect();
    assert_eq!(names, ["data", "fast"]);
    assert!(status.storage_pool_statuses.iter().all(|p| p.phase == "Ready"), "{:?}", status.storage_pool_statuses);
}
