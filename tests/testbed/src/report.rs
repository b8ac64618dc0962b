//! Log tails for failed tests.
//!
//! `Drop` impls can tell a panic (`std::thread::panicking`) but not a test that returns `Err`,
//! which is how most end-to-end tests fail (a `wait_for` timing out, then `?`). A
//! [`LogsOnFailure`] guard covers both: it prints unless the test reaches [`LogsOnFailure::passed`].

use std::path::PathBuf;

use crate::process::tail_file;

/// Lines printed per log.
const TAIL_LINES: usize = 60;

/// Prints the tails of its logs to stderr when dropped, unless [`LogsOnFailure::passed`] was
/// called first. It owns only paths, so the test keeps full (mutable) use of what it watches.
#[must_use = "the guard reports on drop; bind it (`let logs = ...`) and call `passed()` at the end"]
pub struct LogsOnFailure {
    logs: Vec<(String, PathBuf)>,
    passed: bool,
}

impl LogsOnFailure {
    pub(crate) fn new(logs: Vec<(String, PathBuf)>) -> LogsOnFailure {
        LogsOnFailure { logs, passed: false }
    }

    /// Also report the log at `path` under `name` (e.g. a provisioner started later).
    pub fn watch(&mut self, name: &str, path: impl Into<PathBuf>) {
        self.logs.push((name.to_string(), path.into()));
    }

    /// Also report this provisioner's log.
    pub fn watch_provisioner(&mut self, provisioner: &crate::Provisioner) {
        let name = format!("provisioner-{}", provisioner.node_name());
        self.watch(&name, provisioner.log_path());
    }

    /// The test succeeded: print nothing.
    pub fn passed(mut self) {
        self.passed = true;
    }
}

impl Drop for LogsOnFailure {
    fn drop(&mut self) {
        if self.passed && !std::thread::panicking() {
            return;
        }
        let mut report = String::from("testbed: test failed; log tails follow\n");
        for (name, path) in &self.logs {
            report.push_str(&format!("===== {name} ({}) =====\n{}\n", path.display(), tail_file(path, TAIL_LINES)));
        }
        eprintln!("{report}");
    }
}
