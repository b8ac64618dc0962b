//! The core Kubernetes objects a resource embeds (`workload.affinity`, `workload.tolerations[]`,
//! a pool's `pvcTemplate`), read into the k8s-openapi types strictly.
//!
//! The CRD keeps them free-form (`x-kubernetes-preserve-unknown-fields`), so the API server
//! stores whatever is written there, and the k8s-openapi types skip a key they do not know. Read
//! that way, a typo (`operater: Exists`, `resources.request`) would vanish without a word and
//! the pods would run with a placement or a claim nobody wrote. Every key the type does not know
//! is named instead, with its full path in the resource, so that the status can say what to fix.

use serde::de::DeserializeOwned;
use serde_json::Value;

/// Why an embedded object cannot be used as written.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EmbeddedError {
    /// Not the type at all (a string where an object goes, a wrong value type).
    #[error("{at} is not a Kubernetes {kind} ({reason}): correct it as for {as_for}")]
    Malformed { at: String, kind: &'static str, as_for: &'static str, reason: String },
    /// Keys the type does not have, each with its path in the resource.
    #[error(
        "{}: no such field in a Kubernetes {kind} (a typo?); correct or remove it, as for {as_for}",
        fields.join(", ")
    )]
    UnknownFields { fields: Vec<String>, kind: &'static str, as_for: &'static str },
}

/// What an embedded object is, for the messages.
#[derive(Clone, Copy, Debug)]
pub struct Kind {
    /// The core type's name (`Toleration`).
    pub name: &'static str,
    /// Where users know it from (`a pod's spec.tolerations`).
    pub as_for: &'static str,
}

/// Reads `value`, found at `at` in the resource (`spec.workload.affinity`), as a `T`, refusing
/// any key `T` does not have.
pub fn parse<T: DeserializeOwned>(value: &Value, at: &str, kind: Kind) -> Result<T, EmbeddedError> {
    let mut unknown = Vec::new();
    let parsed =
        serde_ignored::deserialize(value, |path| unknown.push(format!("{at}{}", suffix(&path)))).map_err(|e| {
            EmbeddedError::Malformed { at: at.to_owned(), kind: kind.name, as_for: kind.as_for, reason: e.to_string() }
        })?;
    if unknown.is_empty() {
        Ok(parsed)
    } else {
        Err(EmbeddedError::UnknownFields { fields: unknown, kind: kind.name, as_for: kind.as_for })
    }
}

/// A path below the object as the resource spells it: `.key` for a field, `[i]` for an item.
fn suffix(path: &serde_ignored::Path) -> String {
    match path {
        serde_ignored::Path::Root => String::new(),
        serde_ignored::Path::Seq { parent, index } => format!("{}[{index}]", suffix(parent)),
        serde_ignored::Path::Map { parent, key } => format!("{}.{key}", suffix(parent)),
        serde_ignored::Path::Some { parent }
        | serde_ignored::Path::NewtypeStruct { parent }
        | serde_ignored::Path::NewtypeVariant { parent } => suffix(parent),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{Affinity, PersistentVolumeClaimSpec, Toleration};
    use serde_json::json;

    use super::*;

    const TOLERATION: Kind = Kind { name: "Toleration", as_for: "a pod's spec.tolerations" };
    const AFFINITY: Kind = Kind { name: "Affinity", as_for: "a pod's spec.affinity" };
    const CLAIM: Kind = Kind { name: "PersistentVolumeClaimSpec", as_for: "a claim's spec" };

    fn unknown<T: DeserializeOwned + std::fmt::Debug>(value: Value, at: &str, kind: Kind) -> Vec<String> {
        match parse::<T>(&value, at, kind) {
            Err(EmbeddedError::UnknownFields { fields, .. }) => fields,
            other => panic!("{value}: expected unknown fields, got {other:?}"),
        }
    }

    #[test]
    fn a_misspelt_toleration_field_is_named_with_its_path() {
        let fields = unknown::<Toleration>(
            json!({"key": "dedicated", "operater": "Exists", "effect": "NoSchedule"}),
            "spec.workload.tolerations[0]",
            TOLERATION,
        );
        assert_eq!(fields, ["spec.workload.tolerations[0].operater"]);
    }

    #[test]
    fn a_typo_deep_inside_an_affinity_is_named_with_its_path() {
        let affinity = json!({"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
            {"matchExpresions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
        ]}}, "podAfinity": {}});
        let fields = unknown::<Affinity>(affinity, "spec.workload.affinity", AFFINITY);
        assert_eq!(
            fields,
            [
                "spec.workload.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[1].matchExpresions",
                "spec.workload.affinity.podAfinity",
            ]
        );
    }

    #[test]
    fn a_typo_in_a_claim_template_is_named_and_map_keys_are_not_fields() {
        let template = json!({
            "accessModes": ["ReadWriteOnce"],
            "resources": {"request": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
            "selector": {"matchLabels": {"any-label/they-like": "x"}},
        });
        let at = "spec.storagePools[2].pvcTemplate";
        let fields = unknown::<PersistentVolumeClaimSpec>(template, at, CLAIM);
        assert_eq!(fields, ["spec.storagePools[2].pvcTemplate.resources.request"]);
    }

    #[test]
    fn a_well_formed_object_reads_as_before() {
        let value = json!({"key": "dedicated", "operator": "Equal", "value": "storage", "effect": "NoSchedule", "tolerationSeconds": 30});
        let toleration: Toleration = parse(&value, "t", TOLERATION).expect("well formed");
        assert_eq!(toleration, serde_json::from_value::<Toleration>(value).expect("reads"));
        let template = json!({"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "5Gi"}}, "storageClassName": "nfs", "volumeMode": "Filesystem"});
        let spec: PersistentVolumeClaimSpec = parse(&template, "p", CLAIM).expect("well formed");
        assert_eq!(spec, serde_json::from_value::<PersistentVolumeClaimSpec>(template).expect("reads"));
    }

    #[test]
    fn the_message_names_every_unknown_field_and_the_type() {
        let error = parse::<Toleration>(
            &json!({"keys": "a", "efect": "NoSchedule"}),
            "spec.workload.tolerations[1]",
            TOLERATION,
        )
        .expect_err("unknown fields");
        assert_eq!(
            error.to_string(),
            "spec.workload.tolerations[1].efect, spec.workload.tolerations[1].keys: no such field in a Kubernetes Toleration (a typo?); correct or remove it, as for a pod's spec.tolerations"
        );
        let error = parse::<Affinity>(&json!({"nodeAffinity": "everywhere"}), "spec.workload.affinity", AFFINITY)
            .expect_err("malformed");
        assert!(matches!(error, EmbeddedError::Malformed { .. }), "{error:?}");
        assert!(error.to_string().starts_with("spec.workload.affinity is not a Kubernetes Affinity ("), "{error}");
    }
}
