//! TEMPORARY STUB (replaced by the real module).
use std::path::{Path, PathBuf};
#[derive(Debug, thiserror::Error)]
pub enum PoolError {
    #[error("x")]
    X,
    #[error("bad name {0}")]
    Name(#[from] InvalidDirName),
}
impl PoolError {
    pub fn is_retryable(&self) -> bool {
        true
    }
}
#[derive(Debug, thiserror::Error)]
#[error("bad")]
pub struct InvalidDirName;
pub struct VolumeDirName(String);
impl VolumeDirName {
    pub fn new(s: &str) -> Result<Self, InvalidDirName> {
        Ok(Self(s.into()))
    }
    pub fn as_str(&self) -> &str {
        &self.0
    }
}
#[derive(PartialEq, Eq, Debug)]
pub enum Created {
    New,
    Existing,
}
pub enum Removal {
    Removed { entries: u64 },
    AlreadyGone,
}
pub struct PoolStats {
    pub total_bytes: u64,
    pub free_bytes: u64,
    pub available_bytes: u64,
    pub go_total_bytes: u64,
}
pub struct PoolRoot(PathBuf);
impl PoolRoot {
    pub fn open(_n: &str, p: &Path) -> Result<Self, PoolError> {
        Ok(Self(p.into()))
    }
    pub fn path(&self) -> &Path {
        &self.0
    }
    pub fn check(&self, _r: bool) -> Result<(), PoolError> {
        Ok(())
    }
    pub fn create_volume_dir(&self, _n: &VolumeDirName, _m: u32) -> Result<Created, PoolError> {
        Ok(Created::New)
    }
    pub fn volume_dir_exists(&self, _n: &VolumeDirName) -> Result<bool, PoolError> {
        Ok(false)
    }
    pub fn remove_volume_dir(&self, _n: &VolumeDirName) -> Result<Removal, PoolError> {
        Ok(Removal::AlreadyGone)
    }
    pub fn remove_empty_volume_dir(&self, _n: &VolumeDirName) -> Result<(), PoolError> {
        Ok(())
    }
    pub fn list_entries(&self) -> Result<Vec<String>, PoolError> {
        Ok(vec![])
    }
    pub fn stats(&self) -> Result<PoolStats, PoolError> {
        Ok(PoolStats { total_bytes: 0, free_bytes: 0, available_bytes: u64::MAX, go_total_bytes: 0 })
    }
}
