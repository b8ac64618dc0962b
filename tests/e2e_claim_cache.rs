//! End-to-end: each node keeps in memory only the claims it may act on (bound claims and other
//! provisioners' claims are forgotten as their events pass), and a forgotten claim is acted on
//! again as soon as a field the decision reads changes: the scheduler selecting this node, a
//! larger request on a bound claim.

mod common;

use common::*;
use kube::api::{Patch, PatchParams};
use testbed::fixtures;

const CACHED_CLAIMS: &str = r#"hostpath_provisioner_cached_objects{watch="claims"}"#;
const RECORDED_ELSEWHERE: &str = r#"hostpath_provisioner_cached_objects{watch="claims-placed-elsewhere"}"#;

fn sample(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// Waits until the node's claim cache holds exactly `expected` claims (the gauge is refreshed
/// every 15 s).
async fn wait_cached_claims(env: &TestEnv, expected: f64) {
    wait_gauge(env, CACHED_CLAIMS, expected).await;
}

async fn wait_gauge(env: &TestEnv, series: &str, expected: f64) {
    let provisioner = &env.nodes[0].provisioner;
    testbed::wait_for(&format!("{series} = {expected}"), TIMEOUT, || async {
        let metrics = provisioner.metrics().await?;
        anyhow::Ok((sample(&metrics, series) == Some(expected)).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
}

async fn patch_claim(env: &TestEnv, name: &str, patch: serde_json::Value) {
    env.claims().patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch claim");
}

#[tokio::test(flavor = "multi_thread")]
async fn forgotten_claims_are_acted_on_again_when_what_the_decision_reads_changes() {
    let env = TestEnv::start("claimcache", 1).await;
    let node = env.nodes[0].name.clone();
    let ours = env.class("grow", |c| c.allow_expansion()).await;
    let foreign = format!("{}-foreign", env.group);
    let class = fixtures::storage_class(&foreign, "example.org/not-ours").build();
    kube::Api::<k8s_openapi::api::storage::v1::StorageClass>::all(env.client.clone())
        .create(&Default::default(), &class)
        .await
        .expect("foreign class");

    // Ten bound claims of ours, ten claims of another provisioner, two of ours no pod uses yet.
    for i in 0..10 {
        env.create_claim(fixtures::claim(&env.ns, &format!("bound-{i}"), &ours, "1Mi").provision_on_node(&node)).await;
        env.create_claim(fixtures::claim(&env.ns, &format!("foreign-{i}"), &foreign, "1Mi")).await;
    }
    for i in 0..10 {
        env.wait_bound(&format!("bound-{i}")).await;
    }
    let waiting = env.create_claim(fixtures::claim(&env.ns, "waiting", &ours, "1Mi")).await;
    // An Immediate claim of ours naming no node stays pending: every node keeps it (to explain it).
    let immediate = env.class("imm", |c| c.immediate()).await;
    env.create_claim(fixtures::claim(&env.ns, "unplaced", &immediate, "1Mi")).await;
    // Two placed on other nodes (by the annotation, by the scheduler) are recorded compactly, not
    // cached.
    env.create_claim(fixtures::claim(&env.ns, "pinned-elsewhere", &ours, "1Mi").provision_on_node("another-node"))
        .await;
    // (The PV controller hands a claim the scheduler placed to our provisioner; only then is it ours.)
    env.create_claim(
        fixtures::claim(&env.ns, "selected-elsewhere", &ours, "1Mi")
            .annotation("volume.kubernetes.io/selected-node", "another-node"),
    )
    .await;
    // Only the unplaced one is kept: the bound ones are done, the others are not this node's (yet).
    wait_gauge(&env, RECORDED_ELSEWHERE, 2.0).await;
    wait_cached_claims(&env, 1.0).await;
    env.delete_claim("unplaced").await;
    env.delete_claim("pinned-elsewhere").await;
    // The scheduler places the other one here: it leaves the record and is provisioned.
    patch_claim(
        &env,
        "selected-elsewhere",
        serde_json::json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": node}}}),
    )
    .await;
    env.wait_bound("selected-elsewhere").await;
    wait_gauge(&env, RECORDED_ELSEWHERE, 0.0).await;

    // The scheduler selects this node for the waiting claim: provisioned at once.
    patch_claim(
        &env,
        "waiting",
        serde_json::json!({"metadata": {"annotations": {
            "volume.kubernetes.io/selected-node": node,
        }}}),
    )
    .await;
    let pv = env.wait_bound("waiting").await;
    assert_eq!(pv.metadata.name.as_deref(), Some(format!("pvc-{}", uid(&waiting)).as_str()));

    // A forgotten bound claim asks for more: its volume grows, and the claim shows it.
    patch_claim(&env, "bound-3", serde_json::json!({"spec": {"resources": {"requests": {"storage": "2Mi"}}}})).await;
    let claims = env.claims();
    testbed::wait_for("bound-3 expanded to 2Mi", TIMEOUT, || async {
        let claim = claims.get("bound-3").await?;
        let capacity = claim.status.and_then(|s| s.capacity).and_then(|c| c.get("storage").cloned());
        anyhow::Ok((capacity.map(|q| q.0) == Some("2Mi".to_owned())).then_some(()))
    })
    .await
    .unwrap_or_else(|e| panic!("{e:#}\n{}", env.log_tails()));
    // Done, and the unplaced claim is gone: the cache is empty.
    wait_cached_claims(&env, 0.0).await;
}
