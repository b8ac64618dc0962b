//! Predictable directory names (`pathPattern`, docs/volumes.md): a StorageClass names its
//! volumes' directories from the claim, so that a claim deleted under `Retain` and made again
//! gets its data back, and an admin reading the pool sees whose each directory is.
//!
//! Three rules keep it from becoming a way to reach other data (the first `pathPattern` of
//! local-path-provisioner let a claim's fields climb out of the pool, CVE-2025-62878):
//! - a name is one directory directly under the pool root: the pattern holds no `/`, each token
//!   resolves to a checked DNS name or UID, and so no token can bring a separator or `..`;
//! - two live claims never get the same name: a pattern holds `{uid}`, or both `{namespace}`
//!   and `{claim}` with a `_` between them (a character neither can contain);
//! - the directory carries the provisioner's marker (the name of the PV it was made or adopted
//!   for) and a record of the claim it was made for ([`owner`]): an existing directory is
//!   reused only when it carries the marker, no PV holds it, and it was made for the very claim
//!   asking (or an admin handed it over), and a PV's directory is deleted only when the marker
//!   names that PV.
//!
//! Pure functions; the marker is read and written by `filesystem`.

use crate::deciding::layout;

mod owner;

pub use owner::{
    ADOPT_DIRECTORY, ClaimIdentity, EarlierDirectory, MAX_OWNER_RECORD_BYTES, OWNER_XATTR, OwnerRecord, handed_over,
    record_for_earlier_directory,
};

/// StorageClass parameter.
pub const PARAMETER: &str = "pathPattern";

/// One piece of a pattern.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Part {
    /// Text kept as it is.
    Literal(String),
    /// `{namespace}`: the claim's namespace.
    Namespace,
    /// `{claim}`: the claim's name.
    Claim,
    /// `{uid}`: the claim's UID.
    Uid,
}

impl Part {
    fn token(name: &str) -> Option<Part> {
        match name {
            "namespace" => Some(Part::Namespace),
            "claim" => Some(Part::Claim),
            "uid" => Some(Part::Uid),
            _ => None,
        }
    }
}

/// A checked `pathPattern`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PathPattern {
    text: String,
    parts: Vec<Part>,
}

/// Why a `pathPattern` value is refused (said in the class's refusal, with what is accepted).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PatternError {
    /// Nothing to resolve.
    #[error("it is empty")]
    Empty,
    /// A `/`: volumes are directories directly under the pool root.
    #[error(
        "it contains '/': a volume is one directory directly under its pool's root (use '_' or '-' between the tokens)"
    )]
    Separator,
    /// A character other than letters, digits, `.`, `_`, `-` or a token.
    #[error("it contains {0:?}; only letters, digits, '.', '_', '-' and the tokens are allowed")]
    Character(char),
    /// `{...}` of an unknown name.
    #[error("{{{0}}} is no token; the tokens are {{namespace}}, {{claim}} and {{uid}}")]
    UnknownToken(String),
    /// A `{` without its `}`.
    #[error("a '{{' is not closed")]
    Unclosed,
    /// The same token twice.
    #[error("{{{0}}} appears twice")]
    Repeated(&'static str),
    /// A leading `.`, `_` or `-`: hidden entries are the provisioner's bookkeeping (`.hpp-*`).
    #[error("it starts with {0:?}; start with a token, a letter or a digit")]
    Leading(char),
    /// Two claims could get the same directory.
    #[error(
        "two claims could get the same directory: include {{uid}}, or both {{namespace}} and {{claim}} with a '_' between them (such as {{namespace}}_{{claim}})"
    )]
    NotUnique,
}

impl PathPattern {
    /// Reads and checks a pattern.
    pub fn parse(value: &str) -> Result<PathPattern, PatternError> {
        if value.is_empty() {
            return Err(PatternError::Empty);
        }
        let mut parts = Vec::new();
        let mut rest = value;
        while !rest.is_empty() {
            if let Some(after) = rest.strip_prefix('{') {
                let end = after.find('}').ok_or(PatternError::Unclosed)?;
                let name = &after[..end];
                let part = Part::token(name).ok_or_else(|| PatternError::UnknownToken(name.to_owned()))?;
                if parts.contains(&part) {
                    return Err(PatternError::Repeated(token_name(&part)));
                }
                parts.push(part);
                rest = &after[end + 1..];
                continue;
            }
            let end = rest.find('{').unwrap_or(rest.len());
            let text = &rest[..end];
            if let Some(c) = text.chars().find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-'))) {
                return Err(if c == '/' { PatternError::Separator } else { PatternError::Character(c) });
            }
            parts.push(Part::Literal(text.to_owned()));
            rest = &rest[end..];
        }
        if let Some(Part::Literal(first)) = parts.first()
            && let Some(c) = first.chars().next().filter(|c| !c.is_ascii_alphanumeric())
        {
            return Err(PatternError::Leading(c));
        }
        let pattern = PathPattern { text: value.to_owned(), parts };
        if !pattern.is_unique() {
            return Err(PatternError::NotUnique);
        }
        Ok(pattern)
    }

    /// The pattern as the class wrote it.
    pub fn as_str(&self) -> &str {
        &self.text
    }

    /// Whether the claim's UID, or its namespace and name unambiguously, are in every name.
    /// Neither a namespace (a DNS label) nor a claim name (a DNS subdomain) holds `_`, so the
    /// first `_` after the first of the two tokens splits a name back into both.
    fn is_unique(&self) -> bool {
        if self.parts.contains(&Part::Uid) {
            return true;
        }
        let position = |wanted: Part| self.parts.iter().position(|p| *p == wanted);
        let (Some(namespace), Some(claim)) = (position(Part::Namespace), position(Part::Claim)) else {
            return false;
        };
        let (first, second) = (namespace.min(claim), namespace.max(claim));
        self.parts[first + 1..second].iter().any(|part| matches!(part, Part::Literal(text) if text.contains('_')))
    }

    /// The directory name of a claim. Every value is checked again (the API is not trusted): a
    /// name too long for a directory, or one that reads as another volume's directory of the
    /// `pvc-<uid>` layouts, is refused with what to change.
    pub fn resolve(&self, namespace: &str, claim: &str, uid: &str) -> Result<String, layout::NameError> {
        if !layout::is_uid(uid) {
            return Err(layout::NameError::BadUid(uid.to_owned()));
        }
        if !layout::is_dns_subdomain(claim) {
            return Err(layout::NameError::BadClaimName(claim.to_owned()));
        }
        if !layout::is_dns_label(namespace) {
            return Err(layout::NameError::BadNamespace(namespace.to_owned()));
        }
        let name: String = self
            .parts
            .iter()
            .map(|part| match part {
                Part::Literal(text) => text.as_str(),
                Part::Namespace => namespace,
                Part::Claim => claim,
                Part::Uid => uid,
            })
            .collect();
        if name.len() > layout::MAX_DIR_NAME_BYTES {
            return Err(layout::NameError::PatternTooLong { name_bytes: name.len() });
        }
        if let Some(other) = layout::uid_of_dir(&name).filter(|other| *other != uid).map(str::to_owned) {
            return Err(layout::NameError::PatternLooksLikeVolume { name, uid: other });
        }
        Ok(name)
    }
}

fn token_name(part: &Part) -> &'static str {
    match part {
        Part::Namespace => "namespace",
        Part::Claim => "claim",
        Part::Uid => "uid",
        Part::Literal(_) => "",
    }
}

/// What is at a pattern's directory when a claim is about to be given it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found {
    /// Nothing.
    Absent,
    /// A directory without the provisioner's marker, or something that is no directory.
    Unmarked,
    /// A directory whose marker names this PV.
    MarkedFor(String),
}

/// The facts the choice reads: what is there, what the cluster says of it, and who asks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DirectoryFacts {
    /// What is at the place.
    pub found: Found,
    /// The PV the marker names exists.
    pub marked_pv_exists: bool,
    /// A PV other than the claim's own names this directory as its path (Released under
    /// `Retain`, or being deleted).
    pub held_by: Option<String>,
    /// The directory's owner record ([`OWNER_XATTR`]), when it has one that reads; `None` for a
    /// directory of the earlier version, which recorded only the PV.
    pub recorded: Option<OwnerRecord>,
    /// The claim asking.
    pub asker: ClaimIdentity,
    /// The asker's Namespace hands this directory to its claims ([`ADOPT_DIRECTORY`]).
    pub handed_over: bool,
}

/// What a claim does about its pattern directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Placing {
    /// Make it (aside, marked for the PV and recorded for `owner`, then renamed into place only
    /// if the place is still free).
    Make {
        /// The claim it is made for.
        owner: ClaimIdentity,
    },
    /// It is this claim's already (an earlier attempt made or adopted it).
    Reuse {
        /// The owner record to write, when the one there is not the claim's (an attempt that
        /// stopped between rewriting the marker and the record).
        record: Option<ClaimIdentity>,
    },
    /// Take it over, data and all, from a PV that is gone: the marker, then the owner record,
    /// are rewritten first.
    Adopt {
        /// The PV it was made for.
        from: String,
        /// The claim taking it.
        owner: ClaimIdentity,
        /// When it was made for someone else and the admin handed it over: whose it was.
        handed_from: Option<String>,
    },
    /// Leave it, and say why.
    Refuse(Occupied),
}

/// What the event and log say of a directory without an owner record.
const UNRECORDED: &str = "an unrecorded claim (the directory was made by a version that recorded only its PV)";

/// Why a pattern directory cannot be given to a claim.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Occupied {
    /// Something not made by the provisioner is there.
    #[error(
        "{path} exists and does not carry the provisioner's marker, so it was not made for a volume; nothing was changed. Move it away, or change the class's pathPattern"
    )]
    NotMarked {
        /// The directory.
        path: String,
    },
    /// A PV still holds it.
    #[error(
        "{path} belongs to PV {pv}, which still exists; once that PV is deleted (its data is kept under Retain), a claim of this name gets the directory and its data"
    )]
    HeldBy {
        /// The directory.
        path: String,
        /// The PV.
        pv: String,
    },
    /// A clone is a copy into a new directory, never into data already there.
    #[error(
        "{path} exists (made for PV {pv}, which is gone), and a clone is copied into a new directory only; move the directory away or give the clone another name"
    )]
    CloneIntoExisting {
        /// The directory.
        path: String,
        /// The PV it was made for.
        pv: String,
    },
    /// It was made for another claim (another pattern resolving to the same name, a namespace
    /// made again under the same name) or for one nobody recorded.
    #[error("{0}")]
    OtherOwner(Box<OtherOwner>),
}

/// A pattern directory made for another claim than the one asking.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "{path} was made for {owner} (PV {pv}), not for {asker}; its data is left as it is. If it is meant for this claim, an admin annotates Namespace {namespace} with {ADOPT_DIRECTORY}={dir}",
    namespace = asker.namespace
)]
pub struct OtherOwner {
    /// The directory.
    pub path: String,
    /// Its name under the pool root (what the annotation names).
    pub dir: String,
    /// The PV it was made for.
    pub pv: String,
    /// Whose it is, as recorded.
    pub owner: String,
    /// The claim asking.
    pub asker: ClaimIdentity,
}

/// Decides what a claim whose PV will be `own_pv` does about its pattern directory at `path`.
/// A directory is taken over only when its marker shows the provisioner made it, no PV (the one
/// its marker names, or any other naming the path) holds it, and its owner record names the
/// very claim asking, or the asker's Namespace hands it over: a Released PV under `Retain`
/// keeps its data to itself until an admin deletes it, and then it goes back to its own claim
/// only.
pub fn place(own_pv: &str, path: &str, facts: &DirectoryFacts) -> Placing {
    if let Some(pv) = facts.held_by.as_deref().filter(|pv| *pv != own_pv) {
        return Placing::Refuse(Occupied::HeldBy { path: path.to_owned(), pv: pv.to_owned() });
    }
    // A record written with another PV than the marker's is stale, and proves nothing.
    let recorded = |pv: &str| facts.recorded.as_ref().filter(|r| r.pv == pv).map(|r| &r.owner);
    match &facts.found {
        Found::Absent => Placing::Make { owner: facts.asker.clone() },
        Found::Unmarked => Placing::Refuse(Occupied::NotMarked { path: path.to_owned() }),
        // The PV is named after the claim's UID: no other claim's marker names it.
        Found::MarkedFor(pv) if pv == own_pv => {
            Placing::Reuse { record: (recorded(pv) != Some(&facts.asker)).then(|| facts.asker.clone()) }
        }
        Found::MarkedFor(pv) if facts.marked_pv_exists => {
            Placing::Refuse(Occupied::HeldBy { path: path.to_owned(), pv: pv.clone() })
        }
        Found::MarkedFor(pv) => match recorded(pv) {
            Some(owner) if *owner == facts.asker => {
                Placing::Adopt { from: pv.clone(), owner: facts.asker.clone(), handed_from: None }
            }
            owner if facts.handed_over => Placing::Adopt {
                from: pv.clone(),
                owner: facts.asker.clone(),
                handed_from: Some(owner.map_or_else(|| UNRECORDED.to_owned(), ToString::to_string)),
            },
            owner => Placing::Refuse(Occupied::OtherOwner(Box::new(OtherOwner {
                path: path.to_owned(),
                dir: std::path::Path::new(path)
                    .file_name()
                    .map(|name| name.to_string_lossy().into_owned())
                    .unwrap_or_default(),
                pv: pv.clone(),
                owner: owner.map_or_else(|| UNRECORDED.to_owned(), ToString::to_string),
                asker: facts.asker.clone(),
            }))),
        },
    }
}

/// Whether the directory of PV `pv` may be deleted, read from its marker: only when the marker
/// names that very PV (a directory taken over by a newer claim is the newer one's).
pub fn marker_allows_deletion(pv: &str, marker: Option<&str>) -> bool {
    marker == Some(pv)
}

#[cfg(test)]
mod tests;
