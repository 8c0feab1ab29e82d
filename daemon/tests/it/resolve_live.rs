//! Proof against the real kernel: the real sampler feeds the aggregator, and samples of
//! processes compiled at test time resolve to their images with the right build-ids and file
//! offsets (new process, dlopen'ed library, binary replaced or deleted while running).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use dcpid::aggregate::{Aggregator, Resolved};
use dcpid::perf::sampler::{online_cpus, Sampler, SamplerConfig};
use dcpid::resolve::{Resolver, ResolverConfig, ScanStats};
use dcpid::sys;
use object::{Object, ObjectSegment, ObjectSymbol};
use profile_format::{ImageId, ImageKind};

const SPIN_C: &str = r#"
#include <stdlib.h>
#include <time.h>
/* CPU time, not wall time: on a loaded machine the spin still earns its samples. */
static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}
__attribute__((noinline)) unsigned long SPIN_NAME(double secs) {
    volatile unsigned long x = VARIANT;
    double end = now() + secs;
    while (now() < end)
        for (int i = 0; i < 100000; i++) x += i;
    return x;
}
"#;

const MAIN_C: &str = r#"
#include <stdlib.h>
#include <unistd.h>
unsigned long hot_spin(double secs);
int main(int argc, char **argv) {
    if (argc > 2) usleep(atoi(argv[2]) * 1000);
    return (int)(hot_spin(argc > 1 ? atof(argv[1]) : 0.3) & 1);
}
"#;

const LOADER_C: &str = r#"
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
int main(int argc, char **argv) {
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) { fprintf(stderr, "%s\n", dlerror()); return 2; }
    unsigned long (*f)(double) = (unsigned long (*)(double))dlsym(h, "lib_spin");
    if (!f) return 3;
    return (int)(f(atof(argv[2])) & 1);
}
"#;

fn cc(dir: &Path, out: &str, sources: &[(&str, String)], flags: &[&str]) -> PathBuf {
    let mut cmd = Command::new("cc");
    for (name, text) in sources {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write source");
        cmd.arg(&p);
    }
    let out = dir.join(out);
    let status = cmd
        .args(["-O1", "-g0", "-Wl,--build-id", "-o"])
        .arg(&out)
        .args(flags)
        .status()
        .expect("run cc (a C compiler is needed for this test)");
    assert!(status.success(), "cc failed for {}", out.display());
    out
}

fn spin_source(name: &str, variant: u32) -> String {
    SPIN_C.replace("SPIN_NAME", name).replace("VARIANT", &variant.to_string())
}

fn build_id(path: &Path) -> Vec<u8> {
    let data = std::fs::read(path).expect("read");
    let obj = object::File::parse(&*data).expect("parse");
    obj.build_id().expect("notes").expect("cc was asked for a build-id").to_vec()
}

/// File-offset range of a function: symbol address → `PT_LOAD` → file offset.
fn symbol_file_range(path: &Path, name: &str) -> (u64, u64) {
    let data = std::fs::read(path).expect("read");
    let obj = object::File::parse(&*data).expect("parse");
    let sym = obj
        .symbols()
        .chain(obj.dynamic_symbols())
        .find(|s| s.name() == Ok(name) && s.size() > 0)
        .unwrap_or_else(|| panic!("no symbol {name} in {}", path.display()));
    let seg = obj
        .segments()
        .find(|s| s.address() <= sym.address() && sym.address() < s.address() + s.size())
        .expect("segment");
    let off = sym.address() - seg.address() + seg.file_range().0;
    (off, off + sym.size())
}

struct Session {
    agg: Arc<Aggregator>,
    sampler: Option<Sampler>,
    collected: Vec<Resolved>,
    scan: ScanStats,
}

impl Session {
    fn start() -> Self {
        let ncpus = online_cpus().expect("online cpus").iter().max().map_or(1, |m| *m as usize + 1);
        let agg = Aggregator::new(Resolver::new(ResolverConfig::default()), ncpus);
        // As the daemon: drain threads hand records and full buffers to the resolver thread.
        agg.start_resolver_thread(None).expect("resolver thread");
        let cfg =
            SamplerConfig { redraw_interval: Duration::from_millis(100), ..Default::default() };
        let sampler = Sampler::start(&cfg, Arc::<Aggregator>::clone(&agg)).expect("sampler start");
        let t0 = sys::time::monotonic_ns();
        let scan = agg.with_resolver(|r| r.scan_proc(t0));
        Self { agg, sampler: Some(sampler), collected: Vec::new(), scan }
    }

    fn take(&mut self) {
        self.collected.push(self.agg.take_resolved(true));
    }

    fn finish(mut self) -> Vec<Resolved> {
        if let Some(s) = self.sampler.take() {
            s.stop();
        }
        self.collected.push(self.agg.flush_all());
        std::mem::take(&mut self.collected)
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.stop();
        }
    }
}

/// Per offset counts of the image with this build-id (event 0), over all batches; also
/// checks the path and kind every time.
fn counts_of(batches: &[Resolved], id: &[u8], path: &Path) -> Vec<(u64, u64)> {
    let key = (ImageId::BuildId(id.to_vec()), 0);
    let mut v = Vec::new();
    for r in batches {
        if let Some(p) = r.profiles.get(&key) {
            assert_eq!(p.image.kind, ImageKind::Elf);
            assert_eq!(p.image.path, path.as_os_str().as_encoded_bytes(), "path of the image");
            v.extend(p.counts.iter().map(|(o, c)| (*o, c.0)));
        }
    }
    v.sort_unstable();
    v
}

fn assert_mostly_in(counts: &[(u64, u64)], range: (u64, u64), what: &str, batches: &[Resolved]) {
    let total: u64 = counts.iter().map(|c| c.1).sum();
    let inside: u64 = counts.iter().filter(|c| c.0 >= range.0 && c.0 < range.1).map(|c| c.1).sum();
    let unknown: u64 = batches.iter().flat_map(|r| r.unknown.values()).map(|c| c.0).sum();
    let all: u64 = batches.iter().map(|r| r.samples).sum();
    eprintln!(
        "{what}: {inside}/{total} samples in {range:x?}; batch total {all}, unknown {unknown}"
    );
    assert!(total >= 30, "{what}: only {total} samples attributed to the image");
    assert!(
        inside * 10 >= total * 8,
        "{what}: {inside} of {total} samples inside {range:x?}: {counts:x?}"
    );
}

#[dcpi_testkit::test(perf)]
fn new_process_is_resolved_with_build_id_and_file_offsets() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = cc(
        dir.path(),
        "spinner",
        &[("main.c", MAIN_C.to_string()), ("spin.c", spin_source("hot_spin", 1))],
        &[],
    );
    let range = symbol_file_range(&prog, "hot_spin");
    let id = build_id(&prog);
    let mut s = Session::start();
    // PID 1's maps are not readable here, and processes come and go during the scan.
    if std::fs::read("/proc/1/maps").is_err() {
        assert!(s.scan.unreadable >= 1, "{:?}", s.scan);
    }
    assert!(s.scan.processes >= 2, "{:?}", s.scan);
    let st = Command::new(&prog).arg("0.3").status().expect("run");
    assert!(st.code().is_some());
    std::thread::sleep(Duration::from_millis(300));
    s.take();
    let batches = s.finish();
    let counts = counts_of(&batches, &id, &prog);
    assert_mostly_in(&counts, range, "new process", &batches);

    // Kernel samples (the idle loop, syscalls) go to [kernel.kallsyms] at offsets from _text.
    let ks = std::fs::read_to_string("/proc/kallsyms").expect("kallsyms");
    let addr = |name: &str| {
        ks.lines()
            .find(|l| l.split_whitespace().nth(2) == Some(name))
            .and_then(|l| u64::from_str_radix(l.split_whitespace().next()?, 16).ok())
    };
    if let (Some(text), Some(end)) = (addr("_text"), addr("_end")) {
        let kernel: Vec<(u64, u64)> = batches
            .iter()
            .flat_map(|r| r.profiles.values())
            .filter(|p| p.image.kind == ImageKind::Kernel)
            .flat_map(|p| p.counts.iter().map(|(o, c)| (*o, c.0)))
            .collect();
        let total: u64 = kernel.iter().map(|c| c.1).sum();
        assert!(total > 0, "no kernel samples resolved");
        assert!(kernel.iter().all(|c| c.0 < end - text), "kernel offsets beyond _end");
        let unknown: u64 = batches
            .iter()
            .filter_map(|r| r.unknown.get(&(0, profile_format::UnknownReason::KernelUnknown)))
            .map(|c| c.0)
            .sum();
        assert!(unknown * 10 < total, "{unknown} kernel-unknown vs {total} resolved");
    }
}

#[dcpi_testkit::test(perf)]
fn dlopened_library_is_resolved_to_the_library() {
    let dir = tempfile::tempdir().expect("tempdir");
    let lib = cc(
        dir.path(),
        "libspin.so",
        &[("lib.c", spin_source("lib_spin", 2))],
        &["-shared", "-fPIC"],
    );
    let loader = cc(dir.path(), "loader", &[("loader.c", LOADER_C.to_string())], &["-ldl"]);
    let range = symbol_file_range(&lib, "lib_spin");
    let id = build_id(&lib);
    let mut s = Session::start();
    let st = Command::new(&loader).arg(&lib).arg("0.3").status().expect("run loader");
    assert!(matches!(st.code(), Some(0 | 1)), "loader failed: {st}");
    std::thread::sleep(Duration::from_millis(300));
    s.take();
    let batches = s.finish();
    let counts = counts_of(&batches, &id, &lib);
    assert_mostly_in(&counts, range, "dlopen'ed library", &batches);
    // Nothing of the loader's own image lands in the library's offsets by mistake.
    let loader_counts = counts_of(&batches, &build_id(&loader), &loader);
    let in_loader: u64 = loader_counts.iter().map(|c| c.1).sum();
    let in_lib: u64 = counts.iter().map(|c| c.1).sum();
    assert!(in_loader < in_lib, "loader {in_loader} vs library {in_lib}");
}

#[dcpi_testkit::test(perf)]
fn binary_replaced_while_running_keeps_its_own_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let prog = cc(
        dir.path(),
        "victim",
        &[("main.c", MAIN_C.to_string()), ("spin.c", spin_source("hot_spin", 3))],
        &[],
    );
    let range = symbol_file_range(&prog, "hot_spin");
    let old_id = build_id(&prog);
    let other = cc(
        dir.path(),
        "victim.new",
        &[("main2.c", MAIN_C.to_string()), ("spin2.c", spin_source("hot_spin", 4) + "int pad;")],
        &["-DPAD"],
    );
    let new_id = build_id(&other);
    assert_ne!(old_id, new_id);
    // Started before the daemon: only the /proc scan (maps + map_files) can identify it.
    let mut child = Command::new(&prog).arg("1.0").spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(100));
    std::fs::rename(&other, &prog).expect("replace the running binary");
    let mut s = Session::start();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap_or_default();
    assert!(maps.contains("(deleted)"), "the kernel shows the binary as deleted: {maps}");
    let status = child.wait().expect("wait");
    assert!(status.code().is_some());
    std::thread::sleep(Duration::from_millis(300));
    s.take();
    let batches = s.finish();
    let counts = counts_of(&batches, &old_id, &prog);
    assert_mostly_in(&counts, range, "replaced binary", &batches);
    assert!(
        counts_of(&batches, &new_id, &prog).is_empty(),
        "samples must not be attributed to the file that now has the path"
    );
}

#[dcpi_testkit::test(perf)]
fn binary_deleted_while_running_keeps_its_own_identity() {
    let dir = tempfile::tempdir().expect("tempdir");
    let build = |name: &str, variant: u32| {
        let spin_c = format!("{name}_spin.c");
        let sources =
            [("main.c", MAIN_C.to_string()), (spin_c.as_str(), spin_source("hot_spin", variant))];
        let prog = cc(dir.path(), name, &sources, &[]);
        let range = symbol_file_range(&prog, "hot_spin");
        let id = build_id(&prog);
        (prog, range, id)
    };
    let (early, early_range, early_id) = build("early", 5);
    let (late, late_range, late_id) = build("late", 6);
    assert_ne!(early_id, late_id);
    // Started and unlinked before the daemon: the scan sees "(deleted)" and only map_files
    // can still open the binary.
    let mut first = Command::new(&early).arg("1.0").spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_file(&early).expect("delete the running binary");
    let mut s = Session::start();
    let maps = std::fs::read_to_string(format!("/proc/{}/maps", first.id())).unwrap_or_default();
    assert!(maps.contains("(deleted)"), "the kernel shows the binary as deleted: {maps}");
    // Started under the daemon, unlinked while it runs (its MMAP2 records may well be
    // applied after the file is gone).
    let mut second = Command::new(&late).arg("0.5").spawn().expect("spawn");
    std::thread::sleep(Duration::from_millis(100));
    std::fs::remove_file(&late).expect("delete the running binary");
    for c in [&mut first, &mut second] {
        let status = c.wait().expect("wait");
        assert!(status.code().is_some());
    }
    std::thread::sleep(Duration::from_millis(300));
    s.take();
    let batches = s.finish();
    let counts = counts_of(&batches, &early_id, &early);
    assert_mostly_in(&counts, early_range, "binary deleted before the scan", &batches);
    let counts = counts_of(&batches, &late_id, &late);
    assert_mostly_in(&counts, late_range, "binary deleted while sampled", &batches);
    // No fallback identity was made up for the deleted paths.
    let fallback: Vec<_> = batches
        .iter()
        .flat_map(|r| r.profiles.values())
        .filter(|p| {
            let path = p.image.path.as_slice();
            path == early.as_os_str().as_encoded_bytes()
                || path == late.as_os_str().as_encoded_bytes()
        })
        .filter(|p| !matches!(p.image.id, ImageId::BuildId(_)))
        .map(|p| p.image.id.to_text())
        .collect();
    assert!(fallback.is_empty(), "deleted binaries got fallback identities: {fallback:?}");
}

/// Spin on the calling thread's CPU time (not wall time: on a loaded machine the spin still
/// earns its samples).
fn spin_thread_cpu(secs: f64) {
    let cpu = || {
        let mut t = libc::timespec { tv_sec: 0, tv_nsec: 0 };
        // SAFETY: a valid timespec to fill; CLOCK_THREAD_CPUTIME_ID always exists on Linux.
        unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut t) };
        t.tv_sec as f64 + t.tv_nsec as f64 / 1e9
    };
    let end = cpu() + secs;
    let mut x = 0u64;
    while cpu() < end {
        for i in 0..100_000u64 {
            x = std::hint::black_box(x.wrapping_add(i));
        }
    }
}

/// Name the calling thread as `prctl(PR_SET_NAME)` does (`pthread_setname_np` for the caller).
fn set_thread_name(name: &str) {
    let c = std::ffi::CString::new(name).expect("name");
    // SAFETY: PR_SET_NAME reads a NUL-terminated string of at most 16 bytes from the pointer.
    let rc = unsafe { libc::prctl(libc::PR_SET_NAME, c.as_ptr() as libc::c_ulong, 0, 0, 0) };
    assert_eq!(rc, 0, "prctl(PR_SET_NAME)");
}

/// Against the real kernel: a thread that renames itself with `prctl(PR_SET_NAME)` while the
/// daemon runs (the kernel's COMM record names it), and one renamed before the daemon started
/// (named from `/proc/PID/task/TID/comm` while it lives: it is kept alive until the batch is
/// taken), each get their own thread row under this process.
#[dcpi_testkit::test(perf)]
fn a_thread_renamed_with_prctl_gets_its_own_thread_row() {
    let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
    let (spun_tx, spun_rx) = std::sync::mpsc::channel::<()>();
    let (exit_tx, exit_rx) = std::sync::mpsc::channel::<()>();
    let before = std::thread::spawn(move || {
        set_thread_name("dcpi-t-before");
        go_rx.recv().expect("go");
        spin_thread_cpu(0.3);
        spun_tx.send(()).expect("spun");
        exit_rx.recv().expect("exit");
    });
    // Named before the session: wait until /proc shows it.
    let pid = std::process::id();
    let named = || {
        std::fs::read_dir(format!("/proc/{pid}/task"))
            .expect("tasks")
            .flatten()
            .any(|t| std::fs::read(t.path().join("comm")).is_ok_and(|c| c == b"dcpi-t-before\n"))
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !named() {
        assert!(std::time::Instant::now() < deadline, "the thread never got its name");
        std::thread::sleep(Duration::from_millis(10));
    }
    let mut s = Session::start();
    let after = std::thread::spawn(|| {
        set_thread_name("dcpi-t-after");
        spin_thread_cpu(0.3);
    });
    go_tx.send(()).expect("go");
    after.join().expect("after");
    spun_rx.recv().expect("before spun");
    std::thread::sleep(Duration::from_millis(300));
    s.take();
    exit_tx.send(()).expect("exit");
    before.join().expect("before");
    let batches = s.finish();
    let mut by_name: std::collections::BTreeMap<String, u64> = Default::default();
    for r in &batches {
        for (p, name, _, n) in r.who.thread_rows() {
            if p == pid {
                *by_name.entry(String::from_utf8_lossy(&name).into_owned()).or_default() += n;
            }
        }
    }
    let got = |n: &str| by_name.get(n).copied().unwrap_or(0);
    eprintln!("thread rows of this process: {by_name:?}");
    assert!(got("dcpi-t-after") >= 30, "renamed while sampled: {by_name:?}");
    assert!(got("dcpi-t-before") >= 30, "renamed before the daemon: {by_name:?}");
}
