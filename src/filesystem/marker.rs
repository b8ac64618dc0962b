//! The provisioner's marker on a `pathPattern` directory (`deciding::path_pattern`): the name of
//! the PV it was made or taken over for, in the extended attribute `user.hostpath-provisioner.pv`.
//! It moves with the directory on every rename and is invisible inside the volume, but it is not
//! the provisioner's alone: Linux lets anyone who may write a directory set its `user.*`
//! attributes (only a sticky directory limits that to its owner and CAP_FOWNER). Checked on
//! kernel 6.18 as root forking a uid-1000 process: on a root-owned directory it set the marker
//! of a 0777 one, and was refused on 0755 (EACCES) and 1777 (EPERM). So a volume's workload, and
//! anyone its mode lets write, can rewrite the marker (and the owner record below). What bounds
//! that is where the provisioner reads them: a deletion acts only on the path its own PV names,
//! through descriptors held from the pool root, and moves the directory only while the marker
//! there names that PV (a forged one makes it refuse and keep the data, `VolumeFailedDelete`);
//! a take-over acts only on the directory at its claim's own pattern name, and checks the inode
//! it marked is still the one at that place. Rewriting another volume's marker takes write
//! access to that volume, that is to its data already: a forged marker can withhold or hand on
//! only data its writer holds.
//!
//! A new pattern directory is made aside (`.hpp-making-<pv>`), marked, then renamed into place
//! only if the place is still free, so that no unmarked directory of the provisioner's ever sits
//! at a pattern name, whatever crashes.
//!
//! Beside the marker, a second attribute records whose the directory is
//! (`deciding::path_pattern::OWNER_XATTR`, an `OwnerRecord`): the marker keeps the bare PV name
//! so that the earlier version, after a rollback, reads it and deletes by it as before.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::PathBuf;

use rustix::fs::{AtFlags, OFlags, RenameFlags, XattrFlags};
use rustix::io::Errno;

use super::{PoolError, PoolRoot, Trashed, VolumeDirName, fs_error, inode_at, inode_of};
use crate::deciding::path_pattern::{MAX_OWNER_RECORD_BYTES, OWNER_XATTR};

/// The extended attribute holding the marker.
pub const MARKER_XATTR: &str = "user.hostpath-provisioner.pv";

/// Prefix of the entry a pattern volume is made under before it is renamed into place.
pub const MAKING_PREFIX: &str = ".hpp-making-";

/// PV names are at most 253 bytes.
const MAX_MARKER_BYTES: usize = 253;

/// What sits at a pattern directory's place.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Marker {
    /// Nothing.
    Absent,
    /// A directory without a marker, or something that is no directory (a file, a symlink).
    Unmarked,
    /// A directory whose marker names this PV.
    MarkedFor(String),
}

impl PoolRoot {
    /// The marker of the entry `name` directly under the root (never following a symlink, never
    /// entering a mount).
    pub fn volume_marker(&self, name: &VolumeDirName) -> Result<Marker, PoolError> {
        self.marker_beneath(self.fd.as_fd(), name.as_str(), self.volume_path(name)).map(|(marker, _)| marker)
    }

    /// The owner record of the directory `name` as written (`None`: no directory, none written,
    /// or none that reads as text); `deciding::path_pattern::OwnerRecord` reads it.
    pub fn volume_owner_record(&self, name: &VolumeDirName) -> Result<Option<String>, PoolError> {
        self.directory_attribute(name, OWNER_XATTR, MAX_OWNER_RECORD_BYTES)
    }

    /// The text of the extended attribute `attribute` (at most `max` bytes) of the directory
    /// `name` directly under the root, read as the marker is (never following a symlink, never
    /// entering a mount); `None`: no directory, no such attribute, or none that reads as text.
    pub(super) fn directory_attribute(
        &self,
        name: &VolumeDirName,
        attribute: &'static str,
        max: usize,
    ) -> Result<Option<String>, PoolError> {
        let path = self.volume_path(name);
        let Some(fd) = self.marker_beneath(self.fd.as_fd(), name.as_str(), path.clone())?.1 else {
            return Ok(None);
        };
        let mut value = vec![0u8; max];
        match rustix::fs::getxattr(magic(&fd).as_str(), attribute, &mut value[..]) {
            Ok(len) => Ok(std::str::from_utf8(&value[..len]).ok().map(str::to_owned)),
            // Too long for any record the provisioner writes: none of ours.
            Err(Errno::NODATA | Errno::RANGE) => Ok(None),
            Err(Errno::OPNOTSUPP) => Err(PoolError::MarkerUnsupported { path }),
            Err(e) => Err(fs_error("read an extended attribute of the directory", path, e)),
        }
    }

    /// Writes the extended attribute `attribute` of the directory `name` directly under the
    /// root (which must be there).
    pub(super) fn set_directory_attribute(
        &self,
        name: &VolumeDirName,
        attribute: &'static str,
        value: &str,
    ) -> Result<(), PoolError> {
        let path = self.volume_path(name);
        let Some(fd) = self.marker_beneath(self.fd.as_fd(), name.as_str(), path.clone())?.1 else {
            return Err(fs_error("open the directory", path, Errno::NOENT));
        };
        set_xattr(&fd, attribute, value, &path)
    }

    /// Refuses, with what the marker says, unless the directory `name` carries the marker of PV
    /// `pv` (a missing directory passes: there is nothing to act on).
    pub fn check_marked_for(&self, name: &VolumeDirName, pv: &str) -> Result<(), PoolError> {
        self.check_marker_beneath(self.fd.as_fd(), name.as_str(), self.volume_path(name), pv)
    }

    /// As [`PoolRoot::check_marked_for`], for an entry under another directory of the pool (a
    /// volume moved aside for deletion).
    pub(super) fn check_marker_beneath(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: PathBuf,
        pv: &str,
    ) -> Result<(), PoolError> {
        match self.marker_beneath(parent, name, path.clone())?.0 {
            Marker::Absent => Ok(()),
            Marker::MarkedFor(found) if found == pv => Ok(()),
            Marker::MarkedFor(found) => Err(PoolError::NotMarkedFor { path, pv: pv.to_owned(), found: Some(found) }),
            Marker::Unmarked => Err(PoolError::NotMarkedFor { path, pv: pv.to_owned(), found: None }),
        }
    }

    fn marker_beneath(
        &self,
        parent: BorrowedFd<'_>,
        name: &str,
        path: PathBuf,
    ) -> Result<(Marker, Option<OwnedFd>), PoolError> {
        // O_PATH needs no permission on the directory, and changes nothing about it.
        let fd = match self.open_beneath(parent, name, OFlags::PATH) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok((Marker::Absent, None)),
            Err(Errno::LOOP | Errno::NOTDIR) => return Ok((Marker::Unmarked, None)),
            Err(Errno::XDEV) => return Err(PoolError::MountInsideVolume { path }),
            Err(e) => return Err(fs_error("open the volume directory", path, e)),
        };
        let inode = inode_of(fd.as_fd()).map_err(|e| fs_error("stat the volume directory", path.clone(), e))?;
        // A quota volume on btrfs is a subvolume of the pool's own mount: another device
        // number, not another mount.
        if self.is_foreign_mount(&inode) && !self.is_on_own_mount_in_another_subvolume(&inode) {
            return Err(PoolError::MountInsideVolume { path });
        }
        let mut value = [0u8; MAX_MARKER_BYTES];
        let marker = match rustix::fs::getxattr(magic(&fd).as_str(), MARKER_XATTR, &mut value[..]) {
            Ok(len) => match std::str::from_utf8(&value[..len]) {
                Ok(pv) if !pv.is_empty() => Marker::MarkedFor(pv.to_owned()),
                _ => Marker::Unmarked,
            },
            Err(Errno::NODATA | Errno::RANGE) => Marker::Unmarked,
            Err(Errno::OPNOTSUPP) => return Err(PoolError::MarkerUnsupported { path }),
            Err(e) => return Err(fs_error("read the volume directory's marker", path, e)),
        };
        Ok((marker, Some(fd)))
    }

    /// The entry a pattern volume of PV `pv` is made under, after any leftover of an attempt
    /// that crashed there (never given a PV: it goes to the trash).
    pub fn clear_making_entry(&self, pv: &str) -> Result<VolumeDirName, PoolError> {
        let making = VolumeDirName::new(&format!("{MAKING_PREFIX}{pv}"))?;
        match self.move_to_trash(&making)? {
            Trashed::Moved(entry) => {
                tracing::info!(pool = %self.name, %entry, pv, "a volume left half-made by an earlier attempt went to the trash");
            }
            Trashed::Unlinked | Trashed::AlreadyGone => {}
        }
        Ok(making)
    }

    /// Marks the volume made at `making` for PV `pv` and records `owner` (an `OwnerRecord`),
    /// then renames it to `name` only if nothing is there ([`PoolError::PatternPlaceTaken`]
    /// otherwise, and the made volume goes to the trash).
    pub fn place_marked(
        &self,
        making: &VolumeDirName,
        name: &VolumeDirName,
        pv: &str,
        owner: &str,
    ) -> Result<(), PoolError> {
        let path = self.path.join(making.as_str());
        let Some(fd) = self.marker_beneath(self.fd.as_fd(), making.as_str(), path.clone())?.1 else {
            return Err(fs_error("open the volume made aside", path, Errno::NOENT));
        };
        set_xattr(&fd, OWNER_XATTR, owner, &path)?;
        set_marker(&fd, pv, &path)?;
        match rustix::fs::renameat_with(&self.fd, making.as_str(), &self.fd, name.as_str(), RenameFlags::NOREPLACE) {
            Ok(()) => Ok(()),
            Err(Errno::EXIST) => {
                let _ = self.move_to_trash(making);
                Err(PoolError::PatternPlaceTaken { path: self.volume_path(name) })
            }
            // NFS and a few others have no renameat2 flags: the marker could not be trusted there
            // anyway.
            Err(Errno::INVAL) => Err(PoolError::MarkerUnsupported { path: self.volume_path(name) }),
            Err(e) => Err(fs_error("rename the made volume into place", self.volume_path(name), e)),
        }
    }

    /// Takes the directory `name` over for PV `pv` and records `owner` (an `OwnerRecord`): its
    /// marker, then its record, are rewritten through a descriptor, then the directory is
    /// checked to be still at its place (a deletion moving it aside first reads the new marker
    /// and puts it back; one that moved it before fails this check). The marker goes first: a
    /// stop between the two leaves a record of another PV, which counts as none, so the
    /// directory goes to nobody without an admin rather than back to its previous claim.
    ///
    /// The marker must still name `expected` (the PV the decision saw): a claim that took the
    /// directory over in between is not overwritten, and this attempt decides again.
    pub fn take_over_marked(
        &self,
        name: &VolumeDirName,
        expected: &str,
        pv: &str,
        owner: &str,
    ) -> Result<(), PoolError> {
        let path = self.volume_path(name);
        let (marker, fd) = self.marker_beneath(self.fd.as_fd(), name.as_str(), path.clone())?;
        let (Marker::MarkedFor(found), Some(fd)) = (marker, fd) else {
            return Err(PoolError::TreeChanged { path });
        };
        if found != expected {
            return Err(PoolError::TreeChanged { path });
        }
        set_marker(&fd, pv, &path)?;
        set_xattr(&fd, OWNER_XATTR, owner, &path)?;
        let held = inode_of(fd.as_fd()).map_err(|e| fs_error("stat the volume directory", path.clone(), e))?;
        match inode_at(self.fd.as_fd(), name.as_str(), AtFlags::SYMLINK_NOFOLLOW) {
            Ok(now) if (now.dev, now.ino) == (held.dev, held.ino) => Ok(()),
            Ok(_) | Err(Errno::NOENT) => Err(PoolError::TreeChanged { path }),
            Err(e) => Err(fs_error("stat the volume directory", path, e)),
        }
    }
}

/// `/proc/self/fd/<fd>`: the extended-attribute calls take no `O_PATH` descriptor, and this
/// magic link names exactly the inode the descriptor holds.
fn magic(fd: &OwnedFd) -> String {
    format!("/proc/self/fd/{}", fd.as_raw_fd())
}

fn set_marker(fd: &OwnedFd, pv: &str, path: &std::path::Path) -> Result<(), PoolError> {
    set_xattr(fd, MARKER_XATTR, pv, path)
}

fn set_xattr(fd: &OwnedFd, attribute: &'static str, value: &str, path: &std::path::Path) -> Result<(), PoolError> {
    let op = match attribute {
        MARKER_XATTR => "write the volume directory's marker",
        OWNER_XATTR => "write the volume directory's owner record",
        _ => "write an extended attribute of the directory",
    };
    match rustix::fs::setxattr(magic(fd).as_str(), attribute, value.as_bytes(), XattrFlags::empty()) {
        Ok(()) => Ok(()),
        Err(Errno::OPNOTSUPP) => Err(PoolError::MarkerUnsupported { path: path.to_owned() }),
        Err(e) => Err(fs_error(op, path.to_owned(), e)),
    }
}
