//! Child processes that cannot outlive the test binary.
//!
//! Test binaries keep one control plane in a `static`, and statics are never dropped, so `Drop`
//! alone cannot stop etcd or kube-apiserver. Two independent mechanisms cover that:
//!
//! 1. Every child gets `PR_SET_PDEATHSIG = SIGKILL`. The kernel delivers it when the *thread*
//!    that forked the child exits, and libtest runs each test on a thread of its own, so all
//!    children are forked by one dedicated thread that lives as long as the process. When the
//!    process ends (normally, by panic=abort, or by SIGKILL) that thread ends too and the kernel
//!    kills every child. The only gap is the window between `fork` and `prctl`; the child closes it
//!    by checking that its parent is still the process that forked it.
//! 2. An `atexit` handler kills the process group of every child still registered and removes the
//!    registered temporary directories, so a normal exit also leaves no files behind. Each child
//!    leads its own process group (so a terminal's Ctrl-C reaches only the test binary, which then
//!    takes them down by mechanism 1) and the handler signals that group, never anything else.
//!
//! `Drop` of [`ManagedChild`] stops and reaps its own child and takes it off the exit list.

use std::collections::HashSet;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, Once, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, anyhow};

/// What to run; built into a `Command` on the spawner thread.
#[derive(Clone, Debug)]
pub(crate) struct ProcessSpec {
    /// Short name used in messages and log headers ("etcd", "provisioner-node-1").
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Start from an empty environment (plus [`PASSED_THROUGH_ENV`]) instead of inheriting
    /// the test runner's, so that none of its settings can leak into the process.
    pub clean_env: bool,
    /// stdout and stderr are both appended here.
    pub log_path: PathBuf,
    /// A cgroup's `cgroup.procs`: the process joins that cgroup before its exec.
    pub cgroup_procs: Option<PathBuf>,
}

impl ProcessSpec {
    /// The command line as one string, for log headers and error messages.
    pub fn command_line(&self) -> String {
        let mut line = self.program.display().to_string();
        for arg in &self.args {
            line.push(' ');
            line.push_str(arg);
        }
        line
    }
}

/// What a process started with [`ProcessSpec::clean_env`] still inherits.
pub(crate) const PASSED_THROUGH_ENV: [&str; 4] = ["PATH", "HOME", "TMPDIR", "RUST_BACKTRACE"];

/// A running child process owned by the harness.
#[derive(Debug)]
pub(crate) struct ManagedChild {
    name: String,
    child: Child,
    reaped: Option<ExitStatus>,
}

impl ManagedChild {
    /// Starts `spec` from the long-lived spawner thread (see the module docs for why).
    pub fn spawn(spec: &ProcessSpec) -> Result<ManagedChild> {
        install_exit_cleanup();
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| anyhow!("spawner lock poisoned"))?
            .send(SpawnRequest { spec: spec.clone(), reply: reply_tx })
            .map_err(|_| anyhow!("spawner thread is gone"))?;
        let child = reply_rx
            .recv()
            .map_err(|_| anyhow!("spawner thread dropped the request"))?
            .with_context(|| format!("starting {}: {}", spec.name, spec.command_line()))?;
        register_pid(child.id());
        Ok(ManagedChild { name: spec.name.clone(), child, reaped: None })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// `Some(status)` once the process has exited (and been reaped).
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        if self.reaped.is_none()
            && let Ok(Some(status)) = self.child.try_wait()
        {
            self.mark_reaped(status);
        }
        self.reaped
    }

    /// Sends `signal` to the child's process group unless it was already reaped.
    pub fn signal(&mut self, signal: libc::c_int) {
        if self.exit_status().is_none() {
            signal_group(self.child.id(), signal);
        }
    }

    /// SIGKILL and reap; returns how it ended.
    pub fn kill(&mut self) -> Option<ExitStatus> {
        self.signal(libc::SIGKILL);
        self.wait();
        self.reaped
    }

    /// SIGTERM, wait up to `grace`, then SIGKILL; always reaps and returns how it ended.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        self.signal(libc::SIGTERM);
        self.wait_or_kill(Instant::now() + grace)
    }

    /// Waits until `deadline` for an exit already requested, then SIGKILLs; always reaps.
    pub fn wait_or_kill(&mut self, deadline: Instant) -> Option<ExitStatus> {
        while self.exit_status().is_none() {
            if Instant::now() >= deadline {
                return self.kill();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        self.reaped
    }

    fn wait(&mut self) {
        if self.reaped.is_none() {
            match self.child.wait() {
                Ok(status) => self.mark_reaped(status),
                Err(err) => eprintln!("testbed: waiting for {} failed: {err}", self.name),
            }
        }
    }

    fn mark_reaped(&mut self, status: ExitStatus) {
        self.reaped = Some(status);
        unregister_pid(self.child.id());
    }
}

impl Drop for ManagedChild {
    fn drop(&mut self) {
        if self.exit_status().is_none() {
            self.kill();
        }
    }
}

fn signal_group(pid: u32, signal: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // Negative pid: the whole process group the child leads (see `spawn_on_this_thread`).
    // SAFETY: kill(2) has no memory-safety preconditions.
    unsafe {
        libc::kill(-pid, signal);
    }
}

struct SpawnRequest {
    spec: ProcessSpec,
    reply: mpsc::Sender<io::Result<Child>>,
}

fn spawner() -> &'static Mutex<mpsc::Sender<SpawnRequest>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<SpawnRequest>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<SpawnRequest>();
        // Never joined: the thread must outlive every test for PR_SET_PDEATHSIG to mean
        // "the test binary died". The channel's sender lives in a static, so `recv` never fails
        // before process exit.
        std::thread::Builder::new()
            .name("testbed-spawner".into())
            .spawn(move || {
                while let Ok(request) = rx.recv() {
                    let result = spawn_on_this_thread(&request.spec);
                    let _ = request.reply.send(result);
                }
            })
            .expect("cannot start the testbed spawner thread");
        Mutex::new(tx)
    })
}

fn spawn_on_this_thread(spec: &ProcessSpec) -> io::Result<Child> {
    let mut log = OpenOptions::new().create(true).append(true).open(&spec.log_path)?;
    // A header per start, so a restarted component's log shows where each run begins.
    writeln!(log, "==== testbed: starting {}", spec.command_line())?;
    let mut command = Command::new(&spec.program);
    if spec.clean_env {
        command.env_clear();
        for name in PASSED_THROUGH_ENV {
            if let Some(value) = std::env::var_os(name) {
                command.env(name, value);
            }
        }
    }
    command
        .args(&spec.args)
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    let parent = libc::pid_t::try_from(std::process::id()).unwrap_or(0);
    // Made before the fork: the child must not allocate.
    let cgroup_procs = match &spec.cgroup_procs {
        Some(path) => Some(
            std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?,
        ),
        None => None,
    };
    // SAFETY: the closure only calls async-signal-safe functions (prctl, getppid, open, write,
    // close) and allocates nothing, as required between fork and exec.
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent may have died before prctl took effect; then nobody would kill us.
            if libc::getppid() != parent {
                return Err(io::Error::from_raw_os_error(libc::ESRCH));
            }
            if let Some(procs) = &cgroup_procs {
                // "0" moves the writing process itself.
                let fd = libc::open(procs.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
                if fd < 0 {
                    return Err(io::Error::last_os_error());
                }
                let written = libc::write(fd, b"0".as_ptr().cast(), 1);
                libc::close(fd);
                if written != 1 {
                    return Err(io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    command.spawn()
}

/// PIDs and directories that the exit handler must clean up.
#[derive(Default)]
struct ExitList {
    pids: Vec<u32>,
    dirs: Vec<PathBuf>,
}

fn exit_list() -> &'static Mutex<ExitList> {
    static LIST: OnceLock<Mutex<ExitList>> = OnceLock::new();
    LIST.get_or_init(Default::default)
}

fn register_pid(pid: u32) {
    if let Ok(mut list) = exit_list().lock() {
        list.pids.push(pid);
    }
}

fn unregister_pid(pid: u32) {
    if let Ok(mut list) = exit_list().lock() {
        list.pids.retain(|p| *p != pid);
    }
}

pub(crate) fn register_dir(dir: &Path) {
    install_exit_cleanup();
    if let Ok(mut list) = exit_list().lock() {
        list.dirs.push(dir.to_path_buf());
    }
}

pub(crate) fn unregister_dir(dir: &Path) {
    if let Ok(mut list) = exit_list().lock() {
        list.dirs.retain(|d| d != dir);
    }
}

fn install_exit_cleanup() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        // SAFETY: registers a plain `extern "C" fn` that never unwinds.
        unsafe {
            libc::atexit(cleanup_at_exit);
        }
    });
}

extern "C" fn cleanup_at_exit() {
    // try_lock: a thread frozen by exit() might hold the lock; better a leak than a hang.
    let Ok(mut list) = exit_list().try_lock() else {
        return;
    };
    for pid in list.pids.drain(..) {
        signal_group(pid, libc::SIGKILL);
        if let Ok(pid) = libc::pid_t::try_from(pid) {
            // Reap so that the directories below are no longer in use when they are removed.
            // SAFETY: waitpid on our own child with a valid status pointer.
            unsafe {
                let mut status = 0;
                libc::waitpid(pid, &mut status, 0);
            }
        }
    }
    for dir in list.dirs.drain(..) {
        let _ = fs::remove_dir_all(dir);
    }
}

/// A fresh directory under the system temp dir, removed on drop and at process exit.
///
/// Its name carries the creating PID (`testbed-p<pid>-...`). Neither `Drop` nor `atexit` runs
/// when a test binary is SIGKILLed (a CI timeout, say), and each such leftover holds etcd's
/// preallocated WAL (64 MiB), so the first directory a process creates also sweeps leftovers of
/// processes that no longer exist. Their children died with them (PDEATHSIG), so nothing uses
/// those files any more.
///
/// Set `TESTBED_KEEP_TEMP=1` to keep directories for inspection; kept ones are named
/// `testbed-kept-...` and never swept.
#[derive(Debug)]
pub(crate) struct TempDir {
    path: PathBuf,
}

const SWEPT_PREFIX: &str = "testbed-p";

impl TempDir {
    /// `what` says what the directory is for (`cp`), as part of its name.
    pub fn new(what: &str) -> Result<TempDir> {
        static SWEEP: Once = Once::new();
        SWEEP.call_once(sweep_dead_processes_dirs);
        let prefix = if keep_temp() {
            format!("testbed-kept-{what}")
        } else {
            format!("{SWEPT_PREFIX}{}-{what}", std::process::id())
        };
        let path = std::env::temp_dir().join(crate::unique_name(&prefix));
        fs::create_dir(&path).with_context(|| format!("creating {}", path.display()))?;
        if !keep_temp() {
            register_dir(&path);
        }
        Ok(TempDir { path })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Removes `testbed-p<pid>-*` directories whose process is gone.
fn sweep_dead_processes_dirs() {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix(SWEPT_PREFIX))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new("/proc").join(pid.to_string()).exists() {
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        if keep_temp() {
            eprintln!("testbed: keeping {}", self.path.display());
            return;
        }
        unregister_dir(&self.path);
        let _ = fs::remove_dir_all(&self.path);
    }
}

fn keep_temp() -> bool {
    std::env::var_os("TESTBED_KEEP_TEMP").is_some_and(|v| v != "0" && !v.is_empty())
}

/// A TCP port on 127.0.0.1 that was free a moment ago and that this process has not handed out
/// before (several tests start servers concurrently; the OS alone could give two of them the same
/// just-released port). Another process can still take it before it is bound: callers retry.
pub fn free_port() -> Result<u16> {
    static HANDED_OUT: OnceLock<Mutex<HashSet<u16>>> = OnceLock::new();
    let handed_out = HANDED_OUT.get_or_init(Default::default);
    for _ in 0..100 {
        let port = TcpListener::bind(("127.0.0.1", 0))
            .and_then(|listener| listener.local_addr())
            .context("binding 127.0.0.1:0 to find a free port")?
            .port();
        let mut handed_out = handed_out.lock().map_err(|_| anyhow!("port list lock poisoned"))?;
        if handed_out.insert(port) {
            return Ok(port);
        }
    }
    Err(anyhow!("no unused free port found in 100 tries"))
}

/// The last `lines` lines of a log file (at most its last 256 KiB are read).
pub(crate) fn tail_file(path: &Path, lines: usize) -> String {
    const MAX_BYTES: u64 = 256 * 1024;
    let read = || -> io::Result<String> {
        let mut file = File::open(path)?;
        let len = file.metadata()?.len();
        file.seek(SeekFrom::Start(len.saturating_sub(MAX_BYTES)))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes)?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    };
    match read() {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(err) => format!("(cannot read {}: {err})", path.display()),
    }
}
