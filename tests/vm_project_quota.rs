//! Project quota proven live on XFS and ext4, in a VM.
//!
//! The host kernel may lack XFS quota and the ext4 quota format (CONFIG_XFS_QUOTA,
//! CONFIG_QFMT_V2), so this test boots Debian's generic kernel (fetched, never installed, by
//! hack/fetch-vm-kernel.sh) under KVM with a tiny initramfs: a static busybox and the modules
//! the kernel needs. The guest mounts the host's root read-only over virtio-9p, chroots into it
//! and runs this same test binary in guest mode (`HPP_VM_GUEST`), which makes an XFS and an ext4
//! loop filesystem with project quota and drives the provisioner's own pool API on them: the
//! quota capability decided from the real facts, a project volume a writer fills up to its limit,
//! the raised limit of an expansion, 50 volumes' ids, a restart, deletion. It prints what it
//! observed as `HPPVM <fs> <key> <value>` lines on the serial console; the host side asserts on
//! them. Nothing is mocked: the kernel enforces, the test only reports and checks.
//!
//! Needs root (the guest's loop mounts are its own, but KVM and the kernel fetch are not),
//! `/dev/kvm`, and qemu-system-x86 (the fetch script installs it). Without them it fails.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

const GUEST_ENV: &str = "HPP_VM_GUEST";
/// Where the guest's writable scratch space is, as the host chose it.
const SCRATCH_ENV: &str = "HPP_VM_SCRATCH";
/// Host directories the guest may cover with its scratch tmpfs, in order of preference.
const SCRATCH_CANDIDATES: [&str; 5] = ["/tmp", "/mnt", "/srv", "/media", "/opt"];
const TEST_NAME: &str = "project_quota_stops_writers_on_xfs_and_ext4_in_a_vm";
const MIB: u64 = 1 << 20;
/// The first limit, and the one an expansion raises it to.
const FIRST_LIMIT: u64 = 10 * MIB;
const RAISED_LIMIT: u64 = 20 * MIB;
/// Volumes made to check that ids are distinct.
const MANY: usize = 50;
/// Create, write, delete and purge cycles after which nothing may be left charged.
const CYCLES: usize = 1000;
/// The larger block size of the two filesystems here (XFS 4 KiB; ext4 this small takes 1 KiB).
const BLOCK: u64 = 4096;

#[test]
fn project_quota_stops_writers_on_xfs_and_ext4_in_a_vm() {
    if std::env::var_os(GUEST_ENV).is_some() {
        guest::run();
    } else {
        host::run();
    }
}

/// What the guest observed, by filesystem and key.
type Observed = BTreeMap<(String, String), String>;

mod host {
    use super::*;

    /// Generous: a cold boot, two mkfs and the scenario take well under a minute on KVM.
    const VM_TIMEOUT: Duration = Duration::from_secs(480);
    /// Modules the guest loads, dependencies first. crc32c goes before ext4 and XFS: they ask
    /// the crypto API for it, which would otherwise call a modprobe the initramfs does not have.
    const ROOT_MODULES: [&str; 9] =
        ["crc32c_generic", "virtio_pci", "9pnet_virtio", "9p", "loop", "quota_tree", "quota_v2", "xfs", "ext4"];

    pub fn run() {
        let accel = accelerator();
        let kernel = fetch_kernel();
        let scratch = tempfile::tempdir().expect("temp dir");
        let initramfs = scratch.path().join("initramfs.cpio");
        build_initramfs(&kernel, &initramfs);
        let console = scratch.path().join("console.log");
        let started = Instant::now();
        let vm = Vm::boot(&kernel, &initramfs, &console, accel);
        let exited = vm.wait(VM_TIMEOUT);
        let log = std::fs::read_to_string(&console).unwrap_or_default();
        assert!(exited, "the VM did not power off within {VM_TIMEOUT:?}; its console:\n{log}");
        eprintln!("VM ({accel}) with kernel {} ran for {:.1} s", kernel.release, started.elapsed().as_secs_f64());
        let observed = parse(&log);
        assert!(
            observed.contains_key(&("all".into(), "done".into())),
            "the guest did not finish its scenario; its console:\n{log}"
        );
        for line in log.lines().filter_map(report_line) {
            eprintln!("HPPVM {line}");
        }
        for fs in ["xfs", "ext4"] {
            check(fs, &observed, &log);
        }
    }

    /// KVM when the CPU offers hardware virtualisation to this machine, else qemu's own
    /// emulation (TCG), slower but complete. A `/dev/kvm` without `vmx`/`svm` among the CPU
    /// flags (a VM without nested virtualisation exposing the device anyway) accepts a guest and
    /// never runs it. `HPP_VM_ACCEL=kvm|tcg` overrides the choice.
    fn accelerator() -> &'static str {
        match std::env::var("HPP_VM_ACCEL").as_deref() {
            Ok("kvm") => return "kvm",
            Ok("tcg") => return "tcg",
            Ok(other) => panic!("HPP_VM_ACCEL={other}: expected kvm or tcg"),
            Err(_) => {}
        }
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let hardware = cpuinfo
            .lines()
            .filter(|l| l.starts_with("flags"))
            .any(|l| l.split_whitespace().any(|flag| flag == "vmx" || flag == "svm"));
        let kvm = std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").is_ok();
        if hardware && kvm {
            "kvm"
        } else {
            eprintln!(
                "no usable KVM (CPU virtualisation flag: {hardware}, /dev/kvm open: {kvm}): the VM runs under TCG"
            );
            "tcg"
        }
    }

    /// The guest's report in a console line, after `HPPVM ` (libtest's `test ... ` may come first).
    fn report_line(line: &str) -> Option<&str> {
        let at = line.find("HPPVM ")?;
        Some(line[at + "HPPVM ".len()..].trim_end())
    }

    fn parse(log: &str) -> Observed {
        log.lines()
            .filter_map(|line| {
                let mut words = report_line(line)?.splitn(3, ' ');
                let (fs, key, value) = (words.next()?, words.next()?, words.next().unwrap_or(""));
                Some(((fs.to_owned(), key.to_owned()), value.to_owned()))
            })
            .collect()
    }

    fn check(fs: &str, observed: &Observed, log: &str) {
        let get = |key: &str| -> &str {
            observed
                .get(&(fs.to_owned(), key.to_owned()))
                .unwrap_or_else(|| panic!("{fs}: the guest reported no {key}; its console:\n{log}"))
        };
        let number = |key: &str| -> u64 {
            get(key).parse().unwrap_or_else(|_| panic!("{fs}: {key} is not a number: {}", get(key)))
        };
        assert_eq!(get("kernel"), observed[&("all".into(), "kernel".into())], "{fs}: kernel line");
        assert_eq!(get("capability"), "project", "{fs}: the pool's capability, from {}", get("facts"));

        // A writer stops at the limit, nowhere near the end of the disk.
        let disk = number("disk_bytes");
        let first = number("first_write_bytes");
        // XFS reports a full project as a full disk (xfs_trans_dqresv answers ENOSPC for project
        // dquots); ext4 answers EDQUOT like for user and group quotas.
        let refusal = if fs == "xfs" { "ENOSPC" } else { "EDQUOT" };
        assert_eq!(get("first_write_error"), refusal, "{fs}: the first writer's refusal");
        assert!(
            (FIRST_LIMIT - 256 * 1024..=FIRST_LIMIT).contains(&first),
            "{fs}: the first writer stopped at {first} bytes, not near the {FIRST_LIMIT}-byte limit"
        );
        assert!(first < disk / 4, "{fs}: {first} bytes written is not far below the disk's {disk}");
        assert_eq!(get("first_sync"), "ok", "{fs}: fsync after the refusal");
        let used = number("used_after_first");
        assert!(
            used >= first && used - first <= 2 * BLOCK,
            "{fs}: used bytes {used} read back do not match the {first} bytes written within two blocks"
        );

        // Raising the limit (what an expansion does) lets it write on, up to the new limit.
        let second = number("second_write_bytes");
        assert_eq!(get("second_write_error"), refusal, "{fs}: the second writer's refusal");
        let total = first + second;
        assert!(
            (RAISED_LIMIT - 256 * 1024..=RAISED_LIMIT).contains(&total),
            "{fs}: after raising the limit the file reached {total} bytes, not near {RAISED_LIMIT}"
        );
        let used = number("used_after_second");
        assert!(
            used >= total && used - total <= 2 * BLOCK,
            "{fs}: used bytes {used} read back do not match the {total} bytes written within two blocks"
        );
        assert_eq!(number("limit_after_raise"), RAISED_LIMIT, "{fs}: the raised limit read back");

        // Every volume gets an id of its own; a restart never reuses a live one (the trashed
        // volume's id is live until its data is purged).
        let limited_id: u32 = number("limited_id").try_into().expect("id");
        let many: Vec<u32> = get("many_ids").split(',').map(|id| id.parse().expect("id")).collect();
        assert_eq!(many.len(), MANY, "{fs}: ids of the volumes made");
        let live: BTreeSet<u32> = many.iter().copied().chain([limited_id]).collect();
        assert_eq!(live.len(), MANY + 1, "{fs}: project ids given out twice: {many:?} and {limited_id}");
        assert!(live.iter().all(|id| *id >= 1 << 20), "{fs}: ids below the provisioner's range: {live:?}");
        let after_restart: u32 = number("after_restart_id").try_into().expect("id");
        assert!(!live.contains(&after_restart), "{fs}: after a restart a new volume took the live id {after_restart}");
        assert_eq!(get("after_restart_capability"), "project", "{fs}: capability after the restart");

        // Deleting a volume clears its limit at once, and after the purge nothing is charged to
        // its id and no directory carries it: the next volume gets it.
        assert_eq!(get("trashed_limit"), "0", "{fs}: the trashed volume's limit");
        assert!(number("trashed_used") >= total, "{fs}: the trashed data is charged until purged");
        assert_eq!(get("purged_quota"), "none", "{fs}: project {limited_id} after the purge");
        assert_eq!(number("after_purge_id"), u64::from(limited_id), "{fs}: the purged volume's id is free again");
        assert_eq!(get("purged_volumes"), "1", "{fs}: trash entries purged");

        // After the create/delete cycles, exactly the live volumes have a project quota record
        // and carry an id: nothing leaked.
        let ids = |key: &str| -> BTreeSet<u32> {
            get(key).split(',').filter(|id| !id.is_empty()).map(|id| id.parse().expect("id")).collect()
        };
        assert_eq!(number("cycles"), CYCLES as u64, "{fs}: cycles run");
        let cycle_ids = ids("cycle_ids");
        assert!(
            cycle_ids.iter().all(|id| !live.contains(id) && *id != after_restart),
            "{fs}: a cycle volume took a live id: {cycle_ids:?}"
        );
        let live_now: BTreeSet<u32> = many.iter().copied().chain([after_restart, limited_id]).collect();
        assert_eq!(ids("charged_ids"), live_now, "{fs}: project ids with a limit or usage after the cycles");
        assert_eq!(ids("carried_ids"), live_now, "{fs}: project ids on the pool's directories after the cycles");
        assert_eq!(number("trash_entries"), 0, "{fs}: trash after the cycles");
    }

    /// The kernel fetched and unpacked by hack/fetch-vm-kernel.sh.
    pub struct Kernel {
        pub vmlinuz: PathBuf,
        pub modules: PathBuf,
        pub release: String,
    }

    fn fetch_kernel() -> Kernel {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("hack/fetch-vm-kernel.sh");
        let output = Command::new("bash").arg(&script).output().expect("running hack/fetch-vm-kernel.sh");
        let log = String::from_utf8_lossy(&output.stderr);
        assert!(output.status.success(), "hack/fetch-vm-kernel.sh failed:\n{log}");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let dir = PathBuf::from(stdout.lines().last().unwrap_or_default().trim());
        let vmlinuz = std::fs::read_dir(dir.join("boot"))
            .unwrap_or_else(|e| panic!("{}: {e}\n{log}", dir.display()))
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-")))
            .unwrap_or_else(|| panic!("no vmlinuz-* in {}/boot", dir.display()));
        let release = vmlinuz.file_name().unwrap().to_string_lossy().trim_start_matches("vmlinuz-").to_owned();
        let modules = dir.join("lib/modules").join(&release);
        assert!(modules.is_dir(), "no modules for {release} in {}", dir.display());
        Kernel { vmlinuz, modules, release }
    }

    /// Writes the guest's initramfs: `/init`, a static busybox, and the modules with their
    /// dependencies in load order (`/modules.order`), as an uncompressed newc cpio.
    fn build_initramfs(kernel: &Kernel, out: &Path) {
        let mut by_name = BTreeMap::new();
        index_modules(&kernel.modules.join("kernel"), &mut by_name);
        let mut order = Vec::new();
        for root in ROOT_MODULES {
            add_with_dependencies(root, &by_name, &mut order);
        }
        let busybox = std::fs::read("/bin/busybox").expect("/bin/busybox (busybox-static)");
        let binary = std::env::current_exe().expect("this test binary");
        let init = init_script(&binary, &guest_scratch(&binary));

        let mut cpio = Cpio::default();
        for dir in ["bin", "dev", "proc", "sys", "host", "modules"] {
            cpio.entry(dir, 0o040_755, 0, &[]);
        }
        // The console the kernel opens for init before anything is mounted.
        cpio.entry("dev/console", 0o020_600, 5 << 8 | 1, &[]);
        cpio.entry("bin/busybox", 0o100_755, 0, &busybox);
        cpio.entry("init", 0o100_755, 0, init.as_bytes());
        for name in &order {
            let ko = std::fs::read(&by_name[name]).expect("module file");
            cpio.entry(&format!("modules/{name}.ko"), 0o100_644, 0, &ko);
        }
        cpio.entry("modules.order", 0o100_644, 0, (order.join("\n") + "\n").as_bytes());
        std::fs::write(out, cpio.finish()).expect("write the initramfs");
    }

    fn init_script(binary: &Path, scratch: &Path) -> String {
        format!(
            r#"#!/bin/busybox sh
bb=/bin/busybox
$bb mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
$bb mount -t proc proc /proc
for m in $($bb cat /modules.order); do
  $bb insmod /modules/$m.ko || echo "HPPVM all init-error insmod $m"
done
if ! $bb mount -t 9p -o trans=virtio,version=9p2000.L,ro,cache=loose,msize=512000 hostroot /host; then
  echo "HPPVM all init-error cannot mount the host root"
  $bb reboot -f
fi
$bb mount -t proc proc /host/proc
$bb mount -t sysfs sys /host/sys
$bb mount -t devtmpfs dev /host/dev
$bb mount -t tmpfs -o size=700m scratch '/host{scratch}'
echo "HPPVM all kernel $($bb uname -r)"
export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME='{scratch}' TMPDIR='{scratch}' RUST_BACKTRACE=1 {GUEST_ENV}=1 {SCRATCH_ENV}='{scratch}'
$bb chroot /host '{binary}' {TEST_NAME} --exact --nocapture --test-threads=1
echo "HPPVM all guest-exit $?"
$bb reboot -f
"#,
            binary = binary.display(),
            scratch = scratch.display(),
        )
    }

    /// The host directory the guest covers with its writable tmpfs: one that exists on the host
    /// root and holds neither this test binary nor anything it runs (a checkout under /tmp would
    /// otherwise be hidden from the guest).
    pub(super) fn guest_scratch(binary: &Path) -> PathBuf {
        let binary = binary.canonicalize().unwrap_or_else(|_| binary.to_owned());
        SCRATCH_CANDIDATES
            .iter()
            .map(Path::new)
            .find(|dir| dir.is_dir() && !binary.starts_with(dir) && !dir.is_symlink())
            .unwrap_or_else(|| panic!("none of {SCRATCH_CANDIDATES:?} is free of {}", binary.display()))
            .to_owned()
    }

    /// Module name (as `depends=` spells it: underscores) to its file.
    fn index_modules(dir: &Path, by_name: &mut BTreeMap<String, PathBuf>) {
        for entry in std::fs::read_dir(dir).expect("modules dir").flatten() {
            let path = entry.path();
            if path.is_dir() {
                index_modules(&path, by_name);
            } else if let Some(stem) = path.file_name().and_then(|n| n.to_str()).and_then(|n| n.strip_suffix(".ko")) {
                by_name.insert(stem.replace('-', "_"), path);
            }
        }
    }

    fn add_with_dependencies(name: &str, by_name: &BTreeMap<String, PathBuf>, order: &mut Vec<String>) {
        if order.iter().any(|m| m == name) {
            return;
        }
        let path = by_name.get(name).unwrap_or_else(|| panic!("module {name} not in the kernel package"));
        let ko = std::fs::read(path).expect("module file");
        for dependency in module_dependencies(&ko) {
            add_with_dependencies(&dependency, by_name, order);
        }
        order.push(name.to_owned());
    }

    /// The `depends=` entry of a module's `.modinfo` strings (NUL-separated `key=value`).
    fn module_dependencies(ko: &[u8]) -> Vec<String> {
        let key = b"\0depends=";
        let Some(at) = ko.windows(key.len()).position(|w| w == key) else { return Vec::new() };
        let value = &ko[at + key.len()..];
        let end = value.iter().position(|b| *b == 0).unwrap_or(value.len());
        String::from_utf8_lossy(&value[..end]).split(',').filter(|d| !d.is_empty()).map(str::to_owned).collect()
    }

    /// An uncompressed `newc` cpio archive, the format the kernel unpacks as initramfs.
    #[derive(Default)]
    struct Cpio {
        bytes: Vec<u8>,
        next_ino: u32,
    }

    impl Cpio {
        fn entry(&mut self, name: &str, mode: u32, rdev: u32, data: &[u8]) {
            self.next_ino += 1;
            let fields = [
                self.next_ino,
                mode,
                0,
                0,
                if mode & 0o170_000 == 0o040_000 { 2 } else { 1 },
                0,
                data.len() as u32,
                0,
                0,
                rdev >> 8,
                rdev & 0xff,
                name.len() as u32 + 1,
                0,
            ];
            self.bytes.extend_from_slice(b"070701");
            for field in fields {
                write!(self.bytes, "{field:08x}").expect("write to a Vec");
            }
            self.bytes.extend_from_slice(name.as_bytes());
            self.bytes.push(0);
            self.pad();
            self.bytes.extend_from_slice(data);
            self.pad();
        }

        fn pad(&mut self) {
            while !self.bytes.len().is_multiple_of(4) {
                self.bytes.push(0);
            }
        }

        fn finish(mut self) -> Vec<u8> {
            self.entry("TRAILER!!!", 0, 0, &[]);
            self.bytes
        }
    }

    /// The qemu this test started; killed by its PID if still running when dropped.
    struct Vm(std::process::Child);

    impl Vm {
        fn boot(kernel: &Kernel, initramfs: &Path, console: &Path, accel: &str) -> Vm {
            let child = Command::new("qemu-system-x86_64")
                .args(["-accel", accel, "-m", "1024", "-smp", "1"])
                .args(["-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"])
                .arg("-serial")
                .arg(format!("file:{}", console.display()))
                .arg("-kernel")
                .arg(&kernel.vmlinuz)
                .arg("-initrd")
                .arg(initramfs)
                .args(["-append", "console=ttyS0 quiet panic=-1"])
                .args(["-fsdev", "local,id=hostroot,path=/,security_model=none,readonly=on,multidevs=remap"])
                .args(["-device", "virtio-9p-pci,fsdev=hostroot,mount_tag=hostroot"])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::inherit())
                .spawn()
                .expect("starting qemu-system-x86_64 (hack/fetch-vm-kernel.sh installs it)");
            Vm(child)
        }

        /// Waits for the VM to power off; false on timeout.
        fn wait(mut self, timeout: Duration) -> bool {
            let deadline = Instant::now() + timeout;
            while Instant::now() < deadline {
                match self.0.try_wait().expect("waiting for qemu") {
                    Some(status) => {
                        assert!(status.success(), "qemu exited with {status}");
                        return true;
                    }
                    None => std::thread::sleep(Duration::from_millis(200)),
                }
            }
            false
        }
    }

    impl Drop for Vm {
        fn drop(&mut self) {
            if let Ok(None) = self.0.try_wait() {
                // Child::kill signals exactly this PID.
                let _ = self.0.kill();
                let _ = self.0.wait();
            }
        }
    }
}

mod guest {
    use super::*;
    use hostpath_provisioner::deciding::quota;
    use hostpath_provisioner::filesystem::quota::project;
    use hostpath_provisioner::filesystem::{PoolRoot, VolumeDirName};

    pub fn run() {
        // Guest mode makes and mounts filesystems: only ever under the VM's own init.
        let init = std::fs::read("/proc/1/cmdline").unwrap_or_default();
        assert_eq!(init, b"/bin/busybox\0sh\0/init\0", "{GUEST_ENV} is set outside the test's VM");
        let scratch = PathBuf::from(std::env::var_os(SCRATCH_ENV).expect(SCRATCH_ENV)).join("hpp-vm");
        let scratch = scratch.as_path();
        std::fs::create_dir_all(scratch).expect("scratch dir");
        for fs in ["xfs", "ext4"] {
            let mount = scratch.join(fs);
            let image = scratch.join(format!("{fs}.img"));
            make_filesystem(fs, &image, &mount);
            let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("osrelease");
            println!("HPPVM {fs} kernel {}", kernel.trim());
            scenario(fs, &mount);
            run_ok(Command::new("umount").arg(&mount));
            std::fs::remove_file(&image).expect("remove the image");
        }
        println!("HPPVM all done");
    }

    fn make_filesystem(fs: &str, image: &Path, mount: &Path) {
        std::fs::create_dir_all(mount).expect("mount point");
        // XFS's minimum is 300 MiB; the image is sparse on the guest's tmpfs.
        let size = if fs == "xfs" { 300 * MIB } else { 128 * MIB };
        std::fs::File::create(image).and_then(|f| f.set_len(size)).expect("image file");
        match fs {
            "xfs" => run_ok(Command::new("mkfs.xfs").args(["-q", "-f"]).arg(image)),
            // Project quota needs 256-byte inodes, which small filesystems do not get by default.
            _ => run_ok(Command::new("mkfs.ext4").args(["-q", "-F", "-I", "256", "-O", "quota,project"]).arg(image)),
        }
        run_ok(Command::new("mount").args(["-o", "loop,prjquota"]).arg(image).arg(mount));
    }

    fn run_ok(cmd: &mut Command) {
        let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
        assert!(out.status.success(), "{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }

    fn scenario(fs: &str, mount: &Path) {
        let say = |key: &str, value: &dyn std::fmt::Display| println!("HPPVM {fs} {key} {value}");
        let pool = PoolRoot::open(fs, mount).expect("open the pool");
        let facts = pool.quota_facts().expect("quota facts");
        say("facts", &format!("{facts:?}").replace(' ', ""));
        say("capability", &quota::capability(&facts).label());
        let stat = rustix::fs::statvfs(mount).expect("statvfs");
        say("disk_bytes", &(stat.f_blocks * stat.f_frsize));

        let limited = VolumeDirName::new("pvc-limited").expect("name");
        pool.create_project_volume(&limited, 0o777, FIRST_LIMIT).expect("create the limited volume");
        let data = mount.join("pvc-limited/data");
        let (written, error, sync) = write_until_refused(&data);
        say("first_write_bytes", &written);
        say("first_write_error", &error);
        say("first_sync", &sync);
        say("used_after_first", &used(&pool, &limited));

        pool.set_quota_limit(&limited, RAISED_LIMIT).expect("raise the limit");
        let (written, error, _) = write_until_refused(&data);
        say("second_write_bytes", &written);
        say("second_write_error", &error);
        say("used_after_second", &used(&pool, &limited));
        let limited_id = id_of(&mount.join("pvc-limited"));
        say("limited_id", &limited_id);
        let quota_now = pool.project_quota(limited_id).expect("read the quota").expect("a quota record");
        say("limit_after_raise", &quota_now.limit_bytes);

        let ids: Vec<String> = (0..MANY)
            .map(|i| {
                let name = VolumeDirName::new(&format!("pvc-many-{i}")).expect("name");
                pool.create_project_volume(&name, 0o777, MIB).expect("create a volume");
                id_of(&pool.volume_path(&name)).to_string()
            })
            .collect();
        say("many_ids", &ids.join(","));

        pool.move_to_trash(&limited).expect("move to the trash");
        let trashed = pool.project_quota(limited_id).expect("read the quota").unwrap_or_default();
        say("trashed_limit", &trashed.limit_bytes);
        say("trashed_used", &trashed.used_bytes);

        // A restart: the pool is opened afresh and knows ids only from the directories.
        drop(pool);
        let pool = PoolRoot::open(fs, mount).expect("reopen the pool");
        say("after_restart_capability", &quota::capability(&pool.quota_facts().expect("facts")).label());
        let after_restart = VolumeDirName::new("pvc-after-restart").expect("name");
        pool.create_project_volume(&after_restart, 0o777, MIB).expect("create after the restart");
        say("after_restart_id", &id_of(&pool.volume_path(&after_restart)));

        say("purged_volumes", &pool.purge_trash().expect("purge the trash"));
        let purged = settle(
            mount,
            || pool.project_quota(limited_id).expect("read the quota"),
            |q| q.unwrap_or_default() == project::ProjectQuota::default(),
        );
        let purged = match purged {
            // ext4 keeps a record for every id: an empty one is as good as none.
            None | Some(project::ProjectQuota { limit_bytes: 0, used_bytes: 0 }) => "none".to_owned(),
            Some(q) => format!("limit={},used={}", q.limit_bytes, q.used_bytes),
        };
        say("purged_quota", &purged);
        let after_purge = VolumeDirName::new("pvc-after-purge").expect("name");
        pool.create_project_volume(&after_purge, 0o777, MIB).expect("create after the purge");
        say("after_purge_id", &id_of(&pool.volume_path(&after_purge)));

        // Create, write, delete, purge, many times over: each cycle's project must leave no
        // limit, no usage and no directory behind.
        let mut cycle_ids = BTreeSet::new();
        let cycling = VolumeDirName::new("pvc-cycle").expect("name");
        for _ in 0..CYCLES {
            pool.create_project_volume(&cycling, 0o777, MIB).expect("create a cycle volume");
            let dir = pool.volume_path(&cycling);
            cycle_ids.insert(id_of(&dir));
            std::fs::write(dir.join("data"), [0x5a_u8; 8192]).expect("write in a cycle volume");
            pool.move_to_trash(&cycling).expect("trash a cycle volume");
            assert_eq!(pool.purge_trash().expect("purge a cycle volume"), 1, "one cycle volume purged");
        }
        say("cycles", &CYCLES);
        say("cycle_ids", &join(cycle_ids.iter()));
        let carried: BTreeSet<u32> = pool
            .list_entries()
            .expect("list the pool")
            .iter()
            .filter(|entry| !entry.starts_with('.'))
            .map(|entry| id_of(&mount.join(entry)))
            // ext4's lost+found carries project 0: not one of ours.
            .filter(|id| *id >= 1 << 20)
            .collect();
        say("carried_ids", &join(carried.iter()));
        let charged = settle(
            mount,
            || pool.charged_project_ids().expect("list the project quotas"),
            |charged| charged.keys().eq(carried.iter()),
        );
        say("charged_ids", &join(charged.keys()));
        say("trash_entries", &pool.trash_pending().expect("trash entries"));
    }

    /// Reads until `settled` holds, for at most a minute, and returns the last reading. XFS frees
    /// the blocks of a removed file in the background (deferred inode inactivation), so a purged
    /// project's usage drops a moment after the purge; `syncfs` pushes that work along.
    fn settle<T>(mount: &Path, mut read: impl FnMut() -> T, settled: impl Fn(&T) -> bool) -> T {
        let deadline = Instant::now() + Duration::from_secs(60);
        let dir = std::fs::File::open(mount).expect("open the mount");
        loop {
            let value = read();
            if settled(&value) || Instant::now() > deadline {
                return value;
            }
            rustix::fs::syncfs(&dir).expect("syncfs");
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn join<'a>(ids: impl Iterator<Item = &'a u32>) -> String {
        ids.map(u32::to_string).collect::<Vec<_>>().join(",")
    }

    fn used(pool: &PoolRoot, name: &VolumeDirName) -> String {
        pool.quota_used_bytes(name).map_or("none".to_owned(), |b| b.to_string())
    }

    fn id_of(dir: &Path) -> u32 {
        let file = std::fs::File::open(dir).expect("open a volume");
        project::project_id(&file).expect("read a project id")
    }

    /// Appends 64 KiB chunks until the kernel refuses one, as a workload would: in a thread
    /// without `CAP_SYS_RESOURCE` (which lets a process past quota hard limits on ext4, and which
    /// containers do not get). Returns the bytes it took, the refusal, and how the fsync after
    /// it went.
    fn write_until_refused(path: &Path) -> (u64, String, String) {
        let path = path.to_owned();
        std::thread::spawn(move || {
            drop_sys_resource();
            write_until_refused_here(&path)
        })
        .join()
        .expect("the writer thread")
    }

    /// Clears `CAP_SYS_RESOURCE` from the calling thread's effective set (capabilities are per
    /// thread; the raw system call leaves the other threads alone).
    fn drop_sys_resource() {
        #[repr(C)]
        struct Header {
            version: u32,
            pid: i32,
        }
        #[repr(C)]
        #[derive(Clone, Copy, Default)]
        struct Data {
            effective: u32,
            permitted: u32,
            inheritable: u32,
        }
        const VERSION_3: u32 = 0x2008_0522;
        const CAP_SYS_RESOURCE: u32 = 24;
        let mut header = Header { version: VERSION_3, pid: 0 };
        let mut data = [Data::default(); 2];
        // SAFETY: header and two data structs, as capget(2)/capset(2) with version 3 take them.
        let got = unsafe { libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) };
        assert_eq!(got, 0, "capget: {}", std::io::Error::last_os_error());
        data[0].effective &= !(1 << CAP_SYS_RESOURCE);
        // SAFETY: as above.
        let set = unsafe { libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) };
        assert_eq!(set, 0, "capset: {}", std::io::Error::last_os_error());
    }

    fn write_until_refused_here(path: &Path) -> (u64, String, String) {
        let mut file = std::fs::OpenOptions::new().create(true).append(true).open(path).expect("open the data file");
        let chunk = vec![0xa5_u8; 64 << 10];
        let mut written = 0_u64;
        let error = loop {
            match file.write(&chunk) {
                Ok(0) => break "a write of 0 bytes".to_owned(),
                Ok(n) => written += n as u64,
                Err(e) => break errno_name(&e),
            }
            if written > 1 << 30 {
                break "no refusal within 1 GiB".to_owned();
            }
        };
        let sync = file.sync_all().map_or_else(|e| errno_name(&e), |()| "ok".to_owned());
        (written, error, sync)
    }

    fn errno_name(e: &std::io::Error) -> String {
        match rustix::io::Errno::from_io_error(e) {
            Some(rustix::io::Errno::DQUOT) => "EDQUOT".to_owned(),
            Some(rustix::io::Errno::NOSPC) => "ENOSPC".to_owned(),
            _ => e.to_string(),
        }
    }
}

/// A checkout under /tmp once had its test binary hidden by the guest's tmpfs.
#[test]
fn the_guest_scratch_never_covers_the_test_binary() {
    for binary in ["/tmp/x/target/debug/deps/vm_project_quota-0", "/tmp/a b/t/vm", "/opt/src/target/vm"] {
        let scratch = host::guest_scratch(Path::new(binary));
        assert!(!Path::new(binary).starts_with(&scratch), "{} covers {binary}", scratch.display());
        assert!(scratch.is_dir(), "{}", scratch.display());
    }
}
