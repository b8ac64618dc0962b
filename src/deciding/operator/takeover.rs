//! Taking a resource over from the kubevirt hostpath-provisioner operator, the decisions.
//!
//! That operator marks the resource with its finalizer and owns (controller owner reference) the
//! DaemonSets, ServiceAccounts and pool mounter Deployments it made. Once it is gone:
//! - its finalizer would hold a deleted resource forever: nobody removes it;
//! - deleting the resource would let the garbage collector take its CSI DaemonSet, while the
//!   PVs of its CSI driver still need that DaemonSet to mount on a pod's next start and to be
//!   deleted on release;
//! - its legacy DaemonSet runs the Go provisioner under the provisioner name the node
//!   DaemonSet of this operator serves: two provisioners would act on each claim.
//!
//! So the acting operator deletes the legacy DaemonSet once its own node DaemonSet runs on every
//! selected node (the two serve the same claims the same way meanwhile),
//! keeps everything else that operator owned (drops the owner reference and says why in an
//! annotation: the CSI driver and pool mounters go when the user removes them, after the last
//! CSI volume), and then removes that finalizer. Pure: the operator reads the objects and
//! carries the plan out ([`crate::operating`]).

/// The kubevirt operator's finalizer on the resource.
pub const KUBEVIRT_FINALIZER: &str = "finalizer.delete.hostpath-provisioner";
/// The kubevirt operator's legacy DaemonSet (`pathConfig`): the Go legacy provisioner.
pub const KUBEVIRT_LEGACY_DAEMONSET: &str = "hostpath-provisioner";
/// Set on what the take-over keeps: why an object of no owner is still there.
pub const KEPT_ANNOTATION: &str = "hostpathprovisioner.kubevirt.io/kept-after-takeover";

/// The kinds the kubevirt operator owns through the resource.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    DaemonSet,
    Deployment,
    ServiceAccount,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::DaemonSet, Kind::Deployment, Kind::ServiceAccount];

    pub fn name(self) -> &'static str {
        match self {
            Kind::DaemonSet => "DaemonSet",
            Kind::Deployment => "Deployment",
            Kind::ServiceAccount => "ServiceAccount",
        }
    }
}

/// An object in the operator's namespace, as the take-over sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub kind: Kind,
    pub name: String,
    /// Made by this operator (it carries the resource label): never touched here.
    pub ours: bool,
    /// The position of the resource's uid among its owner references, if there.
    pub owner_index: Option<usize>,
    pub has_annotations: bool,
}

/// What the take-over does, in this order: delete, keep (orphan), then the finalizer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TakeOver {
    pub delete: Vec<(Kind, String)>,
    /// (kind, name, JSON patch dropping the owner reference and annotating why it stays).
    pub keep: Vec<(Kind, String, serde_json::Value)>,
    /// The JSON patch removing the kubevirt finalizer, if the resource has it.
    pub remove_finalizer: Option<serde_json::Value>,
}

impl TakeOver {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.keep.is_empty() && self.remove_finalizer.is_none()
    }

    /// What the Event on the resource says.
    pub fn summary(&self) -> String {
        let list = |items: Vec<String>| if items.is_empty() { "none".to_owned() } else { items.join(", ") };
        let deleted = list(self.delete.iter().map(|(k, n)| format!("{} {n}", k.name())).collect());
        let kept = list(self.keep.iter().map(|(k, n, _)| format!("{} {n}", k.name())).collect());
        format!(
            "took over from the kubevirt hostpath-provisioner operator: deleted {deleted} (replaced by this operator's node DaemonSet); kept without owner {kept} (the kubevirt CSI driver's volumes and pool mounts need them: delete them after the last PersistentVolume of provisioner kubevirt.io.hostpath-provisioner); {}",
            if self.remove_finalizer.is_some() {
                format!("removed the finalizer {KUBEVIRT_FINALIZER}")
            } else {
                "no kubevirt finalizer".to_owned()
            }
        )
    }
}

/// Plans the take-over of a resource of `uid` with `finalizers`, given the objects of the
/// namespace. `replace_legacy`: this operator's node DaemonSet runs on every selected node (or
/// the resource is being deleted), so the kubevirt legacy DaemonSet may go.
pub fn plan(uid: &str, finalizers: &[String], found: &[Found], replace_legacy: bool) -> TakeOver {
    let mut plan = TakeOver::default();
    for object in found.iter().filter(|o| !o.ours) {
        let Some(index) = object.owner_index else { continue };
        if object.kind == Kind::DaemonSet && object.name == KUBEVIRT_LEGACY_DAEMONSET {
            if replace_legacy {
                plan.delete.push((object.kind, object.name.clone()));
            }
            continue;
        }
        let mut patch = vec![
            // Only the reference read: a concurrent change of the list fails the patch instead.
            serde_json::json!({"op": "test", "path": format!("/metadata/ownerReferences/{index}/uid"), "value": uid}),
            serde_json::json!({"op": "remove", "path": format!("/metadata/ownerReferences/{index}")}),
        ];
        let why = "the kubevirt hostpath-provisioner operator made this; the resource is now served by hostpath-provisioner, which keeps it for the volumes of the kubevirt CSI driver";
        if object.has_annotations {
            let key = KEPT_ANNOTATION.replace('~', "~0").replace('/', "~1");
            patch.push(serde_json::json!({"op": "add", "path": format!("/metadata/annotations/{key}"), "value": why}));
        } else {
            patch.push(
                serde_json::json!({"op": "add", "path": "/metadata/annotations", "value": {KEPT_ANNOTATION: why}}),
            );
        }
        plan.keep.push((object.kind, object.name.clone(), serde_json::Value::Array(patch)));
    }
    // The finalizer last, once nothing the garbage collector could take is left owned; while
    // the legacy DaemonSet waits for this operator's own, the finalizer waits too.
    let legacy_waits = !replace_legacy
        && found.iter().any(|o| !o.ours && o.owner_index.is_some() && o.name == KUBEVIRT_LEGACY_DAEMONSET);
    if let Some(index) = finalizers.iter().position(|f| f == KUBEVIRT_FINALIZER)
        && !legacy_waits
    {
        plan.remove_finalizer = Some(serde_json::json!([
            {"op": "test", "path": format!("/metadata/finalizers/{index}"), "value": KUBEVIRT_FINALIZER},
            {"op": "remove", "path": format!("/metadata/finalizers/{index}")},
        ]));
    }
    plan
}

#[cfg(test)]
mod tests {
    use super::*;

    const UID: &str = "6f1b7c1e-0000-4000-8000-000000000001";

    fn found(kind: Kind, name: &str, ours: bool, owner_index: Option<usize>) -> Found {
        Found { kind, name: name.into(), ours, owner_index, has_annotations: false }
    }

    fn kubevirt_install() -> Vec<Found> {
        vec![
            found(Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET, false, Some(0)),
            found(Kind::DaemonSet, "hostpath-provisioner-csi", false, Some(0)),
            found(Kind::ServiceAccount, "hostpath-provisioner-admin-csi", false, Some(1)),
            found(Kind::Deployment, "hpp-pool-local-node-1", false, Some(0)),
            // Ours, and an object of nobody's: never touched.
            found(Kind::DaemonSet, "kubevirt-hostpath-provisioner", true, Some(0)),
            found(Kind::Deployment, "unrelated", false, None),
        ]
    }

    #[test]
    fn the_legacy_daemonset_goes_the_rest_is_kept_without_owner_then_the_finalizer_goes() {
        let finalizers = vec!["other".to_owned(), KUBEVIRT_FINALIZER.to_owned()];
        let plan = plan(UID, &finalizers, &kubevirt_install(), true);
        assert_eq!(plan.delete, [(Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET.to_owned())]);
        let kept: Vec<(Kind, &str)> = plan.keep.iter().map(|(k, n, _)| (*k, n.as_str())).collect();
        assert_eq!(
            kept,
            [
                (Kind::DaemonSet, "hostpath-provisioner-csi"),
                (Kind::ServiceAccount, "hostpath-provisioner-admin-csi"),
                (Kind::Deployment, "hpp-pool-local-node-1")
            ]
        );
        let (_, _, patch) = &plan.keep[1];
        assert_eq!(
            patch[0],
            serde_json::json!({"op": "test", "path": "/metadata/ownerReferences/1/uid", "value": UID})
        );
        assert_eq!(patch[1], serde_json::json!({"op": "remove", "path": "/metadata/ownerReferences/1"}));
        assert_eq!(patch[2]["value"][KEPT_ANNOTATION].as_str().map(|w| w.contains("kubevirt CSI")), Some(true));
        let finalizer = plan.remove_finalizer.expect("the finalizer goes");
        assert_eq!(finalizer[0]["path"], "/metadata/finalizers/1");
        assert_eq!(finalizer[0]["value"], KUBEVIRT_FINALIZER);
        // Every patch parses as a JSON patch.
        for (_, _, patch) in &plan.keep {
            serde_json::from_value::<json_patch::Patch>(patch.clone()).expect("a JSON patch");
        }
        serde_json::from_value::<json_patch::Patch>(finalizer).expect("a JSON patch");
    }

    #[test]
    fn an_annotation_is_added_beside_existing_ones_with_the_key_escaped() {
        let object =
            Found { has_annotations: true, ..found(Kind::DaemonSet, "hostpath-provisioner-csi", false, Some(0)) };
        let plan = plan(UID, &[], &[object], true);
        assert_eq!(
            plan.keep[0].2[2]["path"],
            "/metadata/annotations/hostpathprovisioner.kubevirt.io~1kept-after-takeover"
        );
        assert!(plan.remove_finalizer.is_none(), "no kubevirt finalizer, none removed");
    }

    /// Before this operator's node DaemonSet is applied, the legacy one keeps serving, and the
    /// finalizer stays with it (the garbage collector would otherwise take it with a deletion).
    #[test]
    fn the_legacy_daemonset_and_the_finalizer_wait_for_the_node_daemonset() {
        let finalizers = vec![KUBEVIRT_FINALIZER.to_owned()];
        let plan = plan(UID, &finalizers, &kubevirt_install(), false);
        assert!(plan.delete.is_empty());
        assert_eq!(plan.keep.len(), 3, "the CSI objects are kept at once");
        assert!(plan.remove_finalizer.is_none());
        // Without a legacy DaemonSet (storage pools), nothing waits.
        let pools_only: Vec<Found> =
            kubevirt_install().into_iter().filter(|o| o.name != KUBEVIRT_LEGACY_DAEMONSET).collect();
        assert!(super::plan(UID, &finalizers, &pools_only, false).remove_finalizer.is_some());
    }

    /// The take-over against a crash after any of its steps, a deletion of the resource at any
    /// moment (whose finalizers then decide when the garbage collector takes what the resource
    /// still owns), and the node DaemonSet's rollout ending at any pass: every interleaving of
    /// up to three passes. Whatever happens, no kept object is ever collected, the legacy
    /// DaemonSet is never removed before the rollout unless the resource is being deleted, and a
    /// pass that runs to its end leaves nothing to do.
    #[test]
    fn no_crash_deletion_or_rollout_order_lets_the_garbage_collector_take_a_kept_object() {
        #[derive(Clone)]
        struct World {
            objects: Vec<Found>,
            finalizers: Vec<String>,
            deleting: bool,
            gone: bool,
            collected: Vec<String>,
            removed_before_rollout: bool,
        }
        impl World {
            /// One operator pass carrying out the plan's first `steps` steps (a crash after).
            fn pass(&mut self, steps: usize, rolled_out: bool) {
                if self.gone {
                    return;
                }
                let plan = plan(UID, &self.finalizers, &self.objects, rolled_out || self.deleting);
                let mut budget = steps;
                for (_, name) in &plan.delete {
                    if budget == 0 {
                        return;
                    }
                    budget -= 1;
                    self.removed_before_rollout |= !rolled_out && !self.deleting;
                    self.objects.retain(|o| &o.name != name);
                }
                for (_, name, _) in &plan.keep {
                    if budget == 0 {
                        return;
                    }
                    budget -= 1;
                    let object = self.objects.iter_mut().find(|o| &o.name == name).expect("planned on what exists");
                    object.owner_index = None;
                }
                if plan.remove_finalizer.is_some() && budget > 0 {
                    self.finalizers.retain(|f| f != KUBEVIRT_FINALIZER);
                }
                self.collect();
            }
            /// The API server and the garbage collector: a deleted resource without finalizers
            /// goes, and so does every object it still owns.
            fn collect(&mut self) {
                if self.deleting && self.finalizers.is_empty() && !self.gone {
                    self.gone = true;
                    let owned: Vec<String> =
                        self.objects.iter().filter(|o| o.owner_index.is_some()).map(|o| o.name.clone()).collect();
                    self.objects.retain(|o| o.owner_index.is_none());
                    self.collected.extend(owned);
                }
            }
        }
        let start = World {
            objects: kubevirt_install().into_iter().filter(|o| !o.ours && o.owner_index.is_some()).collect(),
            finalizers: vec![KUBEVIRT_FINALIZER.to_owned()],
            deleting: false,
            gone: false,
            collected: Vec::new(),
            removed_before_rollout: false,
        };
        let most_steps = start.objects.len() + 1;
        let mut runs = 0;
        // A pass: (steps before a crash, rollout done, deletion requested before it).
        let choices: Vec<(usize, bool, bool)> = (0..=most_steps)
            .flat_map(|steps| [false, true].into_iter().flat_map(move |r| [false, true].map(move |d| (steps, r, d))))
            .collect();
        for first in &choices {
            for second in &choices {
                for third in &choices {
                    let mut world = start.clone();
                    let mut rolled_out = false;
                    for &(steps, rollout, delete) in [first, second, third] {
                        rolled_out |= rollout;
                        world.deleting |= delete;
                        world.collect();
                        world.pass(steps, rolled_out);
                    }
                    // Then the operator runs a whole pass, after the rollout.
                    world.pass(usize::MAX, true);
                    runs += 1;
                    let kept_taken: Vec<&String> =
                        world.collected.iter().filter(|n| *n != KUBEVIRT_LEGACY_DAEMONSET).collect();
                    assert!(kept_taken.is_empty(), "collected {kept_taken:?}");
                    assert!(!world.removed_before_rollout, "the legacy DaemonSet went before the rollout");
                    let left = plan(UID, &world.finalizers, &world.objects, true);
                    assert!(world.gone || left.is_empty(), "left to do after a whole pass: {left:?}");
                    assert!(world.objects.iter().all(|o| o.owner_index.is_none()), "still owned");
                }
            }
        }
        assert_eq!(runs, choices.len().pow(3));
    }

    #[test]
    fn a_resource_taken_over_already_needs_nothing() {
        let done = vec![
            found(Kind::DaemonSet, "hostpath-provisioner-csi", false, None),
            found(Kind::DaemonSet, "kubevirt-hostpath-provisioner", true, Some(0)),
        ];
        let plan = plan(UID, &["hostpathprovisioner.kubevirt.io/cleanup".to_owned()], &done, true);
        assert!(plan.is_empty(), "{plan:?}");
    }
}
