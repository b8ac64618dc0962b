//! `spec.releaseClaimsOfRemovedNodes`: the operator, under deploy/operator/rbac.yaml alone, makes
//! the claim releaser (its own ServiceAccount bound to the only `delete` on claims; the node pods'
//! never is), reports a zero duration without touching what runs, and removes the releaser when
//! the field goes.

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authorization::v1::SubjectAccessReview;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use super::*;

const RELEASER: &str = "kubevirt-hostpath-provisioner-claim-releaser";
const NODE_ACCOUNT: &str = "kubevirt-hostpath-provisioner-admin";

/// Whether ServiceAccount `account` of the operator's namespace may delete claims.
async fn may_delete_claims(env: &TestEnv, account: &str) -> bool {
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": format!("system:serviceaccount:{OPERATOR_NAMESPACE}:{account}"),
            "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{OPERATOR_NAMESPACE}")],
            "resourceAttributes": {"verb": "delete", "resource": "persistentvolumeclaims", "namespace": env.ns},
        }
    }))
    .expect("review");
    let answer = Api::<SubjectAccessReview>::all(env.client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SubjectAccessReview");
    answer.status.is_some_and(|s| s.allowed)
}

pub async fn is_made_with_its_own_rights_and_removed_with_the_field(env: &TestEnv, name: &str) {
    let deployments: Api<Deployment> = Api::namespaced(env.client.clone(), OPERATOR_NAMESPACE);
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let set = |value: serde_json::Value| {
        let patch = json!({"spec": {"releaseClaimsOfRemovedNodes": value}});
        async move { resources(env).patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await }
    };
    assert!(!may_delete_claims(env, NODE_ACCOUNT).await, "the node pods may not delete claims");

    set(json!("24h")).await.expect("turn the releaser on");
    let deployment = wait_present(&deployments, RELEASER, true).await;
    let pod = deployment.spec.expect("spec").template.spec.expect("pod spec");
    assert_eq!(pod.service_account_name.as_deref(), Some(RELEASER));
    let container = &pod.containers[0];
    assert_eq!(container.args.as_deref(), Some(&["release-claims-of-removed-nodes".to_owned()][..]));
    let grace = container.env.iter().flatten().find(|e| e.name == "RELEASE_CLAIMS_OF_REMOVED_NODES");
    assert_eq!(grace.and_then(|e| e.value.as_deref()), Some("24h"));
    assert!(may_delete_claims(env, RELEASER).await, "the releaser may");
    assert!(!may_delete_claims(env, NODE_ACCOUNT).await, "the node pods still may not");

    // A zero duration passes the schema's pattern but not the operator: reported, and the
    // releaser left as it was.
    set(json!("0s")).await.expect("a zero duration");
    wait_resource(env, name, "Degraded InvalidReleaseClaimsOfRemovedNodes", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] == "InvalidReleaseClaimsOfRemovedNodes")
    })
    .await;
    assert!(deployments.get_opt(RELEASER).await.expect("read").is_some(), "what runs is left as it was");

    // The field gone: the releaser and its rights go.
    set(serde_json::Value::Null).await.expect("turn the releaser off");
    wait_present(&deployments, RELEASER, false).await;
    wait_present(&roles, RELEASER, false).await;
    testbed::wait_for("the releaser's rights gone", WAIT, || async {
        anyhow::Ok((!may_delete_claims(env, RELEASER).await).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}"));
    wait_resource(env, name, "Degraded no longer InvalidReleaseClaimsOfRemovedNodes", |r| {
        condition(r, "Degraded").is_some_and(|c| c["reason"] != "InvalidReleaseClaimsOfRemovedNodes")
    })
    .await;
}
