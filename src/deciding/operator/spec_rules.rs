//! The CRD's rules (deploy/operator/crd.yaml, `x-kubernetes-validations`), checked again by the
//! operator. The API server refuses a new or changed resource that breaks one; a resource stored
//! before the CRD had them (made under the kubevirt operator's schema) is not checked again
//! unless it changes: from Kubernetes 1.30 an unchanged field passes (validation ratcheting),
//! before 1.30 the operator's own writes to it are refused. Either way the operator must not
//! act on it: it reports the broken rule with the CRD's own message and leaves what runs as it
//! was. Pure.

use super::resource::Spec;

/// The messages of the CRD's rules, word for word (a test reads them from the CRD).
pub mod message {
    pub const BOTH_FORMS: &str = "spec.pathConfig and spec.storagePools cannot both be set: keep pathConfig for the legacy single directory, or move its path into a storage pool and remove pathConfig";
    pub const NEITHER_FORM: &str = "set spec.pathConfig.path (one directory, the legacy layout) or at least one entry of spec.storagePools: nothing says where volumes go";
    pub const PULL_POLICY: &str =
        "spec.imagePullPolicy must be Always, IfNotPresent or Never (case matters), or left out";
    pub const PATH_CONFIG_ABSOLUTE: &str =
        "spec.pathConfig.path must be an absolute path on the node, starting with /, such as /var/hpvolumes";
    pub const PATH_CONFIG_SEGMENTS: &str =
        "spec.pathConfig.path must be a directory other than / without . or .. segments, such as /var/hpvolumes";
    pub const PATH_CONFIG_COMMA: &str = "spec.pathConfig.path must not contain a comma, which separates pools in the node provisioner's settings: use a directory without one";
    pub const POOL_NAMES_UNIQUE: &str = "a spec.storagePools[].name listed more than once is one pool over several disks, which a pool on a claim cannot be: give each pool with a pvcTemplate a name of its own";
    pub const POOL_PATHS_UNIQUE: &str =
        "each spec.storagePools[].path must be unique: two pools cannot share a directory, give each its own";
    pub const POOL_INSIDE_POOL: &str = "a spec.storagePools[].path lies inside another pool's path: a volume of one would be a directory of the other; use separate directories such as /var/pool-a and /var/pool-b";
    pub const POOL_ABSOLUTE: &str =
        "spec.storagePools[].path must be an absolute path on the node, starting with /, such as /var/hpvolumes";
    pub const POOL_SEGMENTS: &str =
        "spec.storagePools[].path must be a directory other than / without . or .. segments, such as /var/hpvolumes";
    pub const POOL_COMMA: &str = "spec.storagePools[].path must not contain a comma, which separates pools in the node provisioner's settings: use a directory without one";
    pub const POOL_ACCOUNTING: &str =
        "spec.storagePools[].accounting must be free or requests (case matters), or left out";
    pub const PUBLISH_NEEDS_NAME: &str = "spec.config.publishCapacity needs spec.config.capacityProvisionerName, or spec.config.provisionerName, to be an object name such as hostpath.example.org (kube-scheduler reads published capacity through a CSIDriver of that name)";

    /// Every rule's message, in the CRD's order.
    pub const ALL: [&str; 14] = [
        BOTH_FORMS,
        NEITHER_FORM,
        PULL_POLICY,
        PATH_CONFIG_ABSOLUTE,
        PATH_CONFIG_SEGMENTS,
        PATH_CONFIG_COMMA,
        POOL_NAMES_UNIQUE,
        POOL_PATHS_UNIQUE,
        POOL_INSIDE_POOL,
        POOL_ABSOLUTE,
        POOL_SEGMENTS,
        POOL_COMMA,
        POOL_ACCOUNTING,
        PUBLISH_NEEDS_NAME,
    ];
}

/// The messages of the rules `spec` breaks, each once, in the CRD's order.
pub fn broken_rules(spec: &Spec) -> Vec<&'static str> {
    use message::*;
    let mut broken = Vec::new();
    let pools = &spec.storage_pools;
    if spec.path_config.is_some() && !pools.is_empty() {
        broken.push(BOTH_FORMS);
    }
    if spec.path_config.is_none() && pools.is_empty() {
        broken.push(NEITHER_FORM);
    }
    if !matches!(spec.image_pull_policy.as_deref(), None | Some("" | "Always" | "IfNotPresent" | "Never")) {
        broken.push(PULL_POLICY);
    }
    if let Some(path_config) = &spec.path_config {
        let path = path_config.path.as_str();
        if !path.starts_with('/') {
            broken.push(PATH_CONFIG_ABSOLUTE);
        }
        if path == "/" || has_dot_segment(path) {
            broken.push(PATH_CONFIG_SEGMENTS);
        }
        if path.contains(',') {
            broken.push(PATH_CONFIG_COMMA);
        }
    }
    let count = |f: &dyn Fn(&super::resource::StoragePool) -> bool| pools.iter().filter(|p| f(p)).count();
    // A name listed again is one pool over several disks: directories only.
    if pools.iter().any(|a| a.pvc_template.is_some() && count(&|b| b.name == a.name) != 1) {
        broken.push(POOL_NAMES_UNIQUE);
    }
    if pools.iter().any(|a| count(&|b| b.path == a.path) != 1) {
        broken.push(POOL_PATHS_UNIQUE);
    }
    let inside = |a: &str, b: &str| {
        let prefix = if b.ends_with('/') { b.to_owned() } else { format!("{b}/") };
        a != b && a.starts_with(&prefix)
    };
    if pools.iter().any(|a| pools.iter().any(|b| inside(&a.path, &b.path))) {
        broken.push(POOL_INSIDE_POOL);
    }
    for (rule, breaks) in [
        (POOL_ABSOLUTE, &(|p: &str| !p.starts_with('/')) as &dyn Fn(&str) -> bool),
        (POOL_SEGMENTS, &|p: &str| p == "/" || has_dot_segment(p)),
        (POOL_COMMA, &|p: &str| p.contains(',')),
    ] {
        if pools.iter().any(|pool| breaks(&pool.path)) {
            broken.push(rule);
        }
    }
    if pools.iter().any(|p| !matches!(p.accounting.as_deref(), None | Some("free" | "requests"))) {
        broken.push(POOL_ACCOUNTING);
    }
    let config = &spec.config;
    let object_name = |name: &Option<String>| name.as_deref().is_some_and(crate::deciding::layout::is_dns_subdomain);
    if config.publish_capacity == Some(true)
        && !object_name(&config.capacity_provisioner_name)
        && !object_name(&config.provisioner_name)
    {
        broken.push(PUBLISH_NEEDS_NAME);
    }
    broken
}

/// Whether `path` has a `.` or `..` segment (the CRD's `(^|/)[.][.]?(/|$)`).
fn has_dot_segment(path: &str) -> bool {
    path.split('/').any(|segment| segment == "." || segment == "..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> Spec {
        serde_json::from_value(value).expect("spec")
    }

    /// The CRD's messages are these, one rule each, so that the operator says what the API
    /// server would have said.
    #[test]
    fn every_rule_of_the_crd_is_checked_with_its_own_message() {
        let crd = include_str!("../../../deploy/operator/crd.yaml");
        let in_crd: Vec<&str> =
            crd.lines().filter_map(|line| line.trim().strip_prefix("message: ")).map(|m| m.trim_matches('"')).collect();
        assert_eq!(in_crd, message::ALL, "the CRD's rules and the operator's differ");
    }

    #[test]
    fn a_resource_breaking_the_rules_is_told_each_broken_rule() {
        use message::*;
        let cases = [
            (
                serde_json::json!({"pathConfig": {"path": "/a"}, "storagePools": [{"name": "a", "path": "/b"}]}),
                vec![BOTH_FORMS],
            ),
            (serde_json::json!({}), vec![NEITHER_FORM]),
            (serde_json::json!({"pathConfig": {"path": "/a"}, "imagePullPolicy": "always"}), vec![PULL_POLICY]),
            (serde_json::json!({"pathConfig": {"path": "var/hp"}}), vec![PATH_CONFIG_ABSOLUTE]),
            (serde_json::json!({"pathConfig": {}}), vec![PATH_CONFIG_ABSOLUTE]),
            (serde_json::json!({"pathConfig": {"path": "/var/../etc"}}), vec![PATH_CONFIG_SEGMENTS]),
            (serde_json::json!({"pathConfig": {"path": "/"}}), vec![PATH_CONFIG_SEGMENTS]),
            (serde_json::json!({"pathConfig": {"path": "/a,b"}}), vec![PATH_CONFIG_COMMA]),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/a", "pvcTemplate": {}}, {"name": "a", "path": "/b"}]}),
                vec![POOL_NAMES_UNIQUE],
            ),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/a", "accounting": "Requests"}]}),
                vec![POOL_ACCOUNTING],
            ),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/a"}], "config": {"publishCapacity": true}}),
                vec![PUBLISH_NEEDS_NAME],
            ),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/a"}],
                    "config": {"publishCapacity": true, "provisionerName": "kubevirt.io/hostpath-provisioner"}}),
                vec![PUBLISH_NEEDS_NAME],
            ),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/a"}, {"name": "b", "path": "/a"}]}),
                vec![POOL_PATHS_UNIQUE],
            ),
            (
                serde_json::json!({"storagePools": [{"name": "a", "path": "/var/hp"}, {"name": "b", "path": "/var/hp/fast"}]}),
                vec![POOL_INSIDE_POOL],
            ),
            (serde_json::json!({"storagePools": [{"name": "a", "path": "rel"}]}), vec![POOL_ABSOLUTE]),
            (serde_json::json!({"storagePools": [{"name": "a", "path": "/x/./y"}]}), vec![POOL_SEGMENTS]),
            (serde_json::json!({"storagePools": [{"name": "a", "path": "/x,y"}]}), vec![POOL_COMMA]),
        ];
        for (value, expected) in cases {
            assert_eq!(broken_rules(&spec(value.clone())), expected, "{value}");
        }
    }

    #[test]
    fn the_examples_and_near_misses_break_no_rule() {
        for value in [
            serde_json::json!({"pathConfig": {"path": "/var/hpvolumes"}, "imagePullPolicy": "Always"}),
            serde_json::json!({"storagePools": [{"name": "a", "path": "/var/hp"}, {"name": "b", "path": "/var/hpx"}]}),
            serde_json::json!({"storagePools": [{"name": "a", "path": "/var/..hidden"}], "imagePullPolicy": ""}),
            // One pool over two disks, with options, and capacity published under an object name.
            serde_json::json!({"storagePools": [
                {"name": "data", "path": "/mnt/disk1", "reserve": "1Gi", "accounting": "requests"},
                {"name": "data", "path": "/mnt/disk2", "reserve": 1024, "requireMountpoint": true}],
                "config": {"publishCapacity": true, "provisionerName": "hostpath.example.org"}}),
            // The first name kept, capacity published under a second.
            serde_json::json!({"pathConfig": {"path": "/var/hpvolumes"},
                "config": {"publishCapacity": true, "capacityProvisionerName": "hostpath.example.org"}}),
        ] {
            assert!(broken_rules(&spec(value.clone())).is_empty(), "{value}");
        }
        for example in ["legacy", "storage-pool", "pvc-template", "shared-pvc-template"] {
            let path = format!("{}/deploy/operator/examples/{example}.yaml", env!("CARGO_MANIFEST_DIR"));
            let resource: super::super::resource::HostPathProvisioner =
                serde_saphyr::from_str(&std::fs::read_to_string(&path).expect("example")).expect("parses");
            assert!(broken_rules(&resource.spec).is_empty(), "{example}");
        }
    }
}
