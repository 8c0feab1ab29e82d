//! /proc scan, identities, kernel, vDSO and `[anon]`/JIT resolution, against a fake /proc and
//! /sys tree and against the real /proc.

use std::path::{Path, PathBuf};

use dcpid::aggregate::ImageInfo;
use dcpid::resolve::jit::JitLimits;
use dcpid::resolve::{Resolution, Resolver, ResolverConfig};
use dcpid::types::{SideBand, TimedSideBand};
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::{ImageId, ImageKind, UnknownReason};

fn note(build_id: &[u8]) -> Vec<u8> {
    let mut n = Vec::new();
    n.extend_from_slice(&4u32.to_ne_bytes());
    n.extend_from_slice(&(build_id.len() as u32).to_ne_bytes());
    n.extend_from_slice(&3u32.to_ne_bytes());
    n.extend_from_slice(b"GNU\0");
    n.extend_from_slice(build_id);
    while n.len() % 4 != 0 {
        n.push(0);
    }
    n
}

fn write(p: &Path, data: impl AsRef<[u8]>) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

const FILE_MAP: (u64, u64) = (0x55_0000_1000, 0x55_0000_5000);

struct Fake {
    dir: tempfile::TempDir,
}

impl Fake {
    fn cfg(&self) -> ResolverConfig {
        ResolverConfig {
            proc_root: self.dir.path().join("proc"),
            sys_root: self.dir.path().join("sys"),
            jit_map_dir: self.dir.path().join("tmp"),
        }
    }
}

fn fake() -> Fake {
    let dir = tempfile::tempdir().expect("tempdir");
    let proc_ = dir.path().join("proc");
    let exe = std::env::current_exe().expect("current_exe");
    let ino = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&exe).expect("stat"));
    let maps = format!(
        "{:x}-{:x} r-xp 00001000 fd:01 {ino} /usr/bin/fake prog (deleted)\n\
         550000000000-550000001000 r--p 00000000 fd:01 777 /usr/bin/fake prog\n\
         this is not a maps line\n\
         7f0000000000-7f0000010000 rwxp 00000000 00:00 0 \n\
         7ffff7fc1000-7ffff7fc3000 r-xp 00000000 00:00 0                  [vdso]\n\
         ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0          [vsyscall]\n",
        FILE_MAP.0, FILE_MAP.1
    );
    write(&proc_.join("42/maps"), maps);
    write(
        &proc_.join("42/stat"),
        "42 (fake prog) S 1 42 42 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 123456 0 0",
    );
    // The file behind the mapping is reached through map_files (here: a symlink to a real ELF).
    std::fs::create_dir_all(proc_.join("42/map_files")).expect("mkdir");
    std::os::unix::fs::symlink(
        &exe,
        proc_.join(format!("42/map_files/{:x}-{:x}", FILE_MAP.0, FILE_MAP.1)),
    )
    .expect("symlink");
    // A process that exits between listing and reading.
    std::fs::create_dir_all(proc_.join("43")).expect("mkdir");
    write(
        &proc_.join("kallsyms"),
        "0000000000000000 A fixed_percpu_data\n\
         ffffffff81000000 T _text\n\
         ffffffff81000100 T do_something\n\
         ffffffff81f00000 T _etext\n\
         ffffffff82000000 B _end\n\
         ffffffffc0000000 t mymod_fn\t[mymod]\n",
    );
    write(&proc_.join("modules"), "mymod 8192 0 - Live 0xffffffffc0000000\n");
    write(&proc_.join("sys/kernel/osrelease"), "6.0.0-test\n");
    write(&dir.path().join("sys/kernel/notes"), note(&[0xab; 20]));
    write(&dir.path().join("sys/module/mymod/notes/.note.gnu.build-id"), note(&[0xcd; 20]));
    write(
        &dir.path().join("tmp/perf-42.map"),
        "7f0000000100 40 jitted_fn\nnonsense\n7f0000000200 10 other\n",
    );
    Fake { dir }
}

fn build_id_of(path: &Path) -> Option<Vec<u8>> {
    let data = std::fs::read(path).expect("read elf");
    let obj = object::File::parse(&*data).expect("parse elf");
    obj.build_id().expect("notes").map(<[u8]>::to_vec)
}

fn image(r: Resolution) -> (std::sync::Arc<ImageInfo>, u64) {
    match r {
        Resolution::Image { image, offset } => (image, offset),
        Resolution::Unknown(u) => panic!("unresolved: {u:?}"),
    }
}

#[test]
fn scan_of_fake_proc_counts_garbage_vanished_and_resolves_every_kind() {
    let f = fake();
    let mut r = Resolver::new(f.cfg());
    let st = r.scan_proc(1000);
    assert_eq!(st.processes, 1, "{st:?}");
    assert_eq!(st.vanished, 1, "{st:?}");
    assert_eq!(st.garbage_lines, 1, "{st:?}");
    assert_eq!(st.mappings, 3, "file, anon and vdso (vsyscall is kernel space): {st:?}");
    let asid = r.asid_at(42, 2000).expect("pid 42 known");
    assert_eq!(r.asid_at(42, 0), Some(asid), "a scanned process is valid from the start");
    assert_eq!(r.asid_at(44, 2000), None);

    // File mapping: identity read through map_files (build-id of the real ELF behind it).
    let (img, off) = image(r.resolve(42, asid, FILE_MAP.0 + 0x10, false));
    assert_eq!(img.kind, ImageKind::Elf);
    assert_eq!(img.path, b"/usr/bin/fake prog");
    assert_eq!(off, 0x1010, "pc - start + pgoff");
    let exe = std::env::current_exe().expect("exe");
    match build_id_of(&exe) {
        Some(b) => assert_eq!(img.id, ImageId::BuildId(b)),
        None => assert!(matches!(img.id, ImageId::Fallback(_))),
    }

    // vDSO: own image, offset from its start.
    let (v, off) = image(r.resolve(42, asid, 0x7ffff7fc1000 + 0x123, false));
    assert_eq!((v.kind, off, v.path.as_slice()), (ImageKind::Vdso, 0x123, &b"[vdso]"[..]));

    // Anonymous executable memory: per-process image, absolute offsets, JIT symbols.
    let (a, off) = image(r.resolve(42, asid, 0x7f0000000110, false));
    assert_eq!(a.kind, ImageKind::Anon);
    assert_eq!(off, 0x7f0000000110);
    assert_eq!(a.path, b"[anon:42:fake prog]");
    assert_eq!(a.jit_symbols.len(), 2, "{:?}", a.jit_symbols);
    assert_eq!(a.jit_symbols[0].name, "jitted_fn");
    let mut disc = 42u32.to_le_bytes().to_vec();
    disc.extend_from_slice(&123456u64.to_le_bytes());
    assert_eq!(a.id, ImageId::special("[anon]", &disc));

    // No mapping at that pc.
    assert_eq!(r.resolve(42, asid, 0x1234, false), Resolution::Unknown(UnknownReason::NoMap));
    assert_eq!(r.resolve(99, 0, 0x1234, false), Resolution::Unknown(UnknownReason::ProcessGone));
    let s = r.stats();
    assert_eq!(s.processes, 1);
    assert!(s.identity_cache_misses >= 1, "{s:?}");
}

#[test]
fn records_older_than_the_scan_are_ignored_for_scanned_pids() {
    let f = fake();
    let mut r = Resolver::new(f.cfg());
    r.scan_proc(1000);
    let exec = |time| TimedSideBand {
        time,
        cpu: 0,
        record: SideBand::Comm { pid: 42, tid: 42, comm: b"x".to_vec(), exec: true },
    };
    r.apply(&exec(500));
    let a = r.asid_at(42, 1500).expect("known");
    assert!(matches!(r.resolve(42, a, FILE_MAP.0, false), Resolution::Image { .. }));
    assert_eq!(r.stats().ignored_before_scan, 1);
    r.apply(&exec(1200));
    let b = r.asid_at(42, 1500).expect("known");
    assert_ne!(a, b);
    assert_eq!(r.resolve(42, b, FILE_MAP.0, false), Resolution::Unknown(UnknownReason::NoMap));
    // Samples from before the exec still resolve to the old image.
    assert!(matches!(r.resolve(42, a, FILE_MAP.0, false), Resolution::Image { .. }));
}

#[test]
fn kernel_and_module_offsets_and_refresh_on_module_load() {
    let f = fake();
    let mut r = Resolver::new(f.cfg());
    let (k, off) = image(r.resolve(0, 0, 0xffffffff81000123, true));
    assert_eq!((k.kind, off), (ImageKind::Kernel, 0x123));
    assert_eq!(k.id, ImageId::BuildId(vec![0xab; 20]));
    assert_eq!(k.path, b"[kernel.kallsyms]");
    let (m, off) = image(r.resolve(1234, 7, 0xffffffffc0000010, false));
    assert_eq!((m.kind, off), (ImageKind::KernelModule, 0x10), "kernel by address");
    assert_eq!(m.id, ImageId::BuildId(vec![0xcd; 20]));
    assert_eq!(m.path, b"mymod");
    let newmod = 0xffffffffc0100000u64;
    assert_eq!(
        r.resolve(0, 0, newmod + 4, true),
        Resolution::Unknown(UnknownReason::KernelUnknown)
    );
    // A module is loaded (no build-id notes): the kernel MMAP2 triggers a re-read.
    write(
        &f.dir.path().join("proc/modules"),
        "mymod 8192 0 - Live 0xffffffffc0000000\nnewmod 4096 0 - Live 0xffffffffc0100000\n",
    );
    r.apply(&TimedSideBand {
        time: 5,
        cpu: 0,
        record: SideBand::Mmap2 {
            pid: u32::MAX,
            tid: 0,
            addr: newmod,
            len: 4096,
            pgoff: 0,
            dev: None,
            ino: None,
            ino_generation: None,
            prot: 5,
            flags: 0,
            build_id: None,
            filename: b"newmod".to_vec(),
            kernel: true,
        },
    });
    let (n, off) = image(r.resolve(0, 0, newmod + 4, true));
    assert_eq!((n.kind, off, n.path.as_slice()), (ImageKind::KernelModule, 4, &b"newmod"[..]));
    assert_eq!(n.id, ImageId::special("[module]", b"newmod\x004096"));
}

#[test]
fn kallsyms_snapshot_from_fake_tree() {
    let f = fake();
    let r = Resolver::new(f.cfg());
    let snap = r.kallsyms_snapshot().expect("snapshot");
    assert_eq!(snap.text_base, 0xffffffff81000000);
    assert_eq!(snap.kernel_release, "6.0.0-test");
    assert_eq!(snap.kernel_build_id, Some(vec![0xab; 20]));
    let m = snap.modules.iter().find(|m| m.name == "mymod").expect("module");
    assert_eq!(m.build_id, Some(vec![0xcd; 20]));
    // A tree without kallsyms is an error naming the file.
    let empty = tempfile::tempdir().expect("tempdir");
    let r = Resolver::new(ResolverConfig {
        proc_root: empty.path().to_path_buf(),
        sys_root: empty.path().to_path_buf(),
        jit_map_dir: empty.path().to_path_buf(),
    });
    let e = r.kallsyms_snapshot().expect_err("no kallsyms");
    assert!(e.to_string().contains("kallsyms"), "{e}");
}

/// File offset range of the symbol whose name contains `needle`, from the ELF symbol table
/// and `PT_LOAD` headers (independent of the resolver's arithmetic).
pub(crate) fn symbol_file_range(path: &Path, needle: &str) -> (u64, u64) {
    let data = std::fs::read(path).expect("read");
    let obj = object::File::parse(&*data).expect("parse");
    let sym = obj
        .symbols()
        .find(|s| s.name().is_ok_and(|n| n.contains(needle)) && s.size() > 0)
        .unwrap_or_else(|| panic!("no symbol {needle} in {}", path.display()));
    let seg = obj
        .segments()
        .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())
        .expect("segment");
    let off = sym.address() - seg.address() + seg.file_range().0;
    (off, off + sym.size())
}

#[inline(never)]
fn marker_function_for_resolve_scan(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(3)
}

#[test]
fn real_proc_scan_resolves_own_code_and_tolerates_pid1_and_exiting_processes() {
    let exe = std::env::current_exe().expect("exe");
    let cfg = ResolverConfig::default();
    // Processes that exit while the scan runs.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let churn = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut n = 0;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && n < 200 {
                drop(std::process::Command::new("true").status());
                n += 1;
            }
        })
    };
    let mut r = Resolver::new(cfg);
    let st = r.scan_proc(0);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    churn.join().expect("churn");
    assert!(st.processes >= 2, "{st:?}");
    assert!(st.mappings >= 2, "{st:?}");

    let pid1_denied = std::fs::read(PathBuf::from("/proc/1/maps"))
        .err()
        .is_some_and(|e| e.raw_os_error() == Some(libc::EACCES));
    if pid1_denied {
        assert!(st.unreadable >= 1, "{st:?}");
        let a = r.asid_at(1, 5).expect("pid 1 is known even if unreadable");
        assert_eq!(
            r.resolve(1, a, 0x40_0000, false),
            Resolution::Unknown(UnknownReason::Unreadable)
        );
    } else {
        eprintln!("note: /proc/1/maps is readable here; EACCES path checked only by counters");
    }

    let me = std::process::id();
    let asid = r.asid_at(me, 5).expect("own process");
    let pc = marker_function_for_resolve_scan as fn(u64) -> u64 as usize as u64 + 1;
    assert_eq!(marker_function_for_resolve_scan(2), 6);
    let (img, off) = image(r.resolve(me, asid, pc, false));
    assert_eq!(img.kind, ImageKind::Elf);
    assert_eq!(Path::new(std::str::from_utf8(&img.path).expect("utf8")), exe.as_path());
    let (lo, hi) = symbol_file_range(&exe, "marker_function_for_resolve_scan");
    assert!(lo < off && off < hi, "offset {off:#x} outside [{lo:#x}, {hi:#x})");
    if let Some(b) = build_id_of(&exe) {
        assert_eq!(img.id, ImageId::BuildId(b));
    }
    let s = r.stats();
    assert!(s.identity_cache_hits + s.identity_cache_misses >= 1, "{s:?}");
    let json = serde_json::to_string(&s).expect("serialize");
    assert!(json.contains("identity_cache_hits"), "{json}");
}

/// The perf map's owner is checked against the process's uid when the map is read: a process
/// scanned (or forked) as root that then became uid 65534 and wrote its map is accepted.
#[dcpi_testkit::test(root)]
fn perf_map_owner_is_checked_against_the_current_uid() {
    let f = fake();
    let proc42 = f.dir.path().join("proc/42");
    let map = f.dir.path().join("tmp/perf-42.map");
    let status = |uid: u32| format!("Name:\tfake prog\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
    write(&proc42.join("status"), status(0));
    std::os::unix::fs::chown(&map, Some(65534), Some(65534)).expect("chown map");
    let mut r = Resolver::new(f.cfg());
    r.scan_proc(1000);
    let asid = r.asid_at(42, 2000).expect("pid 42 known");
    // Still root: a map owned by someone else is refused.
    r.begin_batch();
    let (a, _) = image(r.resolve(42, asid, 0x7f0000000110, false));
    assert!(a.jit_symbols.is_empty(), "a map owned by another user was read: {:?}", a.jit_symbols);
    // The process drops to 65534 (as runuser or setpriv do after fork): its map is read.
    write(&proc42.join("status"), status(65534));
    r.begin_batch();
    let (a, _) = image(r.resolve(42, asid, 0x7f0000000110, false));
    assert_eq!(a.jit_symbols.len(), 2, "{:?}", a.jit_symbols);
    assert_eq!(a.jit_symbols[0].name, "jitted_fn");
    assert_eq!(r.stats().jit_maps_read, 1);
}

/// A perf map larger than the bounds is cut and the cut is counted.
#[test]
fn perf_map_reads_are_bounded_and_counted() {
    let f = fake();
    let text: String =
        (0..500).map(|i| format!("{:x} 10 sym{i}\n", 0x7f0000000000u64 + i * 16)).collect();
    write(&f.dir.path().join("tmp/perf-42.map"), text);
    let mut r = Resolver::new(f.cfg());
    r.set_jit_limits(JitLimits { max_bytes: 1 << 20, max_entries: 100 });
    r.scan_proc(1000);
    let asid = r.asid_at(42, 2000).expect("pid 42 known");
    r.begin_batch();
    let (a, _) = image(r.resolve(42, asid, 0x7f0000000110, false));
    assert_eq!(a.jit_symbols.len(), 100);
    assert_eq!(r.stats().jit_maps_truncated, 1);
    assert_eq!(r.stats().jit_maps_read, 1);
}

/// Issue 35, defect 3: a perf map that is not the process's own file is never read. The
/// attack: a `nobody` process hard-links `/tmp/perf-PID.map` to a 0600 root file (allowed
/// where `fs.protected_hardlinks=0`; here the test, as root, makes the same link) and dcpid,
/// reading it as root, would publish the secret's lines as symbol names. Also a symlink and a
/// FIFO (which must not block the resolver). Then the process's own file is read, so the
/// refusals are not an accident of the setup.
#[dcpi_testkit::test(root)]
fn perf_map_must_be_the_process_own_single_link_regular_file() {
    let f = fake();
    let proc42 = f.dir.path().join("proc/42");
    let map = f.dir.path().join("tmp/perf-42.map");
    let status = |uid: u32| format!("Name:\tfake prog\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
    // A root-only file in the same file system, its lines shaped like a perf map.
    let secret = f.dir.path().join("shadow");
    write(&secret, "7f0000000100 40 root_secret_password\n");
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .expect("chmod");
    std::fs::remove_file(&map).expect("rm map");
    std::fs::hard_link(&secret, &map).expect("hard link");
    let mut r = Resolver::new(f.cfg());
    r.scan_proc(1000);
    let asid = r.asid_at(42, 2000).expect("pid 42 known");
    let jit_names = move |r: &mut Resolver| {
        r.begin_batch();
        let (a, _) = image(r.resolve(42, asid, 0x7f0000000110, false));
        a.jit_symbols.iter().map(|s| s.name.clone()).collect::<Vec<_>>()
    };
    // The process runs as nobody: the root-owned link is not its file.
    write(&proc42.join("status"), status(65534));
    assert_eq!(jit_names(&mut r), Vec::<String>::new(), "a hard link to a root file was read");
    // Even for a root process, a second link to a file is not a perf map it wrote.
    write(&proc42.join("status"), status(0));
    assert_eq!(jit_names(&mut r), Vec::<String>::new(), "a file with two links was read");
    // A symlink to a file nobody owns, for a nobody process: not followed.
    write(&proc42.join("status"), status(65534));
    std::fs::remove_file(&map).expect("rm map");
    let own = f.dir.path().join("own.map");
    write(&own, "7f0000000100 40 jitted_fn\n");
    std::os::unix::fs::chown(&own, Some(65534), Some(65534)).expect("chown");
    std::os::unix::fs::symlink(&own, &map).expect("symlink");
    assert_eq!(jit_names(&mut r), Vec::<String>::new(), "a symlink was followed");
    // A FIFO nobody writes to: refused at once, not waited on (on another thread, so that a
    // regression fails the test at the deadline instead of hanging it).
    std::fs::remove_file(&map).expect("rm map");
    dcpi_testkit::Hostile::Fifo.plant(&map);
    std::os::unix::fs::chown(&map, Some(65534), Some(65534)).expect("chown fifo");
    let (tx, rx) = std::sync::mpsc::channel();
    let resolver = std::thread::spawn(move || {
        let names = jit_names(&mut r);
        drop(tx.send(names));
        r
    });
    let names =
        rx.recv_timeout(std::time::Duration::from_secs(60)).expect("resolver blocked on a FIFO");
    assert_eq!(names, Vec::<String>::new(), "a FIFO was read");
    let mut r = resolver.join().expect("resolver thread");
    // The process's own regular file with one link is read.
    std::fs::remove_file(&map).expect("rm fifo");
    std::fs::rename(&own, &map).expect("rename");
    assert_eq!(jit_names(&mut r), vec!["jitted_fn".to_string()]);
    assert_eq!(r.stats().jit_maps_read, 1, "only the process's own map was read");
}
