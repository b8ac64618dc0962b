//! Block volumes (issue #47): what the loop device costs. The same I/O, with `O_DIRECT` and
//! aligned buffers at queue depth 1, on a loop device and on its backing file, on the same disk:
//! sequential 1 MiB and random 4 KiB, read and write; random 4 KiB again from 4 threads (queue
//! depth 4). The loop is attached by the provisioner's own code (`LoopHost::attach`, the
//! `LOOP_CONFIGURE` a Block volume gets), not by `losetup`, so its settings (direct I/O, logical
//! block size, queue) are the product's; they are read back and printed with the figures. And the primitive a Block clone shares its backing file
//! with, `FICLONE` (`src/filesystem/clone.rs`), timed on a 1 GiB file on btrfs and XFS. Figures
//! are reported, never asserted.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use hostpath_provisioner::filesystem::block::LoopHost;
use serde_json::{Value, json};

/// The backing file's size.
const FILE_BYTES: u64 = 1 << 30;
/// Threads of the random patterns' second figure, each one request at a time (queue depth 4):
/// whether the loop's per-request hand-off to its worker still costs when requests overlap.
const JOBS: usize = 4;
/// How long each random pattern runs.
const RANDOM_FOR: Duration = Duration::from_secs(4);
/// Rounds of file then device, alternated so that neither always runs on a warmer disk; the
/// median of each figure is reported.
const ROUNDS: usize = 3;
/// Random 4 KiB writes into the source after its first clones, as a workload using a volume
/// leaves it: each splits an extent (copy on write of a block the clones share).
const SCATTERED_WRITES: u64 = 4096;
/// `FICLONE`, `_IOW(0x94, 9, int)`.
const FICLONE: libc::c_ulong = 0x4004_9409;

/// The patterns, in the order printed.
const PATTERNS: [&str; 6] = [
    "seq-read-1MiB",
    "seq-write-1MiB",
    "rand-read-4KiB",
    "rand-write-4KiB",
    "rand-read-4KiB-4jobs",
    "rand-write-4KiB-4jobs",
];

/// One I/O pattern on one target.
pub struct Figure {
    /// One of [`PATTERNS`].
    pub pattern: &'static str,
    /// `file` (the backing file) or `device` (its loop device).
    pub target: &'static str,
    pub mib_per_s: f64,
    pub iops: f64,
}

/// One reflink copy timed.
pub struct Reflink {
    pub filesystem: &'static str,
    pub bytes: u64,
    /// The file as written, sequentially (a few large extents).
    pub took: Duration,
    /// After [`SCATTERED_WRITES`] random 4 KiB writes (thousands of extents).
    pub scattered_took: Duration,
}

pub struct BlockIo {
    /// The directory of the backing file (its disk is the one measured).
    pub dir: PathBuf,
    /// Whether the loop runs with direct I/O on its file (sysfs `loop/dio`).
    pub direct_io: bool,
    /// The loop's queue settings (sysfs name, value).
    pub queue: Vec<(&'static str, String)>,
    pub figures: Vec<Figure>,
    pub reflinks: Vec<Reflink>,
}

/// A buffer aligned for `O_DIRECT`, freed on drop.
struct Aligned {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let layout = std::alloc::Layout::from_size_align(len, 4096).expect("layout");
        // SAFETY: a non-zero size; freed with the same layout on drop.
        let ptr = unsafe { std::alloc::alloc(layout) };
        assert!(!ptr.is_null(), "allocation of {len} bytes");
        let mut buffer = Aligned { ptr, layout };
        fill(buffer.bytes(), len as u64);
        buffer
    }
    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` holds `layout.size()` bytes owned by this value.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.layout.size()) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// Bytes no filesystem compresses or deduplicates away.
fn fill(buf: &mut [u8], seed: u64) {
    let mut x = 0x9E37_79B9_7F4A_7C15 ^ seed;
    for chunk in buf.chunks_mut(8) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
    }
}

fn command(cmd: &mut Command) -> Result<String> {
    let out = cmd.output().with_context(|| format!("{cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
}

/// A file of `bytes` written in full (real blocks, not holes) and flushed.
fn write_file(path: &Path, bytes: u64) -> Result<()> {
    let file = OpenOptions::new().write(true).create(true).truncate(true).open(path)?;
    let mut chunk = vec![0u8; 8 << 20];
    let mut at = 0;
    while at < bytes {
        fill(&mut chunk, at);
        file.write_all_at(&chunk, at)?;
        at += chunk.len() as u64;
    }
    file.sync_all()?;
    Ok(())
}

fn open_direct(path: &Path) -> Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("open {} with O_DIRECT", path.display()))
}

/// Sequential 1 MiB over the whole target, then random 4 KiB for [`RANDOM_FOR`].
fn measure(target: &'static str, path: &Path, out: &mut Vec<Figure>) -> Result<()> {
    let file = open_direct(path)?;
    let mut big = Aligned::new(1 << 20);
    for (pattern, write) in [("seq-write-1MiB", true), ("seq-read-1MiB", false)] {
        let started = Instant::now();
        let mut at = 0;
        while at < FILE_BYTES {
            if write {
                file.write_all_at(big.bytes(), at)?;
            } else {
                file.read_exact_at(big.bytes(), at)?;
            }
            at += 1 << 20;
        }
        let secs = started.elapsed().as_secs_f64();
        let ios = (FILE_BYTES >> 20) as f64;
        out.push(Figure { pattern, target, mib_per_s: ios / secs, iops: ios / secs });
    }
    for (pattern, write, jobs) in [
        ("rand-write-4KiB", true, 1),
        ("rand-read-4KiB", false, 1),
        ("rand-write-4KiB-4jobs", true, JOBS),
        ("rand-read-4KiB-4jobs", false, JOBS),
    ] {
        let started = Instant::now();
        let file = &file;
        let counts: Vec<Result<u64>> = std::thread::scope(|scope| {
            let workers: Vec<_> =
                (0..jobs).map(|job| scope.spawn(move || random_4k(file, write, job as u64, started))).collect();
            workers.into_iter().map(|w| w.join().expect("a random I/O thread")).collect()
        });
        let ios: u64 = counts.into_iter().collect::<Result<Vec<u64>>>()?.into_iter().sum();
        let secs = started.elapsed().as_secs_f64();
        out.push(Figure {
            pattern,
            target,
            mib_per_s: ios as f64 * 4096.0 / (1 << 20) as f64 / secs,
            iops: ios as f64 / secs,
        });
    }
    Ok(())
}

/// Random 4 KiB I/O on `file`, one request at a time, until [`RANDOM_FOR`] after `started`:
/// the number of requests made. `seed` gives each thread its own sequence of offsets.
fn random_4k(file: &File, write: bool, seed: u64, started: Instant) -> Result<u64> {
    let mut small = Aligned::new(4096);
    let blocks = FILE_BYTES / 4096;
    let mut x: u64 = 0x2545_F491_4F6C_DD1D ^ (seed.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let mut ios = 0u64;
    while started.elapsed() < RANDOM_FOR {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let at = (x % blocks) * 4096;
        if write {
            file.write_all_at(small.bytes(), at)?;
        } else {
            file.read_exact_at(small.bytes(), at)?;
        }
        ios += 1;
    }
    Ok(ios)
}

/// The loop device's queue as the kernel set it up (sysfs), printed with the figures:
/// `logical_block_size`, `scheduler`, `nr_requests`, `rotational`.
fn queue_settings(device: &str) -> Vec<(&'static str, String)> {
    let queue = Path::new("/sys/block").join(device.trim_start_matches("/dev/")).join("queue");
    ["logical_block_size", "scheduler", "nr_requests", "rotational"]
        .into_iter()
        .map(|name| {
            let value = std::fs::read_to_string(queue.join(name)).map(|v| v.trim().to_owned());
            (name, value.unwrap_or_else(|e| format!("unreadable: {e}")))
        })
        .collect()
}

/// A loop device on the backing file, attached by the provisioner's own code
/// (`LoopHost::attach`, direct I/O requested as for every Block volume), detached on drop.
struct LoopDevice {
    path: String,
    number: u32,
    backing: hostpath_provisioner::deciding::block::loop_safety::FileId,
    /// Whether the kernel runs it with direct I/O (read back from the loop's status).
    direct_io: bool,
}

impl LoopDevice {
    fn attach(file: &File) -> Result<LoopDevice> {
        let attached = LoopHost::host().attach(std::os::fd::AsFd::as_fd(file), true)?;
        let number = attached.facts.number;
        Ok(LoopDevice {
            path: format!("/dev/loop{number}"),
            number,
            backing: attached.facts.backing,
            direct_io: attached.direct_io,
        })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = LoopHost::host().detach(self.number, self.backing);
    }
}

/// A loop filesystem mounted at `dir`, unmounted and removed on drop.
struct LoopFs {
    dir: PathBuf,
    image: PathBuf,
}

impl LoopFs {
    fn new(dir: &Path, fstype: &str) -> Result<LoopFs> {
        std::fs::create_dir_all(dir)?;
        let image = dir.with_extension("img");
        File::create(&image)?.set_len(3 << 30)?;
        let mut mkfs = Command::new(format!("mkfs.{fstype}"));
        match fstype {
            "xfs" => mkfs.args(["-q", "-f", "-m", "reflink=1"]),
            _ => mkfs.args(["-q", "-f"]),
        };
        command(mkfs.arg(&image)).with_context(|| format!("mkfs.{fstype}"))?;
        command(Command::new("mount").arg("-o").arg("loop").arg(&image).arg(dir))?;
        Ok(LoopFs { dir: dir.to_owned(), image })
    }
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
        let _ = std::fs::remove_file(&self.image);
        let _ = std::fs::remove_dir(&self.dir);
    }
}

fn reflink(work: &Path, filesystem: &'static str) -> Result<Reflink> {
    let fs = LoopFs::new(&work.join(filesystem), filesystem)?;
    let source = fs.dir.join("block.img");
    write_file(&source, FILE_BYTES)?;
    let input = open_direct(&source)?;
    let clones = |name: &str| -> Result<Duration> {
        let mut times = Vec::new();
        for round in 0..ROUNDS {
            let output =
                OpenOptions::new().write(true).create_new(true).open(fs.dir.join(format!("{name}-{round}.img")))?;
            let started = Instant::now();
            // SAFETY: two open descriptors; FICLONE takes the source's as its argument.
            let rc = unsafe { libc::ioctl(output.as_raw_fd(), FICLONE as _, input.as_raw_fd()) };
            let took = started.elapsed();
            if rc != 0 {
                bail!("FICLONE on {filesystem}: {}", std::io::Error::last_os_error());
            }
            times.push(took);
        }
        times.sort();
        Ok(times[times.len() / 2])
    };
    let took = clones("clone")?;
    let mut block = Aligned::new(4096);
    let mut x: u64 = 0x2545_F491_4F6C_DD1D;
    for _ in 0..SCATTERED_WRITES {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        input.write_all_at(block.bytes(), (x % (FILE_BYTES / 4096)) * 4096)?;
    }
    input.sync_all()?;
    let scattered_took = clones("scattered")?;
    Ok(Reflink { filesystem, bytes: FILE_BYTES, took, scattered_took })
}

/// Runs in `work` (a directory on the disk to measure; made and removed here). Needs root.
pub fn run(work: &Path) -> Result<BlockIo> {
    std::fs::create_dir_all(work)?;
    let work = &work.canonicalize()?;
    let backing = work.join("block.img");
    eprintln!("bench: block: writing a 1 GiB backing file in {}", work.display());
    write_file(&backing, FILE_BYTES)?;
    let device = LoopDevice::attach(&OpenOptions::new().read(true).write(true).open(&backing)?)?;
    let direct_io = device.direct_io;
    let queue = queue_settings(&device.path);
    let mut rounds = Vec::new();
    for round in 1..=ROUNDS {
        eprintln!("bench: block: round {round}/{ROUNDS}: the backing file, then its loop device {}", device.path);
        measure("file", &backing, &mut rounds)?;
        measure("device", Path::new(&device.path), &mut rounds)?;
    }
    drop(device);
    let mut figures = Vec::new();
    for first in rounds.iter().take(PATTERNS.len() * 2) {
        let median = |value: fn(&Figure) -> f64| {
            let mut all: Vec<f64> =
                rounds.iter().filter(|f| f.pattern == first.pattern && f.target == first.target).map(value).collect();
            all.sort_by(f64::total_cmp);
            all[all.len() / 2]
        };
        figures.push(Figure {
            pattern: first.pattern,
            target: first.target,
            mib_per_s: median(|f| f.mib_per_s),
            iops: median(|f| f.iops),
        });
    }
    std::fs::remove_file(&backing)?;
    let mut reflinks = Vec::new();
    for filesystem in ["btrfs", "xfs"] {
        eprintln!("bench: block: FICLONE of a 1 GiB file on {filesystem}");
        reflinks.push(reflink(work, filesystem)?);
    }
    let _ = std::fs::remove_dir(work);
    Ok(BlockIo { dir: work.to_owned(), direct_io, queue, figures, reflinks })
}

impl BlockIo {
    fn figure(&self, pattern: &str, target: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.pattern == pattern && f.target == target)
    }

    pub fn print(&self) {
        println!(
            "\nBlock volume I/O (O_DIRECT, queue depth 1, -4jobs: {JOBS} threads, median of {ROUNDS} rounds; backing file in {}; loop direct I/O {})",
            self.dir.display(),
            if self.direct_io { "on" } else { "off" }
        );
        let queue: Vec<String> = self.queue.iter().map(|(name, value)| format!("{name} {value}")).collect();
        println!("Loop device as the provisioner attached it: {}", queue.join(", "));
        println!(
            "{:<22} {:>14} {:>14} {:>12} {:>12} {:>8}",
            "pattern", "file MiB/s", "device MiB/s", "file IOPS", "device IOPS", "ratio"
        );
        for pattern in PATTERNS {
            if let (Some(file), Some(device)) = (self.figure(pattern, "file"), self.figure(pattern, "device")) {
                println!(
                    "{pattern:<22} {:>14.1} {:>14.1} {:>12.0} {:>12.0} {:>8.2}",
                    file.mib_per_s,
                    device.mib_per_s,
                    file.iops,
                    device.iops,
                    device.iops / file.iops
                );
            }
        }
        for r in &self.reflinks {
            println!(
                "FICLONE of a {} MiB file on {} (the clone path's primitive), median of {ROUNDS}: {:.3} ms as written, {:.3} ms after {SCATTERED_WRITES} random 4 KiB writes",
                r.bytes >> 20,
                r.filesystem,
                r.took.as_secs_f64() * 1000.0,
                r.scattered_took.as_secs_f64() * 1000.0
            );
        }
    }

    pub fn json(&self) -> Value {
        json!({
            "loop_direct_io": self.direct_io,
            "loop_queue": self.queue.iter().map(|(name, value)| (name.to_string(), json!(value))).collect::<serde_json::Map<_, _>>(),
            "figures": self.figures.iter().map(|f| json!({
                "pattern": f.pattern, "target": f.target, "mib_per_s": f.mib_per_s, "iops": f.iops,
            })).collect::<Vec<_>>(),
            "reflinks": self.reflinks.iter().map(|r| json!({
                "filesystem": r.filesystem, "bytes": r.bytes, "ms": r.took.as_secs_f64() * 1000.0,
                "ms_after_scattered_writes": r.scattered_took.as_secs_f64() * 1000.0,
            })).collect::<Vec<_>>(),
        })
    }
}
