//! `claim_decision::claim_interest` and `decide_claim` on claims and classes built from fuzz
//! input: a plan is always a safe, deletable directory in a configured pool, and stage 1 never
//! drops a claim that stage 2 would provision.
#![no_main]

use hostpath_provisioner::deciding::capacity::parse_bytes;
use hostpath_provisioner::deciding::claim::{self as claim_decision, Decision, Interest, ProvisionPlan};
use hostpath_provisioner::deciding::class::{BindingMode, claim_class_name};
use hostpath_provisioner::deciding::layout::{self, AcceptedPath};
use hostpath_provisioner::deciding::settings::{DecisionConfig, ProvisionOnNodePolicy};
use hostpath_provisioner::filesystem::VolumeDirName;
use hostpath_provisioner::keys;
use hostpath_provisioner_fuzz::{ClaimInput, NODE, PROVISIONER, me, model_is_dns_subdomain, model_is_uid};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use libfuzzer_sys::fuzz_target;

fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn check_plan(claim: &PersistentVolumeClaim, class: &StorageClass, config: &DecisionConfig, plan: &ProvisionPlan) {
    let spec = claim.spec.as_ref().expect("generated claims have a spec");
    assert!(claim.metadata.deletion_timestamp.is_none(), "provisioning a claim being deleted");
    assert!(spec.volume_name.as_deref().unwrap_or_default().is_empty(), "provisioning a bound claim");
    assert!(annotation(claim, keys::BIND_COMPLETED).is_none(), "provisioning a claim marked bind-completed");
    assert_eq!(class.provisioner, PROVISIONER, "provisioning for another provisioner's class");

    // Names: pvc-<uid>, and a single-component directory the deletion rules recognise.
    let uid = claim.metadata.uid.as_deref().unwrap_or_default();
    assert!(model_is_uid(uid), "provisioning a claim with UID {uid:?}");
    assert_eq!(plan.pv_name, layout::pv_name(uid));
    assert!(VolumeDirName::new(&plan.dir_name).is_ok(), "plan dir {:?} is not a VolumeDirName", plan.dir_name);
    assert!(layout::matches_layout(&plan.dir_name, &plan.pv_name), "plan dir {:?} is not deletable", plan.dir_name);
    if config.use_naming_prefix {
        let name = claim.metadata.name.as_deref().unwrap_or_default();
        assert!(model_is_dns_subdomain(name), "claim name {name:?} reached a path");
    } else {
        assert_eq!(plan.dir_name, plan.pv_name);
    }

    // The pool: configured, and the one the class asked for.
    assert!(config.pools.contains(&plan.pool), "plan pool {:?} is not configured", plan.pool);
    let params = class.parameters.clone().unwrap_or_default();
    assert!(params.keys().all(|k| k == "storagePool"), "unknown class parameter accepted: {params:?}");
    match params.get("storagePool") {
        Some(wanted) => assert_eq!(&plan.pool.name, wanted),
        None => assert_eq!(plan.pool, config.pools[0]),
    }
    // Whatever we write, we can delete.
    let path = plan.pool.root.join(&plan.dir_name);
    let accepted = layout::accept_delete_path(path.to_str().expect("UTF-8"), &plan.pv_name, &config.pools);
    assert_eq!(
        accepted,
        Ok(AcceptedPath {
            pool: plan.pool.name.clone(),
            root: plan.pool.root.clone(),
            dir_name: plan.dir_name.clone(),
            marked: false
        })
    );

    // The claim's shape is one we support (Block volumes are off in this configuration).
    assert_ne!(spec.volume_mode.as_deref(), Some("Block"));
    assert!(spec.selector.is_none());
    // A data source is accepted only as a clone of a claim, and the plan says which.
    let source = spec.data_source_ref.as_ref().map(|r| &r.name).or(spec.data_source.as_ref().map(|s| &s.name));
    assert_eq!(plan.clone_of.as_ref(), source);
    assert!(!plan.access_modes.is_empty());
    assert!(plan.access_modes.iter().all(|m| plan.topology.access_modes().contains(&m.as_str())));
    assert_eq!(parse_bytes(&plan.request), Ok(plan.request_bytes));

    // Placement: pinned to this node by annotation (and allowed), or selected for this node.
    let namespace = claim.metadata.namespace.clone().unwrap_or_default();
    match annotation(claim, keys::PROVISION_ON_NODE) {
        Some(node) => {
            assert_eq!(node, NODE);
            assert!(plan.pinned_by_annotation);
            let allowed = match &config.provision_on_node {
                ProvisionOnNodePolicy::Allow => true,
                ProvisionOnNodePolicy::Deny => false,
                ProvisionOnNodePolicy::Namespaces(list) => list.contains(&namespace),
            };
            assert!(allowed, "provisionOnNode used in namespace {namespace:?} against the policy");
        }
        None => {
            // Selected for this node by the scheduler: the class (ours, WaitForFirstConsumer)
            // is enough; the PV controller's storage-provisioner annotation is not waited for.
            assert!(!plan.pinned_by_annotation);
            assert_eq!(class.provisioner, PROVISIONER);
            assert_eq!(plan.binding_mode, BindingMode::WaitForFirstConsumer);
            assert_eq!(annotation(claim, keys::SELECTED_NODE), Some(NODE));
        }
    }
}

fuzz_target!(|input: ClaimInput| {
    let claim = input.claim();
    let class_name = claim_class_name(&claim).unwrap_or("hostpath").to_owned();
    let class = input.class(&class_name);
    let config = input.config();
    let me = me();

    let interest = claim_decision::claim_interest(&claim.metadata, &me);
    let decision = claim_decision::decide_claim(&claim, class.as_ref(), &me, &config, &[]);
    if let Decision::Refuse(refusal) = &decision {
        let _ = refusal.to_string();
    }
    let Decision::Provision(plan) = &decision else { return };
    check_plan(&claim, class.as_ref().expect("provisioned without a class"), &config, plan.as_ref());

    // Stage 1 never drops a claim that stage 2 would provision.
    assert_eq!(interest, Interest::Candidate, "stage 1 ignores a claim that stage 2 provisions");
});
