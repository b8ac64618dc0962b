//! Whose a `pathPattern` directory is (issue #44): a name is unique within one pattern only, so
//! two classes of one pool (`{namespace}_{claim}` beside `{claim}_{namespace}`), or a namespace
//! deleted and its name given to someone else, can resolve another tenant's claim to the same
//! directory. The PV name in the marker says nothing about the claim, so the provisioner records
//! beside it who the directory was made for, and a directory is taken over only by that same
//! claim, or by one an admin names on its Namespace (tenants cannot write Namespace objects).
//!
//! The record is a second extended attribute, [`OWNER_XATTR`]: `user.hostpath-provisioner.pv`
//! keeps the bare PV name, so that the earlier version, after a rollback, still reads it and
//! deletes by it as before.

use std::fmt;

use crate::deciding::layout;

/// The extended attribute holding the [`OwnerRecord`] (the PV name stays alone in
/// `filesystem::MARKER_XATTR`, which the earlier version reads).
pub const OWNER_XATTR: &str = "user.hostpath-provisioner.owner";

/// Namespace annotation by which an admin hands pattern directories to the namespace's claims
/// whoever they were made for: directory names, comma-separated. On the Namespace because a
/// tenant may annotate its own claims but not, with the built-in `admin` and `edit` roles, its
/// Namespace: an annotation on the claim would let a tenant name someone else's directory.
pub const ADOPT_DIRECTORY: &str = "hostpath-provisioner.kubevirt.io/adopt-directory";

/// Who asks for, or was given, a pattern directory: the claim's namespace (its UID too, which a
/// namespace made again under the same name does not keep), the claim's name and its class.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ClaimIdentity {
    /// `metadata.uid` of the claim's Namespace.
    pub namespace_uid: String,
    /// The claim's namespace.
    pub namespace: String,
    /// The claim's name.
    pub claim: String,
    /// The claim's StorageClass.
    pub class: String,
}

impl fmt::Display for ClaimIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "claim {}/{} of StorageClass {} (namespace uid {})",
            self.namespace, self.claim, self.class, self.namespace_uid
        )
    }
}

/// What [`OWNER_XATTR`] holds: the PV the record was written with, and the claim. A record
/// whose PV is not the one the marker names is stale (the earlier version, after a rollback,
/// took the directory over and rewrote the marker only) and counts as no record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OwnerRecord {
    /// The PV the marker named when this was written.
    pub pv: String,
    /// Whose the directory is.
    pub owner: ClaimIdentity,
}

/// At most: five keys and values of at most 253 bytes (a PV, claim and class name), a 63-byte
/// namespace and a UID.
pub const MAX_OWNER_RECORD_BYTES: usize = 1024;

impl OwnerRecord {
    /// The attribute's value: `key=value` pairs separated by spaces, readable with `getfattr`.
    /// No value can hold a space or `=` (all are DNS names or a UID).
    pub fn to_xattr(&self) -> String {
        let o = &self.owner;
        format!(
            "pv={} namespace-uid={} namespace={} claim={} class={}",
            self.pv, o.namespace_uid, o.namespace, o.claim, o.class
        )
    }

    /// Reads an attribute's value; `None` for anything but exactly the five keys, each once,
    /// with a well-formed value (a record written by hand, or damaged, proves no ownership).
    pub fn parse(value: &str) -> Option<OwnerRecord> {
        let (mut pv, mut namespace_uid, mut namespace, mut claim, mut class) = (None, None, None, None, None);
        for pair in value.split(' ') {
            let (key, value) = pair.split_once('=')?;
            let slot = match key {
                "pv" => &mut pv,
                "namespace-uid" => &mut namespace_uid,
                "namespace" => &mut namespace,
                "claim" => &mut claim,
                "class" => &mut class,
                _ => return None,
            };
            if slot.replace(value.to_owned()).is_some() {
                return None;
            }
        }
        let record = OwnerRecord {
            pv: pv?,
            owner: ClaimIdentity { namespace_uid: namespace_uid?, namespace: namespace?, claim: claim?, class: class? },
        };
        let o = &record.owner;
        let well_formed = layout::is_dns_subdomain(&record.pv)
            && layout::is_uid(&o.namespace_uid)
            && layout::is_dns_label(&o.namespace)
            && layout::is_dns_subdomain(&o.claim)
            && layout::is_dns_subdomain(&o.class);
        well_formed.then_some(record)
    }
}

/// What is known of a directory made before owner records existed, whose PV still names its
/// claim: an upgrade gives such a directory its record while the PV can still say whose it is,
/// so that the claim made again later gets its data back without an admin.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EarlierDirectory<'a> {
    /// The PV, and what its marker names.
    pub pv: &'a str,
    pub marker_names: Option<&'a str>,
    /// The record the directory holds already, if any.
    pub record: Option<&'a OwnerRecord>,
    /// The PV's `claimRef` and class.
    pub claim_namespace: &'a str,
    pub claim: &'a str,
    pub class: &'a str,
    /// When the PV was made.
    pub pv_created: jiff::Timestamp,
    /// The claim's Namespace as it is now (`None`: gone), with when it was made.
    pub namespace: Option<(&'a str, jiff::Timestamp)>,
}

/// The record to write on an [`EarlierDirectory`], or `None` to leave it as it is: it has one
/// for its PV already, its marker names another PV, or its namespace is gone or younger than
/// the PV (deleted and made again since: perhaps someone else's, so only an admin may hand the
/// directory to it).
pub fn record_for_earlier_directory(dir: &EarlierDirectory<'_>) -> Option<OwnerRecord> {
    if dir.marker_names != Some(dir.pv) || dir.record.is_some_and(|r| r.pv == dir.pv) {
        return None;
    }
    let (namespace_uid, namespace_created) = dir.namespace?;
    if namespace_created > dir.pv_created {
        return None;
    }
    let record = OwnerRecord {
        pv: dir.pv.to_owned(),
        owner: ClaimIdentity {
            namespace_uid: namespace_uid.to_owned(),
            namespace: dir.claim_namespace.to_owned(),
            claim: dir.claim.to_owned(),
            class: dir.class.to_owned(),
        },
    };
    // Only what parses back: a record that would not read as one proves nothing.
    OwnerRecord::parse(&record.to_xattr()).filter(|parsed| *parsed == record)
}

/// Whether the Namespace annotation [`ADOPT_DIRECTORY`] (`value`) hands the directory `dir` to
/// the namespace's claims: one of its comma-separated entries is exactly that name.
pub fn handed_over(value: Option<&str>, dir: &str) -> bool {
    value.is_some_and(|value| value.split(',').any(|entry| entry.trim() == dir))
}
