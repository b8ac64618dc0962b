//! The limit to compare against: a minimal provisioner inside the bench. It watches claims and
//! creates the PV for each claim of its own class, nothing else (no directory, no event, no
//! retry beyond the next watch event), so its rate is what the control plane of this machine
//! lets any provisioner reach in the same scenario. Ours is reported as a fraction of it.
//!
//! Its class names a provisioner of its own, so the real provisioners ignore its claims (they
//! still receive them on their watches, as they would in a real cluster). Its PVs keep the
//! `Retain` policy so that nothing else acts on them; the bench deletes them itself after the
//! claims ([`delete_volumes`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};

use anyhow::Result;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm, ObjectReference, PersistentVolume,
    PersistentVolumeClaim, PersistentVolumeSpec, VolumeNodeAffinity,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt, watcher::Config};
use kube::{Client, ResourceExt};
use tokio::task::JoinHandle;

use testbed::fixtures::HOSTNAME_LABEL;
use testbed::fixtures::annotations::PROVISIONED_BY;

use super::setup::Env;

pub const REFERENCE_CLASS: &str = "bench-reference";
pub const REFERENCE_PROVISIONER: &str = "hpp-bench.example/reference";
/// Label on every PV the reference creates, for [`delete_volumes`].
const REFERENCE_LABEL: &str = "hpp-bench.example/reference";
const PROVISION_ON_NODE: &str = "kubevirt.io/provisionOnNode";
/// PV creations in flight at once: enough that the reference is never waiting on itself.
const CONCURRENT_CREATES: usize = 64;

/// The running reference provisioner; stops when dropped.
pub struct Reference {
    task: JoinHandle<()>,
    errors: Arc<Mutex<Vec<String>>>,
}

impl Drop for Reference {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Reference {
    /// Starts watching all claims with `client` (admin).
    pub fn start(client: Client) -> Reference {
        let errors = Arc::new(Mutex::new(Vec::new()));
        let done = Arc::new(Mutex::new(HashSet::new()));
        let volumes: Api<PersistentVolume> = Api::all(client.clone());
        let claims = watcher::watcher(Api::<PersistentVolumeClaim>::all(client), Config::default())
            .default_backoff()
            .applied_objects();
        let task_errors = errors.clone();
        let task = tokio::spawn(claims.for_each_concurrent(CONCURRENT_CREATES, move |claim| {
            let (volumes, errors, done) = (volumes.clone(), task_errors.clone(), done.clone());
            async move {
                let claim = match claim {
                    Ok(claim) => claim,
                    Err(err) => return errors.lock().expect("reference errors").push(format!("watch: {err}")),
                };
                let Some(volume) = volume_for(&claim) else { return };
                // Each later event of the claim (annotated, bound) would ask again.
                if !done.lock().expect("reference claims").insert(volume.name_any()) {
                    return;
                }
                if let Err(err) = volumes.create(&PostParams::default(), &volume).await {
                    errors.lock().expect("reference errors").push(format!("creating {}: {err}", volume.name_any()));
                }
            }
        }));
        Reference { task, errors }
    }

    /// Failed PV creations and watch errors so far.
    pub fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("reference errors").clone()
    }
}

/// The PV the reference creates for `claim`, or `None` when the claim is not one it provisions:
/// another class, already bound, being deleted, or not pinned to a node.
pub fn volume_for(claim: &PersistentVolumeClaim) -> Option<PersistentVolume> {
    let spec = claim.spec.as_ref()?;
    if spec.storage_class_name.as_deref() != Some(REFERENCE_CLASS)
        || spec.volume_name.as_deref().is_some_and(|v| !v.is_empty())
        || claim.metadata.deletion_timestamp.is_some()
    {
        return None;
    }
    let node = claim.annotations().get(PROVISION_ON_NODE)?.clone();
    let uid = claim.metadata.uid.clone()?;
    let name = format!("pvc-{uid}");
    let capacity = spec.resources.as_ref()?.requests.as_ref()?.get("storage")?.clone();
    Some(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(REFERENCE_LABEL.to_string(), "true".to_string())])),
            annotations: Some(BTreeMap::from([
                (PROVISIONED_BY.to_string(), REFERENCE_PROVISIONER.to_string()),
                (PROVISION_ON_NODE.to_string(), node.clone()),
            ])),
            ..ObjectMeta::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), capacity)])),
            access_modes: spec.access_modes.clone(),
            volume_mode: spec.volume_mode.clone(),
            storage_class_name: Some(REFERENCE_CLASS.to_string()),
            persistent_volume_reclaim_policy: Some("Retain".to_string()),
            host_path: Some(HostPathVolumeSource { path: format!("/var/hpvolumes/{name}"), type_: None }),
            claim_ref: Some(ObjectReference {
                api_version: Some("v1".to_string()),
                kind: Some("PersistentVolumeClaim".to_string()),
                namespace: claim.metadata.namespace.clone(),
                name: claim.metadata.name.clone(),
                uid: Some(uid),
                ..ObjectReference::default()
            }),
            node_affinity: Some(VolumeNodeAffinity {
                required: Some(NodeSelector {
                    node_selector_terms: vec![NodeSelectorTerm {
                        match_expressions: Some(vec![NodeSelectorRequirement {
                            key: HOSTNAME_LABEL.to_string(),
                            operator: "In".to_string(),
                            values: Some(vec![node]),
                        }]),
                        ..NodeSelectorTerm::default()
                    }],
                }),
            }),
            ..PersistentVolumeSpec::default()
        }),
        ..PersistentVolume::default()
    })
}

/// Deletes every PV the reference created (one deletecollection); the bench's watch then sees
/// them go.
pub async fn delete_volumes(env: &Env) -> Result<()> {
    let volumes: Api<PersistentVolume> = Api::all(env.client.clone());
    volumes
        .delete_collection(&DeleteParams::default(), &ListParams::default().labels(&format!("{REFERENCE_LABEL}=true")))
        .await?;
    env.calls.add("deletecollection", "persistentvolumes");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use testbed::fixtures;

    fn claim(class: &str) -> PersistentVolumeClaim {
        let mut claim = fixtures::claim("ns", "data", class, "1Gi").provision_on_node("node-2").build();
        claim.metadata.uid = Some("u-1".into());
        claim
    }

    #[test]
    fn provisions_a_pinned_claim_of_its_class_bound_to_it_on_its_node() {
        let pv = volume_for(&claim(REFERENCE_CLASS)).expect("a PV for its own class");
        assert_eq!(pv.name_any(), "pvc-u-1");
        let spec = pv.spec.unwrap();
        let claim_ref = spec.claim_ref.unwrap();
        assert_eq!((claim_ref.namespace.as_deref(), claim_ref.name.as_deref()), (Some("ns"), Some("data")));
        assert_eq!(claim_ref.uid.as_deref(), Some("u-1"));
        assert_eq!(spec.capacity.unwrap()["storage"].0, "1Gi");
        let term = &spec.node_affinity.unwrap().required.unwrap().node_selector_terms[0];
        assert_eq!(term.match_expressions.as_ref().unwrap()[0].values, Some(vec!["node-2".to_string()]));
        assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    }

    #[test]
    fn leaves_other_classes_bound_claims_and_unpinned_claims_alone() {
        assert!(volume_for(&claim("bench-immediate")).is_none());
        let mut bound = claim(REFERENCE_CLASS);
        bound.spec.as_mut().unwrap().volume_name = Some("pv-x".into());
        assert!(volume_for(&bound).is_none());
        let mut unpinned = claim(REFERENCE_CLASS);
        unpinned.metadata.annotations.as_mut().unwrap().remove(PROVISION_ON_NODE);
        assert!(volume_for(&unpinned).is_none());
    }
}
