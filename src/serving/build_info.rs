//! What this binary is: its version and the commit it was built from (set by `build.rs`).

/// The crate version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The git commit the binary was built from: `HPP_GIT_COMMIT` at build time (for builds without
/// `.git`, such as the Dockerfile's), else `git rev-parse HEAD`, else `unknown`.
pub const COMMIT: &str = env!("HPP_GIT_COMMIT");
