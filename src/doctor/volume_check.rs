//! `hostpath-provisioner check-volume DIR`: can a workload use the volume mounted at DIR? Writes a
//! file, syncs it, reads it back and removes it. It runs in a pod that mounts a freshly
//! provisioned claim (the Helm chart's `helm test`), from the provisioner's own image, so the
//! test needs no other image on air-gapped clusters.

use std::fs::OpenOptions;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// The subcommand's name, the first argument.
pub const SUBCOMMAND: &str = "check-volume";

/// What failed, with the path it failed on.
#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    /// A file operation failed.
    #[error("cannot {op} {}: {source}", path.display())]
    Io {
        /// What was attempted.
        op: &'static str,
        /// On which path.
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
    /// The file read back differs from what was written.
    #[error("{} reads back {read} bytes that differ from the {written} written", path.display())]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// Bytes written.
        written: usize,
        /// Bytes read.
        read: usize,
    },
}

/// Bytes written and read back: several pages, so the check goes past a single block.
const PROBE_BYTES: usize = 256 * 1024;

/// Writes, syncs, reads back and removes a probe file in `dir`; says what it did.
pub fn check(dir: &Path) -> Result<String, CheckError> {
    let path = dir.join(format!(".hostpath-provisioner-check-{}", std::process::id()));
    let io = |op: &'static str, path: &Path| {
        let path = path.to_owned();
        move |source| CheckError::Io { op, path, source }
    };
    let written: Vec<u8> = (0..PROBE_BYTES).map(|i| (i % 251) as u8).collect();
    let mut file =
        OpenOptions::new().write(true).create_new(true).mode(0o600).open(&path).map_err(io("create", &path))?;
    let outcome = (|| {
        file.write_all(&written).map_err(io("write", &path))?;
        file.sync_all().map_err(io("sync", &path))?;
        let mut read = Vec::with_capacity(PROBE_BYTES);
        std::fs::File::open(&path).map_err(io("reopen", &path))?.read_to_end(&mut read).map_err(io("read", &path))?;
        if read != written {
            return Err(CheckError::Corrupt { path: path.clone(), written: written.len(), read: read.len() });
        }
        Ok(())
    })();
    // Removed whatever happened: the check leaves nothing in the user's volume.
    let removed = std::fs::remove_file(&path).map_err(io("remove", &path));
    outcome?;
    removed?;
    Ok(format!("{}: wrote, synced, read back and removed {PROBE_BYTES} bytes", dir.display()))
}

/// Runs the subcommand with its arguments (after the name); returns the exit code: 0 the volume
/// works, 1 it does not, 2 usage.
pub fn main(args: impl Iterator<Item = std::ffi::OsString>) -> i32 {
    let args: Vec<_> = args.collect();
    let [dir] = args.as_slice() else {
        eprintln!(
            "usage: hostpath-provisioner {SUBCOMMAND} DIR  (checks that a volume mounted at DIR can be written and read)"
        );
        return 2;
    };
    match check(Path::new(dir)) {
        Ok(said) => {
            println!("{said}");
            0
        }
        Err(error) => {
            eprintln!("hostpath-provisioner {SUBCOMMAND}: {error}");
            1
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_writable_directory_passes_and_keeps_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let said = check(dir.path()).unwrap();
        assert!(said.contains("read back"), "{said}");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "the probe file is removed");
    }

    #[test]
    fn a_directory_that_cannot_be_written_fails_with_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("not-mounted");
        let error = check(&missing).unwrap_err().to_string();
        assert!(error.starts_with("cannot create") && error.contains("not-mounted"), "{error}");
        assert_eq!(main(std::iter::empty()), 2, "no directory given");
        assert_eq!(main([missing.into_os_string()].into_iter()), 1);
    }
}
