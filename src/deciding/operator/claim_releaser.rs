//! `spec.releaseClaimsOfRemovedNodes` (our extension of the resource): the claim releaser, the
//! objects of deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml (its
//! ServiceAccount, the ClusterRole that alone grants `delete` on claims, its binding, one
//! Deployment running `hostpath-provisioner release-claims-of-removed-nodes`), in the operator's
//! namespace with the node pods' image. The node DaemonSet's ClusterRole never gets that right.
//!
//! Unset, empty or `off`: none is made, and [`made_objects`] names what the reconciler removes if
//! an earlier spec made it.

use serde_json::{Value, json};

use super::super::resource::HostPathProvisioner;
use super::{Desired, Environment, Problem, desired, documents, pull_secrets_json};

const CLAIM_RELEASER: &str =
    include_str!("../../../deploy/components/release-claims-of-removed-nodes/claim-releaser.yaml");
/// The releaser's container in claim-releaser.yaml.
const CONTAINER: &str = "claim-releaser";
/// The name of each of its objects.
pub const NAME: &str = "kubevirt-hostpath-provisioner-claim-releaser";

/// The grace period the spec asks for, checked as the releaser will read it; `None`: off.
pub fn requested(resource: &HostPathProvisioner) -> Result<Option<String>, Problem> {
    let Some(value) = resource.spec.release_claims_of_removed_nodes.as_deref().map(str::trim) else {
        return Ok(None);
    };
    if value.is_empty() || value == "off" {
        return Ok(None);
    }
    let positive = value
        .parse::<jiff::SignedDuration>()
        .ok()
        .and_then(|d| std::time::Duration::try_from(d).ok())
        .is_some_and(|d| !d.is_zero());
    if !positive {
        return Err(Problem {
            reason: "InvalidReleaseClaimsOfRemovedNodes",
            message: format!(
                "spec.releaseClaimsOfRemovedNodes {value:?} is not a positive duration such as 24h, 90m or 1h 30m: fix it or leave it out (off); what runs is left as it was"
            ),
            pool: None,
        });
    }
    Ok(Some(value.to_owned()))
}

/// The releaser's objects for a grace period of `grace`.
pub fn objects(resource: &HostPathProvisioner, environment: &Environment, grace: &str) -> Result<Vec<Desired>, String> {
    let file = "claim-releaser.yaml";
    let namespace = environment.namespace.as_str();
    let mut objects = Vec::new();
    for mut document in documents(CLAIM_RELEASER, file)? {
        let (kind, plural) = match document.get("kind").and_then(Value::as_str) {
            Some("ServiceAccount") => ("ServiceAccount", "serviceaccounts"),
            Some("ClusterRole") => ("ClusterRole", "clusterroles"),
            Some("ClusterRoleBinding") => ("ClusterRoleBinding", "clusterrolebindings"),
            Some("Deployment") => ("Deployment", "deployments"),
            other => return Err(format!("{file}: unexpected kind {other:?}")),
        };
        if document["metadata"]["name"] != NAME {
            return Err(format!("{file}: the {kind} is not named {NAME}"));
        }
        match kind {
            "ServiceAccount" => document["metadata"]["namespace"] = json!(namespace),
            "ClusterRoleBinding" => {
                for subject in document["subjects"].as_array_mut().into_iter().flatten() {
                    subject["namespace"] = json!(namespace);
                }
            }
            "Deployment" => deployment(&mut document, resource, environment, grace)?,
            _ => {}
        }
        objects.push(desired(resource, plural, &document)?);
    }
    Ok(objects)
}

/// The Deployment of the file, in the operator's namespace, with the node pods' image, pull
/// policy and pull secrets, and the grace period.
fn deployment(
    document: &mut Value,
    resource: &HostPathProvisioner,
    environment: &Environment,
    grace: &str,
) -> Result<(), String> {
    document["metadata"]["namespace"] = json!(environment.namespace);
    let pod = document
        .pointer_mut("/spec/template/spec")
        .and_then(Value::as_object_mut)
        .ok_or("claim-releaser.yaml: no pod spec")?;
    if let Some(secrets) = pull_secrets_json(&environment.image_pull_secrets) {
        pod.insert("imagePullSecrets".into(), secrets);
    }
    // OpenShift's restricted-v2 SCC assigns a uid from the namespace's range and refuses any
    // other: the file's fixed uid is left out there (runAsNonRoot stays).
    if environment.openshift
        && let Some(security) = pod.get_mut("securityContext").and_then(Value::as_object_mut)
    {
        security.remove("runAsUser");
        security.remove("runAsGroup");
    }
    let container = pod
        .get_mut("containers")
        .and_then(Value::as_array_mut)
        .and_then(|containers| containers.iter_mut().find(|c| c["name"] == CONTAINER))
        .ok_or("claim-releaser.yaml: no claim-releaser container")?;
    container["image"] = json!(environment.image);
    if let Some(policy) = resource.spec.image_pull_policy.as_deref().filter(|p| !p.is_empty()) {
        container["imagePullPolicy"] = json!(policy);
    }
    let variable = container["env"]
        .as_array_mut()
        .and_then(|env| env.iter_mut().find(|e| e["name"] == "RELEASE_CLAIMS_OF_REMOVED_NODES"))
        .ok_or("claim-releaser.yaml: no RELEASE_CLAIMS_OF_REMOVED_NODES")?;
    variable["value"] = json!(grace);
    // The node pods' names, as spec.config gives them (the file's default otherwise): the
    // releaser considers only their PVs.
    let config = &resource.spec.config;
    for (name, value) in [
        ("PROVISIONER_NAME", &config.provisioner_name),
        ("CAPACITY_PROVISIONER_NAME", &config.capacity_provisioner_name),
    ] {
        if let Some(value) = value {
            let variable = container["env"]
                .as_array_mut()
                .and_then(|env| env.iter_mut().find(|e| e["name"] == name))
                .ok_or_else(|| format!("claim-releaser.yaml: no {name}"))?;
            variable["value"] = json!(value);
        }
    }
    Ok(())
}

/// What an earlier spec may have made, for the reconciler to remove once the field is off (only
/// objects carrying this resource's owner reference).
pub fn made_objects(environment: &Environment) -> Vec<Desired> {
    let probe = |api_version: &str, kind: &str, plural: &str, namespaced: bool| Desired {
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
        name: NAME.into(),
        namespace: namespaced.then(|| environment.namespace.clone()),
        body: Value::Null,
    };
    vec![
        probe("apps/v1", "Deployment", "deployments", true),
        probe("rbac.authorization.k8s.io/v1", "ClusterRoleBinding", "clusterrolebindings", false),
        probe("rbac.authorization.k8s.io/v1", "ClusterRole", "clusterroles", false),
        probe("v1", "ServiceAccount", "serviceaccounts", true),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::deciding::operator::render::{Rendered, render};

    fn environment(openshift: bool) -> Environment {
        Environment {
            namespace: "hpp-operator".into(),
            image: "registry.example/hostpath-provisioner:1.2.3".into(),
            openshift,
            prometheus: false,
            held_pools: Vec::new(),
            pool_roots: Vec::new(),
            image_pull_secrets: vec!["pull".into()],
        }
    }

    fn resource(release: Option<&str>) -> HostPathProvisioner {
        let mut spec =
            json!({"storagePools": [{"name": "local", "path": "/var/hpvolumes"}], "imagePullPolicy": "Always"});
        if let Some(value) = release {
            spec["releaseClaimsOfRemovedNodes"] = json!(value);
        }
        serde_json::from_value(json!({"metadata": {"name": "hpp", "uid": "u-1"}, "spec": spec})).expect("resource")
    }

    fn rules_grant(role: &Value, resource: &str, verb: &str) -> bool {
        role["rules"].as_array().into_iter().flatten().any(|rule| {
            let has =
                |key: &str, value: &str| rule[key].as_array().into_iter().flatten().any(|v| v == value || v == "*");
            has("resources", resource) && has("verbs", verb)
        })
    }

    fn role<'a>(rendered: &'a Rendered, name: &str) -> &'a Value {
        &rendered.objects.iter().find(|o| o.kind == "ClusterRole" && o.name == name).expect("role").body
    }

    /// The node DaemonSet's ClusterRole never lets a node pod delete claims; with the field set,
    /// the releaser's alone does, bound to its own ServiceAccount, which its Deployment runs as.
    #[test]
    fn only_the_releaser_may_delete_claims_and_only_when_asked_for() {
        let off = render(&resource(None), &environment(false));
        assert_eq!(off.problems, []);
        assert!(!off.objects.iter().any(|o| o.name == NAME), "nothing of the releaser when off");
        assert!(!rules_grant(role(&off, "kubevirt-hostpath-provisioner"), "persistentvolumeclaims", "delete"));
        for value in ["", "off"] {
            assert!(!render(&resource(Some(value)), &environment(false)).objects.iter().any(|o| o.name == NAME));
        }

        let on = render(&resource(Some("24h")), &environment(false));
        assert_eq!(on.problems, []);
        assert!(!rules_grant(role(&on, "kubevirt-hostpath-provisioner"), "persistentvolumeclaims", "delete"));
        let releaser = role(&on, NAME);
        assert!(rules_grant(releaser, "persistentvolumeclaims", "delete"));
        assert!(!rules_grant(releaser, "persistentvolumes", "delete"), "{releaser}");
        let binding = &on.objects.iter().find(|o| o.kind == "ClusterRoleBinding" && o.name == NAME).expect("binding");
        assert_eq!(binding.body["roleRef"]["name"], NAME);
        assert_eq!(
            binding.body["subjects"][0],
            json!({"kind": "ServiceAccount", "name": NAME, "namespace": "hpp-operator"})
        );
        let node_binding = on
            .objects
            .iter()
            .find(|o| o.kind == "ClusterRoleBinding" && o.name == "kubevirt-hostpath-provisioner")
            .expect("node binding");
        assert_ne!(
            node_binding.body["subjects"][0]["name"], NAME,
            "the node pods are not bound to the releaser's role"
        );
        let account = on.objects.iter().find(|o| o.kind == "ServiceAccount" && o.name == NAME).expect("account");
        assert_eq!(account.namespace.as_deref(), Some("hpp-operator"));

        let deployment = &on.objects.iter().find(|o| o.kind == "Deployment").expect("the Deployment").body;
        assert_eq!(deployment["metadata"]["namespace"], "hpp-operator");
        assert_eq!(deployment["metadata"]["ownerReferences"][0]["uid"], "u-1");
        assert_eq!(deployment["spec"]["replicas"], 1);
        assert_eq!(deployment["spec"]["strategy"]["type"], "Recreate");
        let pod = &deployment["spec"]["template"]["spec"];
        assert_eq!(pod["serviceAccountName"], NAME);
        assert_eq!(pod["imagePullSecrets"], json!([{"name": "pull"}]));
        assert_eq!(pod["securityContext"]["runAsUser"], 65532);
        let container = &pod["containers"][0];
        assert_eq!(container["image"], "registry.example/hostpath-provisioner:1.2.3");
        assert_eq!(container["imagePullPolicy"], "Always");
        assert_eq!(container["args"], json!(["release-claims-of-removed-nodes"]));
        let env = container["env"].as_array().expect("env");
        let value = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
        assert_eq!(value("RELEASE_CLAIMS_OF_REMOVED_NODES"), Some(json!("24h")));
        // Probed and scraped on the port the subcommand listens on by default.
        assert_eq!(container["ports"], json!([{"name": "metrics", "containerPort": 8080, "protocol": "TCP"}]));
        assert_eq!(container["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
        assert_eq!(container["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));
        // The node pods never get the variable (they would only report it as ignored).
        let daemonset = &on.objects.iter().find(|o| o.kind == "DaemonSet").expect("DaemonSet").body;
        assert!(!daemonset.to_string().contains("RELEASE_CLAIMS_OF_REMOVED_NODES"), "{daemonset}");

        let openshift = render(&resource(Some("24h")), &environment(true));
        let deployment = &openshift.objects.iter().find(|o| o.kind == "Deployment").expect("Deployment").body;
        let security = &deployment["spec"]["template"]["spec"]["securityContext"];
        assert!(security.get("runAsUser").is_none() && security["runAsNonRoot"] == true, "{security}");
    }

    /// The releaser considers the PVs of the node pods' names, as spec.config gives them: the
    /// file's default first name without it, both names with them.
    #[test]
    fn the_releaser_gets_the_node_pods_names_from_spec_config() {
        let env_of = |resource: &HostPathProvisioner| {
            let rendered = render(resource, &environment(false));
            let deployment = rendered.objects.iter().find(|o| o.kind == "Deployment").expect("Deployment").body.clone();
            let env = deployment["spec"]["template"]["spec"]["containers"][0]["env"].clone();
            move |name: &str| {
                env.as_array().into_iter().flatten().find(|e| e["name"] == name).map(|e| e["value"].clone())
            }
        };
        let default = env_of(&resource(Some("24h")));
        assert_eq!(default("PROVISIONER_NAME"), Some(json!("kubevirt.io/hostpath-provisioner")));
        assert_eq!(default("CAPACITY_PROVISIONER_NAME"), Some(json!("")));
        let mut named = resource(Some("24h"));
        named.spec.config.provisioner_name = Some("example.com/hpp".into());
        named.spec.config.capacity_provisioner_name = Some("hostpath.example.org".into());
        let named = env_of(&named);
        assert_eq!(named("PROVISIONER_NAME"), Some(json!("example.com/hpp")));
        assert_eq!(named("CAPACITY_PROVISIONER_NAME"), Some(json!("hostpath.example.org")));
    }

    #[test]
    fn a_grace_period_the_releaser_would_refuse_renders_nothing_and_says_why() {
        for bad in ["0s", "24", "soon"] {
            let rendered = render(&resource(Some(bad)), &environment(false));
            assert!(rendered.objects.is_empty(), "{bad}: what runs is left as it was");
            assert_eq!(rendered.problems.len(), 1, "{bad}");
            assert_eq!(rendered.problems[0].reason, "InvalidReleaseClaimsOfRemovedNodes");
            assert!(rendered.problems[0].message.contains(bad), "{}", rendered.problems[0].message);
        }
    }

    #[test]
    fn what_an_earlier_spec_made_is_named_for_removal() {
        let made = made_objects(&environment(false));
        let kinds: Vec<_> = made.iter().map(|d| (d.kind.as_str(), d.namespace.is_some())).collect();
        assert_eq!(
            kinds,
            [("Deployment", true), ("ClusterRoleBinding", false), ("ClusterRole", false), ("ServiceAccount", true)]
        );
        let on = render(&resource(Some("1h")), &environment(false));
        for probe in &made {
            assert!(
                on.objects
                    .iter()
                    .any(|o| o.kind == probe.kind && o.name == probe.name && o.namespace == probe.namespace),
                "{probe:?}"
            );
        }
    }
}
