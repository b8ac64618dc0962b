//! What this binary is: its version and the commit it was built from (set by `build.rs`).

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from: `HPP_GIT_COMMIT` at build time (for builds without
/// `.git`, such as the Dockerfile's), else `git rev-parse HEAD`, else `unknown`.
pub const COMMIT: &str = env!("HPP_GIT_COMMIT");

/// What `--version` prints after the name: the version and the commit, so that an image built
/// from an unreleased checkout says which one (the metric and the start-up log say the same).
pub const VERSION_AND_COMMIT: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("HPP_GIT_COMMIT"), ")");
