//! A `HostPathSnapshot` made again from a saved copy of itself (a backup restored, a manifest
//! re-applied after the cluster was rebuilt) names a point in time that has passed. Taking a new
//! copy would silently hand back today's data under yesterday's name; so the object is told
//! apart from a new snapshot, and either gets the very copy it names back or is refused, saying
//! how to take a new one (docs/snapshots.md, "Snapshots made again").
//!
//! How it is told apart: when a node starts a copy it annotates the object with the copy's name
//! (the object's UID, [`COPY_UID`]) and its node ([`COPY_NODE`]). Backups and manifests keep
//! annotations, never UIDs: an object whose [`COPY_UID`] is not its own UID names the copy of an
//! earlier object. A snapshot without the annotations is a new one, taken now.
//!
//! Whose a copy is: the holder writes a [`CopyRecord`] on the copy ([`RECORD_XATTR`]) naming the
//! snapshot's namespace (and its UID, which a namespace deleted and made again by someone else
//! does not keep) and name, and what the status said. A copy goes to an object only of the same
//! namespace and name, while no object of its own UID exists (one copy is never given to two
//! snapshots, whose deletions would each trash it), and from a namespace made again only when an
//! admin names the copy on the Namespace ([`ADOPT_COPY`]; tenants cannot write Namespaces).
//! Annotations are the tenant's to write; what they name is only ever checked against the disk
//! and the record, so a forged one gets a refusal, never another tenant's copy.

use std::fmt;

use crate::deciding::layout;

use super::HostPathSnapshot;

/// Snapshot annotation: the UID the copy was taken under (the name of its directory).
pub const COPY_UID: &str = "hostpath-provisioner.kubevirt.io/copy-uid";
/// Snapshot annotation: the node holding the copy.
pub const COPY_NODE: &str = "hostpath-provisioner.kubevirt.io/copy-node";
/// Namespace annotation by which an admin hands copies recorded for an earlier namespace of the
/// same name to this one's snapshots: copy UIDs, comma-separated.
pub const ADOPT_COPY: &str = "hostpath-provisioner.kubevirt.io/adopt-snapshot-copy";
/// The extended attribute on a copy's directory holding its [`CopyRecord`].
pub const RECORD_XATTR: &str = "user.hostpath-provisioner.snapshot";
/// At most: nine keys, three UIDs, a 63-byte namespace, two 253-byte names and short values.
pub const MAX_RECORD_BYTES: usize = 1024;

/// What the holder records on a copy: whose it is and what its snapshot's status said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CopyRecord {
    /// The UID of the snapshot the copy is (now) the copy of.
    pub snapshot_uid: String,
    /// `metadata.uid` of the snapshot's Namespace.
    pub namespace_uid: String,
    /// The snapshot's namespace.
    pub namespace: String,
    /// The snapshot's name.
    pub name: String,
    /// When the copy was made (RFC 3339).
    pub taken: String,
    /// How it was copied (`snapshot`, `reflink`, `bytes`).
    pub method: String,
    /// The source's capacity (a quantity).
    pub restore_size: String,
    /// Bytes of file data in the copy.
    pub size_bytes: u64,
    /// A copy of a Block volume (its backing file): an object made again gets the
    /// volume-mode annotation back before it is ready. Written as `volume-mode=Block`, absent
    /// for a Filesystem volume's copy (whose record reads as before).
    pub block: bool,
}

impl CopyRecord {
    /// The attribute's value: `key=value` pairs separated by spaces, readable with `getfattr`.
    /// No value holds a space or `=` (names, UIDs, a timestamp, a quantity, a number).
    pub fn to_xattr(&self) -> String {
        format!(
            "snapshot-uid={} namespace-uid={} namespace={} name={} taken={} method={} restore-size={} size-bytes={}{}",
            self.snapshot_uid,
            self.namespace_uid,
            self.namespace,
            self.name,
            self.taken,
            self.method,
            self.restore_size,
            self.size_bytes,
            if self.block { " volume-mode=Block" } else { "" }
        )
    }

    /// Reads an attribute's value; `None` for anything but exactly the eight keys (and
    /// `volume-mode=Block` for a Block volume's copy), each once, with well-formed values (a
    /// record written by hand, or damaged, proves nothing).
    pub fn parse(value: &str) -> Option<CopyRecord> {
        let mut fields: [Option<&str>; 9] = [None; 9];
        const KEYS: [&str; 9] = [
            "snapshot-uid",
            "namespace-uid",
            "namespace",
            "name",
            "taken",
            "method",
            "restore-size",
            "size-bytes",
            "volume-mode",
        ];
        for pair in value.split(' ') {
            let (key, value) = pair.split_once('=')?;
            let slot = KEYS.iter().position(|k| *k == key)?;
            if fields[slot].replace(value).is_some() || value.is_empty() || value.contains('=') {
                return None;
            }
        }
        let [
            Some(snapshot_uid),
            Some(namespace_uid),
            Some(namespace),
            Some(name),
            Some(taken),
            Some(method),
            Some(restore_size),
            Some(size_bytes),
            volume_mode,
        ] = fields
        else {
            return None;
        };
        let well_formed = layout::is_uid(snapshot_uid)
            && layout::is_uid(namespace_uid)
            && layout::is_dns_subdomain(namespace)
            && layout::is_dns_subdomain(name);
        let size_bytes = size_bytes.parse().ok()?;
        let block = match volume_mode {
            None => false,
            Some("Block") => true,
            Some(_) => return None,
        };
        well_formed.then(|| CopyRecord {
            snapshot_uid: snapshot_uid.to_owned(),
            namespace_uid: namespace_uid.to_owned(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            taken: taken.to_owned(),
            method: method.to_owned(),
            restore_size: restore_size.to_owned(),
            size_bytes,
            block,
        })
    }
}

/// Where an object's copy comes from, as its annotations say.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Provenance {
    /// No copy annotation, or one naming this object's own UID: its own copy, taken or to take.
    Own,
    /// Made again from a saved copy of an earlier object: it names that object's copy.
    MadeAgain {
        /// The earlier object's UID: the name of the copy's directory.
        copy_uid: String,
        /// The node that held it.
        node: String,
    },
    /// Annotations that name no copy (one without the other, or not a UID or node name):
    /// refused, saying which.
    Malformed(String),
}

impl fmt::Display for Provenance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Provenance::Own => write!(f, "its own copy"),
            Provenance::MadeAgain { copy_uid, node } => write!(f, "copy {copy_uid} on node {node}"),
            Provenance::Malformed(why) => write!(f, "{why}"),
        }
    }
}

/// Reads the object's copy annotations.
pub fn provenance(snapshot: &HostPathSnapshot) -> Provenance {
    let annotations = snapshot.metadata.annotations.as_ref();
    let copy_uid = annotations.and_then(|a| a.get(COPY_UID));
    let node = annotations.and_then(|a| a.get(COPY_NODE));
    let own = snapshot.metadata.uid.as_deref();
    match (copy_uid, node) {
        (None, _) => Provenance::Own,
        (Some(uid), _) if Some(uid.as_str()) == own => Provenance::Own,
        (Some(uid), Some(node)) if layout::is_uid(uid) && layout::is_dns_subdomain(node) => {
            Provenance::MadeAgain { copy_uid: uid.clone(), node: node.clone() }
        }
        (Some(uid), node) => Provenance::Malformed(format!(
            "the annotations {COPY_UID}={uid:?} and {COPY_NODE}={:?} name no copy (a UID and a node name are needed); \
             remove both to take a new snapshot now",
            node.map_or("", String::as_str)
        )),
    }
}

/// The annotations a snapshot whose copy is `copy_uid` on `node` carries.
pub fn annotations_for(copy_uid: &str, node: &str) -> [(&'static str, String); 2] {
    [(COPY_UID, copy_uid.to_owned()), (COPY_NODE, node.to_owned())]
}

/// Whether the object already carries the annotations naming `copy_uid` on `node`.
pub fn annotated(snapshot: &HostPathSnapshot, copy_uid: &str, node: &str) -> bool {
    let annotations = snapshot.metadata.annotations.as_ref();
    annotations.and_then(|a| a.get(COPY_UID)).map(String::as_str) == Some(copy_uid)
        && annotations.and_then(|a| a.get(COPY_NODE)).map(String::as_str) == Some(node)
}

/// Where the node named by a made-again object found the copy it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundAt {
    /// Nowhere on its pool roots.
    Nowhere,
    /// Under the earlier object's UID, as it was left.
    Earlier,
    /// Under the object's own UID: an adoption cut short after the rename, or the object's own
    /// copy whose annotations were edited since.
    Own,
}

/// What the node named by a made-again object found, for [`adoption`].
#[derive(Clone, Debug)]
pub struct AdoptionFacts<'a> {
    /// The made-again object.
    pub snapshot: &'a HostPathSnapshot,
    /// The copy it names.
    pub copy_uid: &'a str,
    /// Where the copy is.
    pub found: FoundAt,
    /// The record of what was found, when it has one that reads.
    pub record: Option<&'a CopyRecord>,
    /// The name of an existing object of the copy's UID in the namespace, if there is one.
    pub owner_alive: Option<&'a str>,
    /// `metadata.uid` of the object's Namespace.
    pub namespace_uid: &'a str,
    /// The Namespace's [`ADOPT_COPY`] annotation.
    pub adopt_annotation: Option<&'a str>,
}

/// Whether the made-again object gets the copy it names.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adoption {
    /// It does: renamed to the object's UID (when found under the earlier one), and the status
    /// rebuilt from the record.
    Adopt(CopyRecord),
    /// It does not: say why and what to do; nothing is copied.
    Refuse(String),
}

/// Decides a made-again object's copy. Every refusal says how to take a new snapshot instead.
pub fn adoption(facts: &AdoptionFacts<'_>) -> Adoption {
    let snapshot = facts.snapshot;
    let namespace = snapshot.metadata.namespace.as_deref().unwrap_or_default();
    let name = snapshot.metadata.name.as_deref().unwrap_or_default();
    let own_uid = snapshot.metadata.uid.as_deref().unwrap_or_default();
    let copy = facts.copy_uid;
    let instead =
        format!("to take a new snapshot of the claim as it is now, remove the annotations {COPY_UID} and {COPY_NODE}");
    // The record must be of the directory it was read from (or, under the object's own UID,
    // of the copy an adoption renamed there).
    let recorded_for: &[&str] = match facts.found {
        FoundAt::Nowhere => {
            return Adoption::Refuse(format!(
                "this snapshot was made again from a saved copy naming copy {copy}, which is no longer on its node \
                 (it left with its snapshot, or its orphan grace ran out): it is not taken again, which would give \
                 today's data under an earlier point in time; {instead}"
            ));
        }
        FoundAt::Earlier => &[copy],
        FoundAt::Own => &[copy, own_uid],
    };
    // A copy under the object's own UID is this object's whoever else lives; one under another
    // UID is never given to a second snapshot while the first exists.
    if let (FoundAt::Earlier, Some(owner)) = (facts.found, facts.owner_alive) {
        return Adoption::Refuse(format!(
            "copy {copy} belongs to snapshot {owner:?}, which exists: one copy is never given to two snapshots; {instead}"
        ));
    }
    let Some(record) = facts.record.filter(|r| recorded_for.contains(&r.snapshot_uid.as_str())) else {
        return Adoption::Refuse(format!(
            "copy {copy} has no record of whose it is (made by an earlier version, or damaged), so it is given to \
             nobody; {instead}"
        ));
    };
    if record.namespace != namespace || record.name != name {
        return Adoption::Refuse(format!(
            "copy {copy} was taken for snapshot {}/{}, not for {namespace}/{name}: a copy goes back only to a \
             snapshot of the same namespace and name; {instead}",
            record.namespace, record.name
        ));
    }
    let handed_over = facts.adopt_annotation.is_some_and(|v| v.split(',').any(|entry| entry.trim() == copy));
    if record.namespace_uid != facts.namespace_uid && !handed_over {
        return Adoption::Refuse(format!(
            "copy {copy} was taken in namespace {namespace} of uid {}, and this namespace (uid {}) was made since: \
             if the copy is meant for it, an admin annotates Namespace {namespace} with {ADOPT_COPY}={copy}; {instead}",
            record.namespace_uid, facts.namespace_uid
        ));
    }
    Adoption::Adopt(record.clone())
}

#[cfg(test)]
#[path = "recreation_tests.rs"]
mod tests;
