//! The live view's work per flush and per `dcpictl top` request does not grow with the rows
//! it reads (issue 38: ≤ 1 % of one CPU at 2 refreshes per second with 100k distinct (pid,
//! pc) in the window). Counted as heap allocations, which are deterministic where time is not
//! (BENCHMARKS.md, "dcpictl top", has the times): before, every row of every batch cost
//! copies of its path, build-id and command in each request, and every (pid, image) of a
//! batch a copy of the image's path at each flush.
//!
//! Its own test binary: the counting allocator below is the process's.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;
use std::time::Duration;

use dcpid::types::ImageInfo;
use dcpid::who::{Recent, WhoBatch};
use profile_format::{ImageId, ImageKind};

/// The system allocator, counting the allocations of threads that asked to be counted.
struct Counting;

thread_local! {
    static COUNT: Cell<Option<u64>> = const { Cell::new(None) };
    /// Bytes asked for by the counted allocations (`realloc`: the new size).
    static BYTES: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: every call is passed to `System` unchanged; the counter is a thread-local `Cell`
// with a const initializer (no allocation, no lock) and never panics.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract for `alloc` is `System.alloc`'s.
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from `System` with this layout (every allocation goes there).
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: as for `dealloc`; the caller's contract for the new size is `System`'s.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

fn note(size: usize) {
    // `try_with`: nothing to count while the thread's locals are torn down.
    let counted = COUNT.try_with(|c| c.get().inspect(|n| c.set(Some(n + 1))).is_some());
    if counted == Ok(true) {
        let _ = BYTES.try_with(|b| b.set(b.get() + size as u64));
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

/// Allocations made by `f` on this thread.
fn allocations<T>(f: impl FnOnce() -> T) -> (T, u64) {
    let (r, n, _) = allocated(f);
    (r, n)
}

/// Allocations made by `f` on this thread, and the bytes they asked for.
fn allocated<T>(f: impl FnOnce() -> T) -> (T, u64, u64) {
    BYTES.with(|b| b.set(0));
    COUNT.with(|c| c.set(Some(0)));
    let r = f();
    let n = COUNT.with(|c| c.replace(None)).unwrap_or(0);
    (r, n, BYTES.with(Cell::get))
}

const PIDS: u64 = 5_000;
const PAIRS: u64 = 20_000;

fn image(path: String, id: ImageId, kind: ImageKind) -> Arc<ImageInfo> {
    Arc::new(ImageInfo { kind, id, path: path.into_bytes(), jit_symbols: Vec::new() })
}

/// A flush's batch: `PAIRS` new (pid, pc) over `PIDS` processes of 30 commands (a few without
/// a name), 8 images, so 20 000 (pid, image) rows; 500 kernel pcs, hotter than any user pc.
/// The eight user libraries and the kernel the batches' rows are in.
fn images() -> (Vec<Arc<ImageInfo>>, Arc<ImageInfo>) {
    let user = (0..8u8)
        .map(|i| {
            image(format!("/usr/lib/libt{i}.so"), ImageId::BuildId(vec![i; 20]), ImageKind::Elf)
        })
        .collect();
    let kernel =
        image("[kernel.kallsyms]".into(), ImageId::BuildId(vec![0xee; 20]), ImageKind::Kernel);
    (user, kernel)
}

fn batch(user: &[Arc<ImageInfo>], kernel: &Arc<ImageInfo>, seed: u64) -> WhoBatch {
    let mut b = WhoBatch::default();
    for pid in 0..PIDS as u32 {
        if pid % 1000 != 7 {
            b.comms.insert(1000 + pid, format!("cmd{}", pid % 30).into_bytes());
        }
    }
    for i in seed * PAIRS..(seed + 1) * PAIRS {
        let pid = 1000 + (i % PIDS) as u32;
        let img = &user[((i / PIDS) % user.len() as u64) as usize];
        let n = 1 + i % 7;
        b.add_user(pid, Some(img), 0, n);
        b.hot.push((pid, Arc::clone(img), 0x1000 + i * 16, 0, n));
    }
    for k in 0..500 {
        b.hot_kernel.push((Arc::clone(kernel), k * 32, 0, 10 + k % 3));
        b.kernel.insert((1000 + k as u32, 0), 3);
    }
    b.kernel.insert((0, 0), 100);
    b.cpus.insert((0, 0), 100_000);
    b
}

#[test]
fn live_view_allocations_do_not_grow_with_its_rows() {
    let (user, kernel) = images();
    let mut recent = Recent::default();
    // Ten batches: a 5 s window at two requests per second. Each has 20 500 code rows and
    // 20 500 process rows, of which `Recent::ROWS_PER_BATCH` (4 096) each are kept.
    for seed in 0..10 {
        let mut b = batch(&user, &kernel, seed);
        let ((), n) = allocations(|| recent.push(&mut b));
        // Its maps and lists, the 8 images and 31 commands it keeps: not one per row.
        assert!(n < 1_000, "recording batch {seed} allocated {n} times");
    }
    let (view, n) = allocations(|| recent.top(Duration::from_secs(60), 100));
    // Maps and lists, two small lists per batch, three copies for each of the 200 rows it
    // returns: not per row read (10 × 8 192).
    assert!(n < 2_000, "a request over 10 batches allocated {n} times");
    assert_eq!(view.rows.len(), 100);
    assert_eq!(view.processes.len(), 100);
    // Still the hottest rows, merged: idle first, then the kernel pcs, which are in every
    // batch with up to 12 samples (10 batches: 120), more than any user pc's (at most 7, once).
    assert_eq!((view.rows[0].image.as_slice(), view.rows[0].samples), (&b"[idle]"[..], 1000));
    let k = &view.rows[1];
    assert_eq!(
        (k.image.as_slice(), k.samples, k.command.as_slice()),
        (&b"[kernel.kallsyms]"[..], 120, &b""[..])
    );
    assert_eq!(view.idle, [1000]);
    assert_eq!(view.totals, [1_000_000]);
}

/// A client refreshing twice a second asks again over the window it just got: the second
/// request is the first one's answer, merged and copied once (it was merged again from ten
/// batches, 482 allocations). And when a batch was recorded in between, the merge reuses its
/// maps and lists: allocated afresh per request (~5 MB for ten batches of 4 096 code rows and
/// 4 096 process rows), their page faults were ~22 % of the control thread (issue 38).
#[test]
fn a_request_over_an_unchanged_window_merges_nothing_and_the_merge_keeps_its_maps() {
    let (user, kernel) = images();
    let mut recent = Recent::default();
    for seed in 0..10 {
        recent.push(&mut batch(&user, &kernel, seed));
    }
    let window = Duration::from_secs(60);
    let first = recent.top(window, 100);
    let (again, n) = allocations(|| recent.top(window, 100));
    assert_eq!(n, 0, "a request over the same batches allocated {n} times");
    assert_eq!((&again.rows, &again.processes), (&first.rows, &first.processes));
    assert_eq!((&again.totals, &again.idle), (&first.totals, &first.idle));
    // A new batch in the window: merged again, with the lists and maps of the requests
    // before (two requests to grow them to eleven and twelve batches; the third one reuses).
    let mut bytes = Vec::new();
    for seed in 10..13 {
        let mut b = batch(&user, &kernel, seed);
        recent.push(&mut b);
        let (view, _, n) = allocated(|| recent.top(window, 100));
        assert_eq!(view.totals, [100_000 * (seed + 1)], "the new batch is merged");
        bytes.push(n);
    }
    // What is left is the interned names and the 200 rows returned (a few KiB).
    assert!(
        bytes[2] < 256 * 1024,
        "a request over 13 batches allocated {} bytes (per request: {bytes:?})",
        bytes[2]
    );
}

/// A `top` answer of `n` code rows and `n` process rows, as `Shared::top` makes it.
fn top_result(n: usize) -> dcpi_proto::TopResult {
    dcpi_proto::TopResult {
        window_ms: 5000,
        samples: 1_000_000,
        events: vec!["cpu-clock".into()],
        totals: vec![1_000_000],
        idle: vec![1000],
        rows: (0..n)
            .map(|i| dcpi_proto::TopRow {
                command: format!("cmd{}", i % 30),
                pid: 1000 + i as u32,
                image: format!("/usr/lib/libt{}.so", i % 8),
                kind: "elf".into(),
                build_id: Some(format!("{:040x}", i % 8)),
                offset: Some(0x1000 + 16 * i as u64),
                event: 0,
                samples: 1 + i as u64 % 7,
            })
            .collect(),
        processes: (0..n)
            .map(|i| dcpi_proto::TopProcess {
                pid: 1000 + i as u32,
                command: format!("cmd{}", i % 30),
                image: format!("/usr/lib/libt{}.so", i % 8),
                event: 0,
                samples: 1 + i as u64 % 7,
            })
            .collect(),
    }
}

/// The answer's encoding is written once, not built as a `serde_json::Value` first: that was
/// a map with a copy of each field name per row (4 000 code rows and 4 000 process rows per
/// request), ~35 % of the daemon's CPU time with a client watching (BENCHMARKS.md, "dcpictl
/// top: where the daemon's time went").
#[test]
fn a_top_answer_is_encoded_without_a_copy_per_row() {
    let top = top_result(4000);
    let (out, n) = allocations(|| {
        let resp = dcpi_proto::Response::ok_with(&top);
        // As the control socket sends it.
        serde_json::to_vec(&resp).unwrap()
    });
    // The growth of two buffers (the result's, the line's): not one per row (8 000).
    assert!(n < 200, "encoding a top answer of 8 000 rows allocated {n} times");
    // The same answer as before, read back as the client reads it.
    let back: serde_json::Value = serde_json::from_slice(&out).unwrap();
    assert_eq!(back["ok"], true);
    let read: dcpi_proto::TopResult = serde_json::from_value(back["result"].clone()).unwrap();
    assert_eq!(read, top);
}
