//! On real loop devices, as root, in a temporary directory: every loop and node a test makes is
//! removed by a guard, even when the test fails. Without root or loop devices the tests say
//! SKIPPED, and fail under `CI=true`.

use std::fs;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt, symlink};

use super::*;

const MIB: u64 = 1 << 20;

fn usable() -> bool {
    let ok = rustix::process::geteuid().is_root() && Path::new("/dev/loop-control").exists();
    if !ok {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "Block volume tests need root and /dev/loop-control"
        );
        eprintln!("SKIPPED: Block volume tests need root and /dev/loop-control");
    }
    ok
}

/// A pool with one volume directory and a device directory in a temporary directory; on drop,
/// detaches every loop whose backing file is one of the files it made.
struct Fixture {
    tmp: tempfile::TempDir,
    pool: PoolRoot,
    dir: OwnedFd,
    host: LoopHost,
    devices: DeviceDir,
    node: VolumeDirName,
    made: std::sync::Mutex<Vec<FileId>>,
}

impl Fixture {
    fn new() -> Option<Self> {
        if !usable() {
            return None;
        }
        let tmp = tempfile::tempdir().expect("tempdir");
        fs::create_dir_all(tmp.path().join("pool/pvc-1")).expect("mkdir");
        let pool = PoolRoot::open("test", &tmp.path().join("pool")).expect("pool");
        let dir = pool.open_block_volume_dir(&VolumeDirName::new("pvc-1").unwrap()).expect("open").expect("there");
        let devices = DeviceDir::open(&tmp.path().join("dev")).expect("device dir");
        let node = VolumeDirName::new("pvc-0b5c7f8e-6a4d-4e1f-9c2b-3d4e5f607182").unwrap();
        Some(Fixture { tmp, pool, dir, host: LoopHost::host(), devices, node, made: Default::default() })
    }

    fn dir_path(&self) -> PathBuf {
        self.tmp.path().join("pool/pvc-1")
    }

    fn file_path(&self) -> PathBuf {
        self.dir_path().join(BACKING_FILE)
    }

    fn node_path(&self) -> PathBuf {
        self.tmp.path().join("dev").join(self.node.as_str())
    }

    fn create(&self, size: u64, allocation: Allocation) -> (OwnedFd, FileId) {
        let (fd, id) = create_backing(self.dir.as_fd(), &self.dir_path(), size, allocation).expect("create");
        self.made.lock().unwrap().push(id);
        (fd, id)
    }

    /// A file outside the volume (a host disk image, another volume's file), guarded too.
    fn outside_file(&self, name: &str) -> (fs::File, FileId) {
        let path = self.tmp.path().join(name);
        let file = fs::OpenOptions::new().read(true).write(true).create_new(true).open(&path).expect("create");
        file.set_len(4 * MIB).expect("size");
        let id = loop_ioctl::file_id(&file).expect("stat");
        self.made.lock().unwrap().push(id);
        (file, id)
    }

    fn expose(&self, volume: Volume) -> Result<AttachedLoop, PoolError> {
        expose(&self.host, &self.devices, self.dir.as_fd(), &self.dir_path(), volume, &self.node, true)
    }

    fn release(&self, volume: Volume) -> Result<Detached, PoolError> {
        release(&self.host, &self.devices, self.dir.as_fd(), &self.dir_path(), volume, &self.node)
    }

    fn loops_on(&self, id: FileId) -> Vec<u32> {
        self.host
            .loops()
            .expect("loops")
            .into_iter()
            .filter(|l| l.facts.backing == id)
            .map(|l| l.facts.number)
            .collect()
    }
}

impl Fixture {
    /// A second volume, `pvc-<n>` with node `pvc-<uid n>`: its directory, node name and file.
    fn another_volume(&self, n: u32) -> (OwnedFd, PathBuf, VolumeDirName, FileId) {
        let dir_name = VolumeDirName::new(&format!("pvc-{n}")).unwrap();
        self.pool.create_volume_dir(&dir_name, 0o700).expect("mkdir");
        let dir = self.pool.open_block_volume_dir(&dir_name).expect("open").expect("there");
        let dir_path = self.pool.volume_path(&dir_name);
        let (_fd, id) = create_backing(dir.as_fd(), &dir_path, 4 * MIB, Allocation::Sparse).expect("create");
        self.made.lock().unwrap().push(id);
        let node = VolumeDirName::new(&format!("pvc-{n:08}-6a4d-4e1f-9c2b-3d4e5f607182")).unwrap();
        (dir, dir_path, node, id)
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        for id in self.made.lock().unwrap().iter() {
            for number in self.loops_on(*id) {
                let _ = self.host.detach(number, *id);
            }
        }
    }
}

fn recorded(id: FileId) -> Volume {
    Volume { recorded_inode: Some(id.ino) }
}

#[test]
fn a_sparse_volume_is_attached_exposed_written_and_released_leaving_no_loop_and_no_node() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(8 * MIB, Allocation::Sparse);
    let meta = fs::metadata(fx.file_path()).expect("stat");
    assert_eq!((meta.len(), meta.mode() & 0o777), (8 * MIB, 0o600));
    assert!(meta.blocks() * 512 < MIB, "sparse: {} blocks", meta.blocks());

    let exposed = fx.expose(Volume { recorded_inode: None }).expect("expose while provisioning");
    assert_eq!(exposed.facts.backing, id);
    assert_eq!((exposed.facts.offset, exposed.facts.size_limit), (0, 0));
    assert!(exposed.direct_io, "ext4 takes direct I/O");
    let node = fs::symlink_metadata(fx.node_path()).expect("node");
    assert!(node.file_type().is_block_device());
    assert_eq!(
        (rustix::fs::major(node.rdev()), rustix::fs::minor(node.rdev())),
        exposed.facts.device,
        "the node is the loop's device"
    );
    let size = fs::read_to_string(format!("/sys/block/loop{}/size", exposed.facts.number)).expect("size");
    assert_eq!(size.trim().parse::<u64>().unwrap() * 512, 8 * MIB);
    // No autoclear: the loop outlives every opener.
    let flags = loop_ioctl::status(fx.host.open_checked(exposed.facts.number, id).unwrap().as_fd()).unwrap().lo_flags;
    assert_eq!(flags & loop_ioctl::LO_FLAGS_AUTOCLEAR, 0);

    // What is written through the node lands in the volume's file.
    let pattern: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
    {
        let mut device = fs::OpenOptions::new().write(true).open(fx.node_path()).expect("open node");
        device.seek(SeekFrom::Start(MIB)).unwrap();
        device.write_all(&pattern).unwrap();
        device.sync_all().unwrap();
    }
    let mut back = vec![0; 4096];
    let mut file = fs::File::open(fx.file_path()).unwrap();
    file.seek(SeekFrom::Start(MIB)).unwrap();
    file.read_exact(&mut back).unwrap();
    assert_eq!(back, pattern);

    // Exposed again (a restart): the same loop, the node kept, no second loop.
    let again = fx.expose(recorded(id)).expect("expose again");
    assert_eq!(again.facts.number, exposed.facts.number);
    assert_eq!(fx.loops_on(id), vec![exposed.facts.number]);

    assert_eq!(fx.release(recorded(id)).expect("release"), Detached::Now);
    assert!(fx.loops_on(id).is_empty(), "no loop left");
    assert!(fs::symlink_metadata(fx.node_path()).is_err(), "no node left");
    // Released twice: nothing to do.
    assert_eq!(fx.release(recorded(id)).expect("release again"), Detached::Now);
}

#[test]
fn a_full_volume_is_allocated_and_grows_online() {
    let Some(fx) = Fixture::new() else { return };
    let (fd, id) = fx.create(4 * MIB, Allocation::Full);
    assert!(fs::metadata(fx.file_path()).unwrap().blocks() * 512 >= 4 * MIB, "every block allocated");
    let exposed = fx.expose(recorded(id)).expect("expose");
    grow_backing(fd.as_fd(), &fx.dir_path(), 12 * MIB, Allocation::Full).expect("grow");
    fx.host.refresh_capacity(exposed.facts.number, id).expect("capacity");
    let size = fs::read_to_string(format!("/sys/block/loop{}/size", exposed.facts.number)).expect("size");
    assert_eq!(size.trim().parse::<u64>().unwrap() * 512, 12 * MIB, "the loop sees the new size");
    // Never shrunk.
    grow_backing(fd.as_fd(), &fx.dir_path(), MIB, Allocation::Sparse).expect("grow to less");
    assert_eq!(fs::metadata(fx.file_path()).unwrap().len(), 12 * MIB);
    fx.release(recorded(id)).expect("release");
}

#[test]
fn an_exposed_volume_grows_under_its_loop_and_a_file_on_two_loops_is_not_grown() {
    let Some(fx) = Fixture::new() else { return };
    let (fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let grow = |size| grow_volume(&fx.host, fx.dir.as_fd(), &fx.dir_path(), recorded(id), size, Allocation::Sparse);
    // Not attached: the file grows, no loop is told.
    assert_eq!(grow(6 * MIB).expect("grow detached"), None);
    let exposed = fx.expose(recorded(id)).expect("expose");
    let number = exposed.facts.number;
    assert_eq!(grow(8 * MIB).expect("grow"), Some(number), "the volume's own loop is told");
    let size = fs::read_to_string(format!("/sys/block/loop{number}/size")).expect("size");
    assert_eq!(size.trim().parse::<u64>().unwrap() * 512, 8 * MIB, "the loop sees the new size");
    assert_eq!(fx.loops_on(id), vec![number], "still the same loop, never detached");
    // Someone attached the file a second time: refused before the file grows.
    let second = fx.host.attach(fd.as_fd(), false).expect("second, by someone else");
    let refused = grow(16 * MIB).unwrap_err();
    assert!(
        matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::AttachedMoreThanOnce(_), .. }),
        "{refused}"
    );
    assert_eq!(fs::metadata(fx.file_path()).unwrap().len(), 8 * MIB, "nothing grown");
    fx.host.detach(second.facts.number, id).expect("detach theirs");
    // A file of another inode at the path: refused, nothing grown.
    let refused = grow_volume(
        &fx.host,
        fx.dir.as_fd(),
        &fx.dir_path(),
        Volume { recorded_inode: Some(id.ino + 1) },
        16 * MIB,
        Allocation::Sparse,
    )
    .unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::Replaced { .. }, .. }), "{refused}");
    assert_eq!(fs::metadata(fx.file_path()).unwrap().len(), 8 * MIB, "nothing grown");
    fx.release(recorded(id)).expect("release");
}

#[test]
fn a_copy_without_its_backing_file_is_refused_and_none_is_made_afresh() {
    let Some(fx) = Fixture::new() else { return };
    let refused = copied_backing(fx.dir.as_fd(), &fx.dir_path(), 4 * MIB, Allocation::Sparse).unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::Missing, .. }), "{refused}");
    assert!(fs::symlink_metadata(fx.file_path()).is_err(), "no empty file stands for the copied data");
    // The copy's own file is taken and grown to the request.
    fs::write(fx.file_path(), b"copied").unwrap();
    let (_fd, id) = copied_backing(fx.dir.as_fd(), &fx.dir_path(), 4 * MIB, Allocation::Sparse).expect("taken");
    assert_eq!(id.ino, fs::metadata(fx.file_path()).unwrap().ino());
    assert_eq!(fs::metadata(fx.file_path()).unwrap().len(), 4 * MIB);
    assert_eq!(&fs::read(fx.file_path()).unwrap()[..6], b"copied");
}

#[test]
fn a_source_is_flushed_before_its_copy_only_while_its_file_is_the_volumes() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let flush = |volume| flush_before_copy(&fx.host, fx.dir.as_fd(), &fx.dir_path(), volume);
    assert_eq!(flush(recorded(id)).expect("nothing attached"), 0);
    fx.expose(recorded(id)).expect("expose");
    assert_eq!(flush(recorded(id)).expect("flushed"), 1, "its one loop");
    let replaced = flush(Volume { recorded_inode: Some(id.ino + 1) }).unwrap_err();
    assert!(matches!(replaced, PoolError::BlockRefused { refusal: LoopRefusal::Replaced { .. }, .. }), "{replaced}");
    fs::remove_file(fx.node_path()).unwrap();
    fx.release(recorded(id)).expect("release");
    fs::rename(fx.file_path(), fx.tmp.path().join("aside.img")).unwrap();
    symlink(fx.tmp.path().join("aside.img"), fx.file_path()).unwrap();
    let symlinked = flush(recorded(id)).unwrap_err();
    assert!(matches!(symlinked, PoolError::BlockRefused { refusal: LoopRefusal::Symlink, .. }), "{symlinked}");
}

#[test]
fn a_symlink_at_the_backing_file_reaches_nothing_outside_the_volume() {
    let Some(fx) = Fixture::new() else { return };
    // "A host disk", attached by someone else.
    let (disk, disk_id) = fx.outside_file("host-disk.img");
    let theirs = fx.host.attach(disk.as_fd(), false).expect("their loop");
    symlink(fx.tmp.path().join("host-disk.img"), fx.file_path()).unwrap();
    let refused = fx.expose(Volume { recorded_inode: Some(disk_id.ino) }).unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::Symlink, .. }), "{refused}");
    assert!(fs::symlink_metadata(fx.node_path()).is_err(), "no node made");
    assert_eq!(fx.loops_on(disk_id), vec![theirs.facts.number], "no loop attached to the target");
    let refused = fx.release(Volume { recorded_inode: Some(disk_id.ino) }).unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { .. }), "{refused}");
    assert_eq!(fx.loops_on(disk_id), vec![theirs.facts.number], "their loop is not detached");
    // Creating the file on the symlink is refused too.
    let refused = create_backing(fx.dir.as_fd(), &fx.dir_path(), MIB, Allocation::Sparse).unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::Symlink, .. }), "{refused}");
    assert_eq!(disk.metadata().unwrap().len(), 4 * MIB, "the target is untouched");
}

#[test]
fn a_backing_file_replaced_under_its_name_is_neither_exposed_nor_detached() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, ours) = fx.create(4 * MIB, Allocation::Sparse);
    let exposed = fx.expose(recorded(ours)).expect("expose");
    // Someone moves the file aside, puts another in its place and attaches it.
    fs::rename(fx.file_path(), fx.tmp.path().join("moved.img")).unwrap();
    fs::remove_file(fx.node_path()).unwrap();
    let (other, other_id) = fx.outside_file("other.img");
    drop(other);
    fs::rename(fx.tmp.path().join("other.img"), fx.file_path()).unwrap();
    let theirs = fx.host.attach(fs::File::open(fx.file_path()).unwrap().as_fd(), false).expect("their loop");
    for refused in [fx.expose(recorded(ours)).map(|_| ()), fx.release(recorded(ours)).map(|_| ())] {
        let refused = refused.unwrap_err();
        assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::Replaced { .. }, .. }), "{refused}");
    }
    assert!(fs::symlink_metadata(fx.node_path()).is_err(), "no node made for the replacement");
    assert_eq!(fx.loops_on(ours), vec![exposed.facts.number], "our loop is not detached meanwhile");
    assert_eq!(fx.loops_on(other_id), vec![theirs.facts.number], "the loop on the replacement is left alone");
    // The file back in its place: the volume's own loop again, never the stranger's.
    fs::rename(fx.file_path(), fx.tmp.path().join("other.img")).unwrap();
    fs::rename(fx.tmp.path().join("moved.img"), fx.file_path()).unwrap();
    assert_eq!(fx.expose(recorded(ours)).expect("expose").facts.number, exposed.facts.number);
    fx.release(recorded(ours)).expect("release");
    assert_eq!(fx.loops_on(other_id), vec![theirs.facts.number], "still left alone");
}

#[test]
fn a_second_loop_on_our_file_is_not_exposed_and_both_are_detached_on_release() {
    let Some(fx) = Fixture::new() else { return };
    let (fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let first = fx.host.attach(fd.as_fd(), true).expect("first");
    let second = fx.host.attach(fd.as_fd(), true).expect("second, by someone else");
    let refused = fx.expose(recorded(id)).unwrap_err();
    assert!(
        matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::AttachedMoreThanOnce(_), .. }),
        "{refused}"
    );
    assert!(fs::symlink_metadata(fx.node_path()).is_err());
    fx.release(recorded(id)).expect("release");
    assert!(fx.loops_on(id).is_empty(), "loop{} and loop{} detached", first.facts.number, second.facts.number);
}

#[test]
fn a_stale_node_or_a_symlink_at_the_nodes_name_is_replaced_without_following_it() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let (target, target_id) = fx.outside_file("target.img");
    drop(target);
    symlink(fx.tmp.path().join("target.img"), fx.node_path()).unwrap();
    let exposed = fx.expose(recorded(id)).expect("expose");
    let node = fs::symlink_metadata(fx.node_path()).unwrap();
    assert!(node.file_type().is_block_device());
    assert_eq!(fs::metadata(fx.tmp.path().join("target.img")).unwrap().len(), 4 * MIB, "target untouched");
    assert!(fx.loops_on(target_id).is_empty());
    // A node of another loop number (from before a restart) is replaced by the right one.
    fs::remove_file(fx.node_path()).unwrap();
    let stale = (exposed.facts.device.0, exposed.facts.device.1 + 1000);
    fx.devices.apply(&fx.node, NodeAction::Make, stale).unwrap();
    fx.expose(recorded(id)).expect("expose");
    let rdev = fs::symlink_metadata(fx.node_path()).unwrap().rdev();
    assert_eq!((rustix::fs::major(rdev), rustix::fs::minor(rdev)), exposed.facts.device);
    fx.release(recorded(id)).expect("release");
}

#[test]
fn a_directory_at_the_nodes_name_is_never_exposed_nor_removed_and_release_still_detaches() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    fs::create_dir(fx.node_path()).unwrap();
    fs::write(fx.node_path().join("keep"), b"x").unwrap();
    let refused = fx.expose(recorded(id)).unwrap_err();
    assert!(matches!(refused, PoolError::BlockRefused { refusal: LoopRefusal::DirectoryAtNode, .. }), "{refused}");
    assert_eq!(fx.loops_on(id).len(), 1, "attached before the node was refused");
    assert_eq!(fx.release(recorded(id)).expect("release"), Detached::Now);
    assert!(fx.loops_on(id).is_empty(), "detached although the node could not be removed");
    assert_eq!(fs::read(fx.node_path().join("keep")).unwrap(), b"x", "the directory stays");
}

#[test]
fn a_loop_that_changed_since_the_decision_is_not_detached() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let (other, other_id) = fx.outside_file("other.img");
    let theirs = fx.host.attach(other.as_fd(), false).expect("their loop");
    let err = fx.host.detach(theirs.facts.number, id).unwrap_err();
    assert!(matches!(err, PoolError::LoopChanged { .. }), "{err}");
    assert_eq!(fx.loops_on(other_id), vec![theirs.facts.number]);
}

#[test]
fn the_volume_directory_is_opened_beneath_the_pool_without_following_a_symlink() {
    let tmp = tempfile::tempdir().expect("tempdir");
    fs::create_dir_all(tmp.path().join("pool")).unwrap();
    fs::create_dir_all(tmp.path().join("elsewhere")).unwrap();
    symlink(tmp.path().join("elsewhere"), tmp.path().join("pool/pvc-2")).unwrap();
    let pool = PoolRoot::open("test", &tmp.path().join("pool")).expect("pool");
    let name = |n: &str| VolumeDirName::new(n).unwrap();
    assert!(pool.open_block_volume_dir(&name("pvc-1")).expect("missing").is_none());
    let refused = pool.open_block_volume_dir(&name("pvc-2")).unwrap_err();
    assert!(matches!(refused, PoolError::VolumeNotDirectory { .. }), "{refused}");
}

fn write_at(path: &Path, offset: u64, data: &[u8]) {
    let mut device = fs::OpenOptions::new().write(true).open(path).expect("open node");
    device.seek(SeekFrom::Start(offset)).unwrap();
    device.write_all(data).unwrap();
    device.sync_all().unwrap();
}

fn read_at(path: &Path, offset: u64, len: usize) -> Vec<u8> {
    let mut device = fs::File::open(path).expect("open");
    device.seek(SeekFrom::Start(offset)).unwrap();
    let mut data = vec![0; len];
    device.read_exact(&mut data).unwrap();
    data
}

/// A reboot, as far as this layer sees it: every loop detached and the nodes gone, unrelated
/// loops attached meanwhile taking the freed numbers, a stale node left at one volume's name.
/// Until it is exposed again a volume has no node (its pod cannot start on another device);
/// once exposed, each node is its own volume's loop with its own data, and the unrelated
/// loops are untouched.
#[test]
fn after_a_reboot_each_volume_is_exposed_on_its_own_data_and_never_on_a_loop_that_took_its_number() {
    let Some(fx) = Fixture::new() else { return };
    let (dir_a, path_a, node_a, id_a) = fx.another_volume(2);
    let (dir_b, path_b, node_b, id_b) = fx.another_volume(3);
    let expose_volume = |dir: &OwnedFd, path: &Path, node: &VolumeDirName, id: FileId| {
        expose(&fx.host, &fx.devices, dir.as_fd(), path, recorded(id), node, true)
    };
    let node_path = |node: &VolumeDirName| fx.tmp.path().join("dev").join(node.as_str());
    let before_a = expose_volume(&dir_a, &path_a, &node_a, id_a).expect("expose a");
    let before_b = expose_volume(&dir_b, &path_b, &node_b, id_b).expect("expose b");
    write_at(&node_path(&node_a), 0, b"volume a");
    write_at(&node_path(&node_b), 0, b"volume b");

    // The reboot: loops and nodes gone.
    for (dir, path, node, id) in [(&dir_a, &path_a, &node_a, id_a), (&dir_b, &path_b, &node_b, id_b)] {
        release(&fx.host, &fx.devices, dir.as_fd(), path, recorded(id), node).expect("release");
    }
    // Unrelated loops take the freed numbers.
    let (x, _x_id) = fx.outside_file("x.img");
    let (y, _y_id) = fx.outside_file("y.img");
    let unrelated = [fx.host.attach(x.as_fd(), false).unwrap(), fx.host.attach(y.as_fd(), false).unwrap()];
    let taken: Vec<u32> = unrelated.iter().map(|l| l.facts.number).collect();
    // The lowest free numbers are handed out first, so they are the volumes' old ones, unless a
    // test running beside this one took them (then the case is weaker, not wrong).
    if !taken.contains(&before_a.facts.number) && !taken.contains(&before_b.facts.number) {
        eprintln!("the freed numbers went elsewhere ({taken:?}); the renumbering case was not met");
    }
    write_at(&fx.tmp.path().join("x.img"), 0, b"unrelated");
    // Before the provisioner runs again: no node, so a pod finds no device and waits.
    assert!(fs::symlink_metadata(node_path(&node_a)).is_err());
    // A node left at b's name (a devtmpfs that outlived the loops) now names an unrelated loop.
    fx.devices.apply(&node_b, NodeAction::Make, unrelated[0].facts.device).unwrap();

    let after_a = expose_volume(&dir_a, &path_a, &node_a, id_a).expect("expose a again");
    let after_b = expose_volume(&dir_b, &path_b, &node_b, id_b).expect("expose b again");
    for after in [&after_a, &after_b] {
        assert!(!taken.contains(&after.facts.number), "loop{} is an unrelated loop", after.facts.number);
    }
    assert_eq!(read_at(&node_path(&node_a), 0, 8), b"volume a");
    assert_eq!(read_at(&node_path(&node_b), 0, 8), b"volume b", "the stale node was replaced");
    for l in &unrelated {
        assert_eq!(fx.loops_on(l.facts.backing), vec![l.facts.number], "unrelated loop{} untouched", l.facts.number);
    }
    assert_eq!(read_at(&fx.tmp.path().join("x.img"), 0, 9), b"unrelated");
    for (dir, path, node, id) in [(&dir_a, &path_a, &node_a, id_a), (&dir_b, &path_b, &node_b, id_b)] {
        release(&fx.host, &fx.devices, dir.as_fd(), path, recorded(id), node).expect("release");
    }
}

#[test]
fn two_exposures_of_one_volume_at_once_attach_one_loop() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    let numbers: Vec<u32> = std::thread::scope(|s| {
        let exposing: Vec<_> = (0..4)
            .map(|_| {
                s.spawn(|| {
                    // Each its own descriptors, as two processes would have.
                    let dir = fx.pool.open_block_volume_dir(&VolumeDirName::new("pvc-1").unwrap()).unwrap().unwrap();
                    let devices = DeviceDir::open(&fx.tmp.path().join("dev")).unwrap();
                    expose(&fx.host, &devices, dir.as_fd(), &fx.dir_path(), recorded(id), &fx.node, true)
                })
            })
            .collect();
        exposing.into_iter().map(|t| t.join().unwrap().expect("exposed").facts.number).collect()
    });
    assert_eq!(fx.loops_on(id).len(), 1, "one loop: {:?}", fx.loops_on(id));
    assert!(numbers.iter().all(|n| *n == numbers[0]), "{numbers:?}");
    fx.release(recorded(id)).expect("release");
}

#[test]
fn stale_nodes_are_listed_and_unlinked_and_other_entries_stay() {
    let Some(fx) = Fixture::new() else { return };
    let gone = VolumeDirName::new("pvc-11111111-2222-3333-4444-555555555555").unwrap();
    fx.devices.apply(&fx.node, NodeAction::Make, (7, 4000)).unwrap();
    fx.devices.apply(&gone, NodeAction::Make, (7, 4001)).unwrap();
    fs::write(fx.tmp.path().join("dev/notes"), b"not ours").unwrap();
    let names = fx.devices.names().unwrap();
    assert_eq!(names, vec!["notes".to_owned(), fx.node.to_string(), gone.to_string()]);
    for stale in loop_safety::stale_nodes(&names, &[fx.node.as_str()]) {
        fx.devices.remove(&VolumeDirName::new(stale).unwrap()).unwrap();
    }
    assert_eq!(fx.devices.names().unwrap(), vec!["notes".to_owned(), fx.node.to_string()]);
}

#[test]
fn a_device_still_open_is_detached_at_its_last_close_and_release_says_so() {
    let Some(fx) = Fixture::new() else { return };
    let (_fd, id) = fx.create(4 * MIB, Allocation::Sparse);
    fx.expose(recorded(id)).expect("expose");
    let pod = fs::File::open(fx.node_path()).expect("a pod holds the device");
    assert_eq!(fx.release(recorded(id)).expect("release"), Detached::AtLastClose);
    assert!(fs::symlink_metadata(fx.node_path()).is_err(), "the node is gone at once");
    assert_eq!(fx.loops_on(id).len(), 1, "still attached while open");
    drop(pod);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !fx.loops_on(id).is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(fx.loops_on(id).is_empty(), "detached at the last close");
    assert_eq!(fx.release(recorded(id)).expect("release again"), Detached::Now);
}
