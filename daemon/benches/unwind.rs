//! DWARF unwinding throughput of one drain thread, warm tables (issue 37: ≥ 1 M stacks/s of
//! depth 20 on one core).
//!
//! The stack is a real one, not a synthetic: a thread of this bench (a release build: no frame
//! pointers, so only CFI unwinds it) descends 40 levels through four mutually recursive
//! functions with different frame sizes, then blocks in `read(2)` on a socket. Its registers
//! (sp, pc: `/proc/self/task/TID/syscall`) and the top 8 KiB of its stack (`/proc/self/mem`,
//! what the kernel copies with `PERF_SAMPLE_STACK_USER` by default) are taken once, as a
//! sample would carry them. The process's unwinder is built by the daemon's own loader code
//! (`DwarfShared::load_now`: every executable mapping of this process, with the `.eh_frame` /
//! `.eh_frame_hdr` of this bench binary, libc and the vDSO), and the timed loop is the drain
//! thread's call, `DwarfUnwinder::unwind`, with its per-CPU rule cache warm (a hot stack).
//! The leaf is libc's `read`, its callers this binary's functions: each stack crosses two
//! images' tables.
//!
//! - `unwind/depth20`: the first 20 frames (the depth bound set to 20).
//! - `unwind/to_root`: the whole stack (about 50 frames) down to `clone3`'s root.
//! - `unwind/depth20_cold`: `depth20` with an empty rule cache each time (a process's first
//!   samples, or a workload whose pcs are many and rarely repeat): every frame looks its
//!   rule up in `.eh_frame_hdr` and evaluates its CFI.
//! - `unwind/fp20_auto` and `unwind/fp20_dwarf`: a 20-frame frame-pointer chain (hand-built
//!   in a copy, in an image without CFI that keeps frame pointers), as `callchains = "auto"`
//!   steps it (by frame pointer, no table) and as `"dwarf"` does (framehop's frame-pointer
//!   rule through its rule cache).
//!
//! Before the benches it prints, for this bench binary, libc and any image named in
//! `DCPI_FP_SHARE` (colon-separated paths), what `callchains = "auto"` reads of it: the share of
//! its framed functions that keep a frame pointer (`FpShare`), and the time its load took.
//!
//! Run: `cargo bench -p dcpi-daemon --bench unwind` (the `thrpt` line is stacks/s).
#![forbid(unsafe_code)]

use std::hint::black_box;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use dcpid::perf::dwarf::{
    fp_scan, DwarfShared, DwarfUnwinder, ImageTables, DEFAULT_CACHE_BYTES, DEFAULT_USER_STACK,
};
use dcpid::perf::records::UserRegs;
use framehop::x86_64::CacheX86_64;

/// Levels of recursion below the thread's entry (more than 20: the depth-20 stack is all CFI
/// frames of this binary under libc's `read`).
const LEVELS: u32 = 40;

#[inline(never)]
fn level_a(n: u32, s: &mut UnixStream) -> u64 {
    let mut pad = [n as u64; 3];
    black_box(&mut pad);
    let r = if n == 0 { block(s) } else { level_b(n - 1, s) };
    black_box(r.wrapping_add(pad[1]))
}

#[inline(never)]
fn level_b(n: u32, s: &mut UnixStream) -> u64 {
    let mut pad = [n as u64; 11];
    black_box(&mut pad);
    let r = if n == 0 { block(s) } else { level_c(n - 1, s) };
    black_box(r.wrapping_add(pad[7]))
}

#[inline(never)]
fn level_c(n: u32, s: &mut UnixStream) -> u64 {
    let r = if n == 0 { block(s) } else { level_d(n - 1, s) };
    black_box(r.wrapping_mul(3))
}

#[inline(never)]
fn level_d(n: u32, s: &mut UnixStream) -> u64 {
    let mut pad = [n as u64; 37];
    black_box(&mut pad);
    let r = if n == 0 { block(s) } else { level_a(n - 1, s) };
    black_box(r.wrapping_add(pad[30]))
}

#[inline(never)]
fn block(s: &mut UnixStream) -> u64 {
    let mut b = [0u8; 1];
    black_box(s.read(&mut b).map_or(0, |n| n as u64))
}

/// A sample of a thread blocked in a socket read under [`LEVELS`] levels: its registers and stack
/// copy. The thread stays blocked until the returned socket is written to.
fn capture() -> (UserRegs, Vec<u8>, UnixStream, std::thread::JoinHandle<u64>) {
    let (wake, mut sleeper) = UnixStream::pair().expect("socketpair");
    let (tx, rx) = std::sync::mpsc::channel();
    let t = std::thread::spawn(move || {
        let me = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
        tx.send(me).expect("send tid");
        level_a(LEVELS, &mut sleeper)
    });
    let task = std::path::Path::new("/proc").join(rx.recv().expect("tid"));
    // Wait (generously) until the thread sits in its blocking receive. std's
    // `UnixStream::read` is `recv`, which glibc makes the recvfrom(2) syscall (45 on
    // x86_64), not read(2) (0); accept both so a std or libc change cannot hang the bench.
    let deadline = Instant::now() + Duration::from_secs(60);
    let (sp, pc) = loop {
        let s = std::fs::read_to_string(task.join("syscall")).unwrap_or_default();
        let f: Vec<&str> = s.split_whitespace().collect();
        if f.len() == 9 && (f[0] == "0" || f[0] == "45") {
            let hex = |x: &str| u64::from_str_radix(x.trim_start_matches("0x"), 16).expect("hex");
            break (hex(f[7]), hex(f[8]));
        }
        assert!(Instant::now() < deadline, "the thread did not block in read/recvfrom: {s:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    let mem = std::fs::File::open("/proc/self/mem").expect("/proc/self/mem");
    let mut stack = vec![0u8; DEFAULT_USER_STACK as usize];
    let n = mem.read_at(&mut stack, sp).expect("read the stack");
    stack.truncate(n);
    (UserRegs { bp: 0, sp, ip: pc }, stack, wake, t)
}

/// Print the frame-pointer verdict of this binary, libc and `DCPI_FP_SHARE`'s images.
fn fp_shares() {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
    let libc = maps
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .find(|p| p.contains("/libc.so"))
        .map(str::to_string);
    let mut paths: Vec<String> = vec!["/proc/self/exe".into()];
    paths.extend(libc);
    if let Ok(more) = std::env::var("DCPI_FP_SHARE") {
        paths.extend(more.split(':').filter(|p| !p.is_empty()).map(str::to_string));
    }
    for p in paths {
        let Ok(data) = std::fs::read(&p) else { continue };
        let t0 = Instant::now();
        let Some(t) = ImageTables::parse(&data) else { continue };
        let parse = t0.elapsed();
        let s = t.fp_share();
        let t1 = Instant::now();
        if let Some((svma, eh)) = t.eh_frame_section() {
            black_box(fp_scan(eh, svma));
        }
        let scan = t1.elapsed();
        eprintln!(
            "fp share {p}: {} FDEs, {} framed, {} keep rbp ({:.1} % of framed bytes); parse \
             {parse:?} (the frame-pointer scan included: {scan:?} alone)",
            s.fdes,
            s.framed,
            s.rbp_fdes,
            100.0 * s.rbp_bytes as f64 / s.bytes.max(1) as f64,
        );
    }
}

fn bench(c: &mut Criterion) {
    fp_shares();
    let (regs, stack, mut wake, t) = capture();
    let pid = std::process::id();
    let shared = DwarfShared::manual(DEFAULT_CACHE_BYTES);
    let mappings = shared.load_now(pid);
    let (bytes, images) = shared.image_usage();
    let mut d = DwarfUnwinder::new(Arc::clone(&shared));
    let mut out = Vec::with_capacity(256);
    let truncated = d.unwind(pid, regs, &stack, 256, &mut out);
    eprintln!(
        "stack: {} frames to the root (truncated: {truncated}), {} B copied; {mappings} \
         executable mappings, {images} images, {bytes} B of unwind sections",
        out.len(),
        stack.len()
    );
    if truncated || out.len() <= 20 + LEVELS as usize / 2 {
        let maps = std::fs::read_to_string("/proc/self/maps").unwrap_or_default();
        let words: Vec<String> = stack
            .chunks_exact(8)
            .take(96)
            .enumerate()
            .map(|(i, w)| {
                format!(
                    "{:#x}: {:#x}",
                    regs.sp + 8 * i as u64,
                    u64::from_ne_bytes(w.try_into().unwrap())
                )
            })
            .collect();
        panic!("the stack did not unwind: {out:x?} (regs {regs:x?})\n{}\n{maps}", words.join("\n"));
    }
    let full = out.len();

    let mut g = c.benchmark_group("unwind");
    g.throughput(Throughput::Elements(1));
    g.bench_function("depth20", |b| {
        b.iter(|| {
            out.clear();
            let tr = d.unwind(pid, regs, black_box(&stack), 20, &mut out);
            assert!(tr && out.len() == 20);
        })
    });
    g.bench_function("depth20_cold", |b| {
        b.iter_batched(
            CacheX86_64::new,
            |cache| {
                let old = d.swap_rule_cache(cache);
                out.clear();
                let tr = d.unwind(pid, regs, black_box(&stack), 20, &mut out);
                assert!(tr && out.len() == 20);
                old
            },
            BatchSize::SmallInput,
        )
    });
    // A frame-pointer chain of 20 frames in an image [0x50_0000, 0x60_0000) that keeps frame
    // pointers and has no CFI: frame k's bp is sp + 16 k, holding [bp of k + 1][return].
    let fsp = 0x7ff0_0000_0000u64;
    let mut words = Vec::new();
    for k in 0..24u64 {
        let next = if k == 23 { 0 } else { fsp + 16 * (k + 1) };
        words.extend_from_slice(&[next, 0x50_0105 + 0x100 * k]);
    }
    let fstack: Vec<u8> = words.iter().flat_map(|w| w.to_ne_bytes()).collect();
    let fregs = UserRegs { bp: fsp, sp: fsp, ip: 0x50_0010 };
    let fshared = DwarfShared::manual(DEFAULT_CACHE_BYTES);
    let fp_image = ImageTables::frame_pointers_only(0x50_0000..0x60_0000);
    fshared.add_module(1, &fp_image, 0x50_0000..0x60_0000, 0);
    for (name, mut u) in [
        ("fp20_auto", DwarfUnwinder::new_auto(Arc::clone(&fshared))),
        ("fp20_dwarf", DwarfUnwinder::new(Arc::clone(&fshared))),
    ] {
        out.clear();
        u.unwind(1, fregs, &fstack, 20, &mut out);
        assert_eq!(out.len(), 20, "{name}: {out:x?}");
        g.bench_function(name, |b| {
            b.iter(|| {
                out.clear();
                let tr = u.unwind(1, fregs, black_box(&fstack), 20, &mut out);
                assert!(tr && out.len() == 20);
            })
        });
        eprintln!("{name}: {} frames stepped by frame pointer", u.counters.fp_steps);
    }
    g.bench_function("to_root", |b| {
        b.iter(|| {
            out.clear();
            let tr = d.unwind(pid, regs, black_box(&stack), 256, &mut out);
            assert!(!tr && out.len() == full);
        })
    });
    g.finish();
    std::io::Write::write_all(&mut wake, b"x").expect("wake the thread");
    t.join().expect("join");
}

criterion_group!(benches, bench);
criterion_main!(benches);
