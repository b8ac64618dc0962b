//! Taking a resource over from the kubevirt hostpath-provisioner operator, the decisions.
//!
//! That operator marks the resource with its finalizer and owns (controller owner reference) the
//! DaemonSets, ServiceAccounts and pool mounter Deployments it made, in the namespace it runs in:
//! this operator's own, or another one (`openshift-cnv`, `kubevirt-hostpath-provisioner`). The
//! take-over finds them by their owner reference to the resource's uid, in any namespace. Once
//! that operator is gone:
//! - its finalizer would hold a deleted resource forever: nobody removes it;
//! - deleting the resource would let the garbage collector take its CSI DaemonSet, while the
//!   PVs of its CSI driver still need that DaemonSet to mount on a pod's next start and to be
//!   deleted on release;
//! - its legacy DaemonSet runs the Go provisioner under the provisioner name the node
//!   DaemonSet of this operator serves: two provisioners would act on each claim;
//! - its monitoring (PrometheusRule `prometheus-hpp-rules`, ServiceMonitor, metrics Service and
//!   the Role letting Prometheus read them) watches pods that no longer run: `HPPOperatorDown`
//!   would fire for ever. It carries no owner reference; it is found by name in the namespaces
//!   of the install.
//!
//! So the acting operator deletes the kubevirt monitoring at once and the legacy DaemonSet once
//! its own node DaemonSet runs on every selected node (the two serve the same claims the same
//! way meanwhile), keeps everything else that operator owned (drops the owner reference and says
//! why in an annotation: the CSI driver and pool mounters go when the user removes them, after
//! the last CSI volume), and then removes that finalizer. The kubevirt operator, brought back,
//! makes its monitoring again. Pure: the operator reads the objects and carries the plan out
//! ([`crate::operating`]); when the take-over must not start at all, [`super::takeover_stop`]
//! says so.

/// The kubevirt operator's finalizer on the resource.
pub const KUBEVIRT_FINALIZER: &str = "finalizer.delete.hostpath-provisioner";
/// The kubevirt operator's legacy DaemonSet (`pathConfig`): the Go legacy provisioner.
pub const KUBEVIRT_LEGACY_DAEMONSET: &str = "hostpath-provisioner";
/// Set on what the take-over keeps: why an object of no owner is still there.
pub const KEPT_ANNOTATION: &str = "hostpathprovisioner.kubevirt.io/kept-after-takeover";
/// The kubevirt operator's monitoring, by name, in its namespace (it sets no owner reference on
/// them; it makes them again when it runs).
pub const KUBEVIRT_MONITORING: [(Kind, &str); 5] = [
    (Kind::PrometheusRule, "prometheus-hpp-rules"),
    (Kind::ServiceMonitor, "service-monitor-hpp"),
    (Kind::Service, "hpp-prometheus-metrics"),
    (Kind::RoleBinding, "hostpath-provisioner-monitoring"),
    (Kind::Role, "hostpath-provisioner-monitoring"),
];

/// The kinds the take-over reads: those the kubevirt operator owns through the resource, and
/// those of its monitoring.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    DaemonSet,
    Deployment,
    ServiceAccount,
    Service,
    Role,
    RoleBinding,
    ServiceMonitor,
    PrometheusRule,
}

impl Kind {
    /// The kinds the kubevirt operator owns through the resource (listed in every namespace).
    pub const OWNED: [Kind; 3] = [Kind::DaemonSet, Kind::Deployment, Kind::ServiceAccount];

    pub fn name(self) -> &'static str {
        match self {
            Kind::DaemonSet => "DaemonSet",
            Kind::Deployment => "Deployment",
            Kind::ServiceAccount => "ServiceAccount",
            Kind::Service => "Service",
            Kind::Role => "Role",
            Kind::RoleBinding => "RoleBinding",
            Kind::ServiceMonitor => "ServiceMonitor",
            Kind::PrometheusRule => "PrometheusRule",
        }
    }
}

/// One object, by kind, namespace and name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Target {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.name(), self.namespace, self.name)
    }
}

/// An object as the take-over sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    pub kind: Kind,
    pub namespace: String,
    pub name: String,
    /// Made by this operator (it carries the resource label): never touched here.
    pub ours: bool,
    /// The position of the resource's uid among its owner references, if there.
    pub owner_index: Option<usize>,
    pub has_annotations: bool,
    /// Kept by an earlier pass of the take-over (it carries [`KEPT_ANNOTATION`]).
    pub kept: bool,
}

impl Found {
    fn target(&self) -> Target {
        Target { kind: self.kind, namespace: self.namespace.clone(), name: self.name.clone() }
    }
}

/// What the take-over does, in this order: delete, keep (orphan), then the finalizer.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TakeOver {
    pub delete: Vec<Target>,
    /// (object, JSON patch dropping the owner reference and annotating why it stays).
    pub keep: Vec<(Target, serde_json::Value)>,
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
        let deleted = list(self.delete.iter().map(Target::to_string).collect());
        let kept = list(self.keep.iter().map(|(t, _)| t.to_string()).collect());
        format!(
            "took over from the kubevirt hostpath-provisioner operator: deleted {deleted} (its legacy provisioner is replaced by this operator's node DaemonSet; its monitoring watched pods that no longer run, and comes back with that operator); kept without owner {kept} (the kubevirt CSI driver's volumes and pool mounts need them: delete them after the last PersistentVolume of provisioner kubevirt.io.hostpath-provisioner); {}",
            if self.remove_finalizer.is_some() {
                format!("removed the finalizer {KUBEVIRT_FINALIZER}")
            } else {
                "no kubevirt finalizer".to_owned()
            }
        )
    }
}

/// The namespaces the kubevirt install is in: those of the objects the resource owns or that an
/// earlier pass kept, never this operator's objects.
pub fn install_namespaces(found: &[Found]) -> Vec<String> {
    let mut namespaces: Vec<String> =
        found.iter().filter(|o| !o.ours && (o.owner_index.is_some() || o.kept)).map(|o| o.namespace.clone()).collect();
    namespaces.sort();
    namespaces.dedup();
    namespaces
}

/// Plans the take-over of a resource of `uid` with `finalizers`, given the objects the resource
/// owns in any namespace, those kept earlier, and the kubevirt monitoring objects found by name
/// in [`install_namespaces`]. `replace_legacy`: this operator's node DaemonSet runs on every
/// selected node (or the resource is being deleted), so the kubevirt legacy DaemonSet may go.
pub fn plan(uid: &str, finalizers: &[String], found: &[Found], replace_legacy: bool) -> TakeOver {
    let mut plan = TakeOver::default();
    let namespaces = install_namespaces(found);
    // The kubevirt monitoring first: it lies from the moment that operator stopped.
    for object in found.iter().filter(|o| !o.ours && namespaces.contains(&o.namespace)) {
        if KUBEVIRT_MONITORING.iter().any(|(kind, name)| *kind == object.kind && *name == object.name) {
            plan.delete.push(object.target());
        }
    }
    for object in found.iter().filter(|o| !o.ours && Kind::OWNED.contains(&o.kind)) {
        let Some(index) = object.owner_index else { continue };
        if object.kind == Kind::DaemonSet && object.name == KUBEVIRT_LEGACY_DAEMONSET {
            if replace_legacy {
                plan.delete.push(object.target());
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
        plan.keep.push((object.target(), serde_json::Value::Array(patch)));
    }
    // The finalizer last, once nothing the garbage collector could take is left owned; while
    // the legacy DaemonSet waits for this operator's own, the finalizer waits too.
    let legacy_waits = !replace_legacy
        && found.iter().any(|o| {
            !o.ours && o.owner_index.is_some() && o.kind == Kind::DaemonSet && o.name == KUBEVIRT_LEGACY_DAEMONSET
        });
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

    const OURS: &str = "hostpath-provisioner";

    fn found(kind: Kind, name: &str, ours: bool, owner_index: Option<usize>) -> Found {
        found_in(OURS, kind, name, ours, owner_index)
    }

    fn found_in(namespace: &str, kind: Kind, name: &str, ours: bool, owner_index: Option<usize>) -> Found {
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

    fn target(namespace: &str, kind: Kind, name: &str) -> Target {
        Target { kind, namespace: namespace.into(), name: name.into() }
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

    /// The kubevirt install in `namespace`, with its monitoring; beside it this operator's
    /// objects in its own namespace and, in a third, objects of the same names owned by nobody.
    fn kubevirt_install_in(namespace: &str) -> Vec<Found> {
        let mut objects = vec![
            found_in(namespace, Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET, false, Some(0)),
            found_in(namespace, Kind::DaemonSet, "hostpath-provisioner-csi", false, Some(0)),
            found_in(namespace, Kind::ServiceAccount, "hostpath-provisioner-admin", false, Some(0)),
            found_in(namespace, Kind::ServiceAccount, "hostpath-provisioner-admin-csi", false, Some(1)),
            found(Kind::DaemonSet, "kubevirt-hostpath-provisioner", true, Some(0)),
            found(Kind::PrometheusRule, "kubevirt-hostpath-provisioner", true, Some(0)),
            found_in("elsewhere", Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET, false, None),
            found_in("elsewhere", Kind::PrometheusRule, "prometheus-hpp-rules", false, None),
        ];
        objects.extend(KUBEVIRT_MONITORING.iter().map(|(kind, name)| found_in(namespace, *kind, name, false, None)));
        objects
    }

    #[test]
    fn the_legacy_daemonset_goes_the_rest_is_kept_without_owner_then_the_finalizer_goes() {
        let finalizers = vec!["other".to_owned(), KUBEVIRT_FINALIZER.to_owned()];
        let plan = plan(UID, &finalizers, &kubevirt_install(), true);
        assert_eq!(plan.delete, [target(OURS, Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET)]);
        let kept: Vec<(Kind, &str)> = plan.keep.iter().map(|(t, _)| (t.kind, t.name.as_str())).collect();
        assert_eq!(
            kept,
            [
                (Kind::DaemonSet, "hostpath-provisioner-csi"),
                (Kind::ServiceAccount, "hostpath-provisioner-admin-csi"),
                (Kind::Deployment, "hpp-pool-local-node-1")
            ]
        );
        let (_, patch) = &plan.keep[1];
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
        for (_, patch) in &plan.keep {
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
            plan.keep[0].1[2]["path"],
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
                for gone in &plan.delete {
                    if budget == 0 {
                        return;
                    }
                    budget -= 1;
                    if gone.name == KUBEVIRT_LEGACY_DAEMONSET {
                        self.removed_before_rollout |= !rolled_out && !self.deleting;
                    }
                    self.objects.retain(|o| &o.target() != gone);
                }
                for (kept, _) in &plan.keep {
                    if budget == 0 {
                        return;
                    }
                    budget -= 1;
                    let object = self.objects.iter_mut().find(|o| &o.target() == kept).expect("planned on what exists");
                    object.owner_index = None;
                    object.kept = true;
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
            // The install in another namespace than this operator's, with its monitoring.
            objects: kubevirt_install_in("openshift-cnv")
                .into_iter()
                .filter(|o| o.namespace == "openshift-cnv")
                .collect(),
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
                    let monitoring_left: Vec<&Found> = world
                        .objects
                        .iter()
                        .filter(|o| KUBEVIRT_MONITORING.iter().any(|(k, n)| *k == o.kind && *n == o.name))
                        .collect();
                    assert!(monitoring_left.is_empty(), "the kubevirt monitoring left: {monitoring_left:?}");
                }
            }
        }
        assert_eq!(runs, choices.len().pow(3));
    }

    /// The kubevirt install in another namespace: its legacy DaemonSet goes and its CSI objects
    /// are kept there, its monitoring goes; this operator's objects and same-named objects the
    /// resource does not own, elsewhere, stay untouched.
    #[test]
    fn an_install_in_another_namespace_is_taken_over_there_and_nowhere_else() {
        let finalizers = vec![KUBEVIRT_FINALIZER.to_owned()];
        let plan = plan(UID, &finalizers, &kubevirt_install_in("kubevirt-hostpath-provisioner"), true);
        let ns = "kubevirt-hostpath-provisioner";
        let mut deleted = plan.delete.clone();
        deleted.sort();
        let mut expected: Vec<Target> = KUBEVIRT_MONITORING.iter().map(|(k, n)| target(ns, *k, n)).collect();
        expected.push(target(ns, Kind::DaemonSet, KUBEVIRT_LEGACY_DAEMONSET));
        expected.sort();
        assert_eq!(deleted, expected);
        let kept: Vec<Target> = plan.keep.iter().map(|(t, _)| t.clone()).collect();
        assert_eq!(
            kept,
            [
                target(ns, Kind::DaemonSet, "hostpath-provisioner-csi"),
                target(ns, Kind::ServiceAccount, "hostpath-provisioner-admin"),
                target(ns, Kind::ServiceAccount, "hostpath-provisioner-admin-csi"),
            ]
        );
        assert!(plan.remove_finalizer.is_some());
        assert!(plan.summary().contains("PrometheusRule kubevirt-hostpath-provisioner/prometheus-hpp-rules"));
    }

    /// A pass that kept the CSI objects and stopped before the monitoring went: the kept
    /// annotation still marks the install's namespace, so the next pass removes it.
    #[test]
    fn the_monitoring_goes_even_after_every_owned_object_was_kept() {
        let ns = "openshift-cnv";
        let mut objects = vec![Found {
            kept: true,
            has_annotations: true,
            ..found_in(ns, Kind::DaemonSet, "hostpath-provisioner-csi", false, None)
        }];
        objects.extend(KUBEVIRT_MONITORING.iter().map(|(kind, name)| found_in(ns, *kind, name, false, None)));
        let plan = plan(UID, &[], &objects, false);
        assert_eq!(plan.delete.len(), KUBEVIRT_MONITORING.len());
        assert!(plan.keep.is_empty());
        // Without any sign of the install there, objects of those names are someone else's.
        let elsewhere: Vec<Found> = objects.into_iter().filter(|o| !o.kept).collect();
        assert!(super::plan(UID, &[], &elsewhere, true).is_empty());
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
