//! What a StorageClass asks for: its binding mode and its parameters, read the same way on
//! every node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;

use crate::deciding::layout;
use crate::deciding::node_affinity;
use crate::deciding::path_pattern::{self, PathPattern};
use crate::deciding::quota::{self, QuotaMode};
use crate::deciding::refusal::Refusal;
use crate::deciding::settings::DecisionConfig;
use crate::deciding::topology::{self, Topology};
use crate::keys;

/// Binding mode of a class.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BindingMode {
    /// Provision as soon as the claim exists.
    Immediate,
    /// Provision on the node the scheduler picked for the first pod.
    WaitForFirstConsumer,
}

impl BindingMode {
    /// The class's mode (Immediate when unset, as the API server defaults it).
    pub fn of(class: &StorageClass) -> BindingMode {
        match class.volume_binding_mode.as_deref() {
            Some("WaitForFirstConsumer") => BindingMode::WaitForFirstConsumer,
            _ => BindingMode::Immediate,
        }
    }
}

/// The class name of a claim: the beta annotation wins over `spec.storageClassName`.
pub fn claim_class_name(claim: &PersistentVolumeClaim) -> Option<&str> {
    keys::annotation(&claim.metadata, keys::STORAGE_CLASS_BETA)
        .or_else(|| claim.spec.as_ref().and_then(|s| s.storage_class_name.as_deref()))
        .filter(|name| !name.is_empty())
}

/// StorageClass parameters we understand. Anything else is refused so that a typo never
/// silently provisions something other than what the admin asked for. `pvDir` is the torchbox
/// provisioner's parameter, accepted when it names a configured shared pool's root.
pub const KNOWN_PARAMETERS: &[&str] = &[
    "storagePool",
    topology::PARAMETER,
    "pvDir",
    quota::PARAMETER,
    VOLUME_TYPE,
    NODE_LOCAL_SHARING,
    OWNER_UID,
    OWNER_GID,
    DIR_MODE,
    path_pattern::PARAMETER,
    node_affinity::PARAMETER,
    crate::deciding::block::ALLOCATION_PARAMETER,
];

/// Class parameter: which kind of PV is written (`hostPath`, the default, or `local`).
pub const VOLUME_TYPE: &str = "volumeType";
/// Class parameter: `"true"` lets several pods of the volume's node share a node volume
/// (ReadWriteMany and ReadOnlyMany accepted; the PV keeps its node affinity).
pub const NODE_LOCAL_SHARING: &str = "nodeLocalSharing";

/// Class parameter: the uid that owns a new volume's directory (decimal).
pub const OWNER_UID: &str = "uid";
/// Class parameter: its gid (decimal); also written on the PV as `pv.beta.kubernetes.io/gid`, so
/// the kubelet adds it to the supplemental groups of every pod using the volume.
pub const OWNER_GID: &str = "gid";
/// Class parameter: the directory's mode (octal, such as `0770` or `2775`), in place of the
/// provisioner's `DIR_MODE`.
pub const DIR_MODE: &str = "mode";

/// Owner, group and mode a class gives its new volumes' directories (each `None`: as without
/// the parameter: root, root, `DIR_MODE`). Applied when the directory is made, never later: a
/// volume's owner afterwards is its workload's business.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ownership {
    /// `uid`.
    pub uid: Option<u32>,
    /// `gid`.
    pub gid: Option<u32>,
    /// `mode`.
    pub mode: Option<u32>,
}

impl Ownership {
    /// Whether the class sets any of the three.
    pub fn is_set(&self) -> bool {
        self.uid.is_some() || self.gid.is_some() || self.mode.is_some()
    }
}

/// A uid or gid as a class writes it: decimal, below 2^32 - 1 (which chown reads as "leave
/// unchanged").
fn parse_id(value: &str) -> Option<u32> {
    if value.is_empty() || !value.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    value.parse::<u32>().ok().filter(|id| *id != u32::MAX)
}

/// A mode as a class writes it: octal digits (`0770`, `770`, `2775`), at most `07777`.
fn parse_mode(value: &str) -> Option<u32> {
    let digits = value.strip_prefix("0o").unwrap_or(value);
    if digits.is_empty() || digits.len() > 5 || !digits.bytes().all(|b| (b'0'..=b'7').contains(&b)) {
        return None;
    }
    u32::from_str_radix(digits, 8).ok().filter(|mode| *mode <= 0o7777)
}

/// The kind of PV written for a volume. The directory, the node affinity and the reclaim are the
/// same; what differs is what the kubelet does with it: a `local` PV gets the pod's `fsGroup`
/// applied and its usage reported in the kubelet's volume stats, and file-system backup tools
/// that skip hostPath volumes back it up.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum VolumeType {
    /// `spec.hostPath` (the Go build's PVs).
    #[default]
    HostPath,
    /// `spec.local`, bound to its node by the node affinity.
    Local,
}

impl VolumeType {
    /// Accepted parameter values.
    pub const ALL: [VolumeType; 2] = [VolumeType::HostPath, VolumeType::Local];

    /// The parameter value.
    pub fn as_str(self) -> &'static str {
        match self {
            VolumeType::HostPath => "hostPath",
            VolumeType::Local => "local",
        }
    }

    fn parse(value: &str) -> Option<VolumeType> {
        Self::ALL.into_iter().find(|t| t.as_str() == value)
    }
}

/// What a class asks for, once its parameters are read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClassRequest {
    /// The shape.
    pub topology: Topology,
    /// The pool name (`storagePool`, the pool whose root `pvDir` names, or the default).
    pub pool: Option<String>,
    /// The `quota` parameter.
    pub quota: QuotaMode,
    /// The `volumeType` parameter.
    pub volume_type: VolumeType,
    /// The `nodeLocalSharing` parameter.
    pub node_local_sharing: bool,
    /// The `uid`, `gid` and `mode` parameters.
    pub ownership: Ownership,
    /// The `pathPattern` parameter: directories named from the claim, and reused.
    pub path_pattern: Option<PathPattern>,
    /// The `nodeAffinityKey` parameter: volumes pinned to the nodes carrying this label's value.
    pub node_affinity_key: Option<String>,
}

impl ClassRequest {
    /// Access modes a volume of this class can honour: the shape's, and for a node volume shared
    /// by the pods of its node, the many-pod modes too (every user is on that node).
    pub fn access_modes(&self) -> &'static [&'static str] {
        match self.topology {
            Topology::Node if self.node_local_sharing => {
                &["ReadWriteOnce", "ReadWriteOncePod", "ReadWriteMany", "ReadOnlyMany"]
            }
            topology => topology.access_modes(),
        }
    }
}

/// Reads a class's parameters: unknown keys and values are refusals. Needs no pool of this node
/// except to resolve `pvDir` and the default pool, so every node reads a class the same way.
pub fn class_request(class: &StorageClass, class_name: &str, config: &DecisionConfig) -> Result<ClassRequest, Refusal> {
    let empty = BTreeMap::new();
    let params = class.parameters.as_ref().unwrap_or(&empty);
    if let Some(key) = params.keys().find(|k| !KNOWN_PARAMETERS.contains(&k.as_str())) {
        return Err(Refusal::UnknownParameter {
            class: class_name.to_owned(),
            key: key.clone(),
            known: KNOWN_PARAMETERS.join(", "),
        });
    }
    let bad = |key: &str, value: &str, accepted: String| Refusal::BadParameter {
        class: class_name.to_owned(),
        key: key.to_owned(),
        value: value.to_owned(),
        accepted,
    };
    let mut topology = match params.get(topology::PARAMETER) {
        None => None,
        Some(value) => Some(
            Topology::parse(value)
                .ok_or_else(|| bad(topology::PARAMETER, value, Topology::ALL.map(Topology::as_str).join(", ")))?,
        ),
    };
    let quota = QuotaMode::parse(params.get(quota::PARAMETER).map(String::as_str))
        .map_err(|value| bad(quota::PARAMETER, &value, "none, enforce".to_owned()))?;
    let mut pool = params.get("storagePool").cloned();
    if let Some(pv_dir) = params.get("pvDir") {
        // The torchbox provisioner's class: its directory must be one of our shared pools.
        let shared = config
            .pools
            .iter()
            .find(|p| p.shared && layout::normalise(pv_dir).is_ok_and(|dir| dir == p.root))
            .ok_or_else(|| {
                let roots: Vec<String> =
                    config.pools.iter().filter(|p| p.shared).map(|p| p.root.display().to_string()).collect();
                let roots = if roots.is_empty() { "none on this node".to_owned() } else { roots.join(", ") };
                bad("pvDir", pv_dir, format!("the root of a configured shared pool ({roots})"))
            })?;
        if pool.as_ref().is_some_and(|p| *p != shared.name) {
            return Err(bad("pvDir", pv_dir, "the root of the pool storagePool names, or no storagePool".to_owned()));
        }
        pool = Some(shared.name.clone());
        topology = Some(topology.unwrap_or(Topology::Shared));
    }
    let topology = topology.unwrap_or(Topology::Node);
    let volume_type = match params.get(VOLUME_TYPE) {
        None => VolumeType::HostPath,
        Some(value) => VolumeType::parse(value)
            .ok_or_else(|| bad(VOLUME_TYPE, value, VolumeType::ALL.map(VolumeType::as_str).join(", ")))?,
    };
    if volume_type == VolumeType::Local && topology != Topology::Node {
        let accepted = format!(
            "hostPath for topology {topology} (a local PV belongs to one node; a {topology} volume is reached from every node)"
        );
        return Err(bad(VOLUME_TYPE, volume_type.as_str(), accepted));
    }
    let node_local_sharing = match params.get(NODE_LOCAL_SHARING).map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(value) => return Err(bad(NODE_LOCAL_SHARING, value, "true, false".to_owned())),
    };
    if node_local_sharing && topology != Topology::Node {
        let accepted = format!("false for topology {topology}, whose volumes take ReadWriteMany already");
        return Err(bad(NODE_LOCAL_SHARING, "true", accepted));
    }
    let id = |key: &str| match params.get(key) {
        None => Ok(None),
        Some(value) => parse_id(value)
            .map(Some)
            .ok_or_else(|| bad(key, value, "a decimal id from 0 to 4294967294, such as 1000".to_owned())),
    };
    let ownership =
        Ownership {
            uid: id(OWNER_UID)?,
            gid: id(OWNER_GID)?,
            mode: match params.get(DIR_MODE) {
                None => None,
                Some(value) => Some(parse_mode(value).ok_or_else(|| {
                    bad(DIR_MODE, value, "an octal mode up to 07777, such as 0770 or 2775".to_owned())
                })?),
            },
        };
    if ownership.is_set() && topology == Topology::EveryNode {
        let key = [(OWNER_UID, ownership.uid.is_some()), (OWNER_GID, ownership.gid.is_some())]
            .into_iter()
            .find_map(|(key, set)| set.then_some(key))
            .unwrap_or(DIR_MODE);
        let value = params.get(key).cloned().unwrap_or_default();
        let accepted = "no uid, gid or mode for topology everyNode (each node makes its own copy of the directory, \
                        and those parameters are not carried to them yet); use a node or shared class"
            .to_owned();
        return Err(bad(key, &value, accepted));
    }
    let path_pattern = match params.get(path_pattern::PARAMETER) {
        None => None,
        Some(value) => Some(PathPattern::parse(value).map_err(|why| {
            bad(
                path_pattern::PARAMETER,
                value,
                format!(
                    "a pattern of {{namespace}}, {{claim}}, {{uid}} and text, such as {{namespace}}_{{claim}} ({why})"
                ),
            )
        })?),
    };
    if path_pattern.is_some() && topology == Topology::EveryNode {
        let value = params.get(path_pattern::PARAMETER).cloned().unwrap_or_default();
        let accepted = "no pathPattern for topology everyNode (each node keeps a copy of its own; a copy is never \
                        taken over); use a node or shared class"
            .to_owned();
        return Err(bad(path_pattern::PARAMETER, &value, accepted));
    }
    let node_affinity_key = match params.get(node_affinity::PARAMETER) {
        None => None,
        Some(key) if !node_affinity::is_label_key(key) => {
            return Err(bad(
                node_affinity::PARAMETER,
                key,
                "a node label key, such as example.com/disk-serial".to_owned(),
            ));
        }
        Some(key) if topology != Topology::Node => {
            let accepted = format!("no nodeAffinityKey for topology {topology} (its volumes are on no one node)");
            return Err(bad(node_affinity::PARAMETER, key, accepted));
        }
        Some(key) => Some(key.clone()),
    };
    Ok(ClassRequest {
        topology,
        pool: pool.or_else(|| config.default_pool.clone()),
        quota,
        volume_type,
        node_local_sharing,
        ownership,
        path_pattern,
        node_affinity_key,
    })
}

/// The class's topology when its parameters parse (the reconciler asks for the live nodes only
/// when a class needs them).
pub fn class_topology(class: &StorageClass, config: &DecisionConfig) -> Option<Topology> {
    class_request(class, "", config).ok().map(|r| r.topology)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::test_fixtures::{class, config};

    fn with(params: &[(&str, &str)]) -> Result<ClassRequest, Refusal> {
        let mut class = class("hpp", "WaitForFirstConsumer");
        class.parameters =
            Some(params.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<BTreeMap<_, _>>());
        class_request(&class, "hpp", &config())
    }

    #[test]
    fn a_path_pattern_is_read_and_a_bad_one_refused_saying_why() {
        let request = with(&[("pathPattern", "{namespace}_{claim}")]).unwrap();
        let pattern = request.path_pattern.expect("pattern");
        assert_eq!(pattern.resolve("ns", "data", "0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182").unwrap(), "ns_data");
        assert_eq!(with(&[]).unwrap().path_pattern, None);
        let refusal = with(&[("pathPattern", "{namespace}/{claim}")]).unwrap_err().to_string();
        assert!(refusal.contains("pathPattern") && refusal.contains("contains '/'"), "{refusal}");
        let refusal = with(&[("pathPattern", "{claim}")]).unwrap_err().to_string();
        assert!(refusal.contains("{namespace}_{claim}"), "{refusal}");
        let refusal =
            with(&[("pathPattern", "{namespace}_{claim}"), ("topology", "everyNode")]).unwrap_err().to_string();
        assert!(refusal.contains("everyNode"), "{refusal}");
        assert!(with(&[("pathPattern", "{namespace}_{claim}"), ("topology", "shared"), ("storagePool", "x")]).is_ok());
    }

    #[test]
    fn owner_group_and_mode_are_read_from_the_class() {
        let request = with(&[("uid", "1000"), ("gid", "2000"), ("mode", "2770")]).unwrap();
        assert_eq!(request.ownership, Ownership { uid: Some(1000), gid: Some(2000), mode: Some(0o2770) });
        assert_eq!(with(&[("mode", "0750")]).unwrap().ownership.mode, Some(0o750));
        assert_eq!(with(&[("uid", "0")]).unwrap().ownership.uid, Some(0));
        assert_eq!(with(&[]).unwrap().ownership, Ownership::default());
        assert!(!Ownership::default().is_set());
    }

    #[test]
    fn malformed_owner_group_or_mode_is_refused_saying_what_is_accepted() {
        for (key, value) in [
            ("uid", "-1"),
            ("uid", "4294967295"),
            ("uid", "99999999999"),
            ("uid", "alice"),
            ("gid", ""),
            ("gid", "1e3"),
            ("mode", "0778"),
            ("mode", "17777"),
            ("mode", "rwx"),
            ("mode", ""),
        ] {
            match with(&[(key, value)]) {
                Err(Refusal::BadParameter { key: refused, value: seen, accepted, .. }) => {
                    assert_eq!((refused.as_str(), seen.as_str()), (key, value));
                    assert!(accepted.contains("such as"), "{accepted}");
                }
                other => panic!("{key}={value}: {other:?}"),
            }
        }
    }

    #[test]
    fn every_node_classes_refuse_ownership_until_their_copies_carry_it() {
        match with(&[("topology", "everyNode"), ("mode", "0700")]) {
            Err(Refusal::BadParameter { key, accepted, .. }) => {
                assert_eq!(key, "mode");
                assert!(accepted.contains("everyNode"), "{accepted}");
            }
            other => panic!("{other:?}"),
        }
        assert!(with(&[("topology", "everyNode")]).is_ok());
    }
}
