//! Unit tests of the per-CPU aggregation path (ordering tests live in
//! `daemon/tests/resolve_ordering.rs`).

use super::*;
use crate::perf::callchain::StackTables;
use crate::resolve::identity::io_probe;
use crate::resolve::ResolverConfig;

const BASE: u64 = 0x40_0000;

fn resolver(dir: &std::path::Path) -> Resolver {
    Resolver::new(ResolverConfig {
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        jit_map_dir: dir.join("tmp"),
    })
}

fn sample(time: u64, pid: u32, pc: u64, period: u64) -> Sample {
    Sample { time, pid, tid: pid, pc, event: 0, period, kernel: false, cgroup: 0, stack: 0 }
}

fn mmap(time: u64, pid: u32, id: u8) -> TimedSideBand {
    TimedSideBand {
        time,
        cpu: 0,
        record: SideBand::Mmap2 {
            pid,
            tid: pid,
            addr: BASE,
            len: 0x1000,
            pgoff: 0,
            dev: None,
            ino: None,
            ino_generation: None,
            prot: 5,
            flags: 2,
            build_id: Some(vec![id; 20]),
            filename: format!("/bin/image{id}").into_bytes(),
            kernel: false,
        },
    }
}

fn exec(time: u64, pid: u32) -> TimedSideBand {
    TimedSideBand {
        time,
        cpu: 0,
        record: SideBand::Comm { pid, tid: pid, comm: b"x".to_vec(), exec: true },
    }
}

fn count(r: &Resolved, id: u8, offset: u64) -> (u64, u64) {
    r.profiles
        .get(&(ImageId::BuildId(vec![id; 20]), 0))
        .and_then(|p| p.counts.get(&offset).copied())
        .unwrap_or((0, 0))
}

#[test]
fn bounded_memory_early_drains_and_nothing_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = AggregatorConfig { table_entries_per_cpu: 256, overflow_entries_per_cpu: 64 };
    let agg = Aggregator::with_config(resolver(dir.path()), 1, cfg);
    // Two tables + two overflow buffers, 32 bytes an entry.
    let bound = (2 * 256 + 2 * 64) * 32;
    let (total, batch) = (10_000_000u64, 100_000u64);
    let (mut in_count, mut in_period, mut out_count, mut out_period) = (0u64, 0u64, 0u64, 0u64);
    let mut samples = Vec::with_capacity(batch as usize);
    let mut t = 1u64;
    while in_count < total {
        samples.clear();
        for _ in 0..batch {
            // Every key distinct: pids no process ever had, so they resolve to ProcessGone
            // (one output cell) and the test measures the table, not the output.
            let pid = 100_000 + (t % 1000) as u32;
            samples.push(sample(t, pid, BASE + t * 4, 1000 + t % 7));
            in_period += 1000 + t % 7;
            t += 1;
        }
        in_count += batch;
        agg.on_drain(0, t, &mut samples, &mut Vec::new());
        let st = agg.stats();
        assert!(st.table_bytes <= bound, "{} > {bound}", st.table_bytes);
        assert_eq!(st.pending, 0);
        if in_count % 2_000_000 == 0 {
            let r = agg.take_resolved(true);
            let (c, p) = r.unknown[&(0, UnknownReason::ProcessGone)];
            assert_eq!(r.samples, c);
            out_count += c;
            out_period += p;
        }
    }
    let st = agg.stats();
    assert_eq!(st.samples_aggregated, total);
    assert_eq!(st.entries_created, total, "every key distinct: one entry per sample");
    assert!(st.early_drains >= (total - 2 * 256 * 5) / 64, "{st:?}");
    assert!(st.overflow_evictions > total / 2, "{st:?}");
    assert!(st.table_bytes <= bound);
    assert_eq!((out_count, out_period), (in_count, in_period), "counts in == counts out");
}

#[test]
fn early_drains_keep_images_and_period_sums_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = AggregatorConfig { table_entries_per_cpu: 4, overflow_entries_per_cpu: 3 };
    let agg = Aggregator::with_config(resolver(dir.path()), 1, cfg);
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1)]);
    // 64 distinct offsets cycled through a 4-entry table: constant eviction.
    let mut s: Vec<Sample> =
        (0..6400u64).map(|i| sample(100 + i, 7, BASE + (i % 64), 10 + i % 3)).collect();
    agg.on_drain(0, 10_000, &mut s, &mut Vec::new());
    let st = agg.stats();
    assert!(st.early_drains > 100, "{st:?}");
    assert_eq!(st.samples_aggregated, 6400);
    let r = agg.take_resolved(true);
    assert_eq!(r.samples, 6400);
    for off in 0..64u64 {
        let periods: u64 = (0..6400u64).filter(|i| i % 64 == off).map(|i| 10 + i % 3).sum();
        assert_eq!(count(&r, 1, off), (100, periods), "offset {off}");
    }
    assert!(agg.take_resolved(true).profiles.is_empty(), "early results are handed out once");
}

#[test]
fn cached_asid_is_not_used_past_a_later_exec() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.on_drain(0, 1000, &mut vec![sample(100, 7, BASE + 1, 1)], &mut vec![mmap(5, 7, 1)]);
    // The exec is applied in the next pass; samples before and after it, and one in between
    // the old cache limit (1000) and the exec.
    let mut s = vec![sample(1200, 7, BASE + 1, 1), sample(1700, 7, BASE + 1, 1)];
    agg.on_drain(0, 2000, &mut s, &mut vec![exec(1500, 7), mmap(1600, 7, 2)]);
    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 1, 1), (2, 2), "{r:?}");
    assert_eq!(count(&r, 2, 1), (1, 1), "{r:?}");
}

#[test]
fn busy_resolver_leaves_samples_pending_for_the_flusher() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1)]);
    agg.with_resolver(|_| {
        // The resolver is write-locked and the cache is empty: nothing can be looked up.
        let mut s: Vec<Sample> = (0..10).map(|i| sample(20 + i, 7, BASE, 5)).collect();
        agg.on_drain(0, 100, &mut s, &mut Vec::new());
    });
    assert_eq!(agg.stats().pending, 10);
    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0), (10, 50));
    assert_eq!(agg.stats().pending, 0);
}

#[test]
fn drain_pass_with_due_records_does_not_wait_for_a_busy_resolver() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1)]);
    agg.with_resolver(|_| {
        // The resolver is held (as by a flush): a pass with a due mmap must neither block
        // (this thread holds the lock: waiting would deadlock) nor aggregate past it.
        let mut s: Vec<Sample> = (0..10).map(|i| sample(200 + i, 7, BASE, 3)).collect();
        agg.on_drain(0, 1000, &mut s, &mut vec![mmap(150, 7, 2)]);
        // A late record (below the watermark) is stashed, not lost.
        agg.on_drain(0, 1000, &mut Vec::new(), &mut vec![mmap(20, 8, 1)]);
    });
    let st = agg.stats();
    assert_eq!((st.pending, st.late_sideband), (10, 1), "{st:?}");
    // The next pass finds the resolver free: it applies what waited and aggregates.
    agg.on_drain(0, 1100, &mut Vec::new(), &mut Vec::new());
    assert_eq!(agg.stats().pending, 0);
    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 2, 0), (10, 30), "samples after the mmap use its image: {r:?}");
    assert_eq!(count(&r, 1, 0), (0, 0), "{r:?}");
}

#[test]
fn kernel_samples_share_one_key_across_pids() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    let mut s: Vec<Sample> = (1..=100u32)
        .map(|i| Sample { kernel: true, ..sample(10 + u64::from(i), i, KERNEL_START + 64, 1) })
        .collect();
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    let st = agg.stats();
    assert_eq!((st.samples_aggregated, st.entries_created), (100, 1));
}

#[test]
fn idle_task_samples_are_kept_apart_from_the_kernel() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    // Pid 0 is the idle task; pids 1 and 2 run kernel code for themselves.
    let mut s: Vec<Sample> = [0u32, 0, 0, 1, 2]
        .iter()
        .enumerate()
        .map(|(i, &pid)| Sample {
            kernel: true,
            ..sample(10 + i as u64, pid, KERNEL_START + 64, 1)
        })
        .collect();
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    let st = agg.stats();
    assert_eq!((st.samples_aggregated, st.entries_created), (5, 2), "{st:?}");
    // (The test resolver has no kernel image, so both keys resolve to kernel-unknown; that
    // the idle image replaces the kernel image is tested end to end.)
    let r = agg.take_resolved(true);
    assert_eq!(r.samples, 5);
}

#[test]
fn asid_cache_lasts_across_passes_until_a_record_concerns_its_pid() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.on_drain(0, 100, &mut Vec::new(), &mut vec![mmap(5, 7, 1), mmap(6, 8, 1)]);
    let pass = |t: u64, sb: Vec<TimedSideBand>| {
        let mut s: Vec<Sample> =
            (0..10).flat_map(|i| [sample(t + i, 7, BASE, 1), sample(t + i, 8, BASE, 1)]).collect();
        let mut sb = sb;
        agg.on_drain(0, t + 100, &mut s, &mut sb);
        agg.stats().asid_cache_misses
    };
    assert_eq!(pass(200, vec![]), 2, "one lookup per pid");
    assert_eq!(pass(400, vec![]), 2, "no record since: the entries are extended");
    // pid 8 maps a new image mid-pass: only its entry is looked up again (once for the old
    // version, once for the new), and its later samples go to the new version.
    assert_eq!(pass(600, vec![mmap(605, 8, 2)]), 4);
    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0), (30 + 25, 55), "{r:?}");
    assert_eq!(count(&r, 2, 0), (5, 5), "{r:?}");
    // A flush collects garbage in the resolver: the caches start over.
    assert_eq!(pass(800, vec![]), 6);
}

#[test]
fn tables_grow_for_busy_intervals_and_shrink_back_when_quiet() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = AggregatorConfig { table_entries_per_cpu: 32 * 1024, overflow_entries_per_cpu: 1024 };
    let agg = Aggregator::with_config(resolver(dir.path()), 1, cfg);
    let table = |n: usize| (n * 32) as u64;
    let overflow = 2 * 1024 * 32;
    assert_eq!(agg.stats().table_bytes, 2 * table(INITIAL_TABLE_ENTRIES) + overflow);
    let mut t = 1u64;
    let mut interval = |distinct: u64| {
        let mut s: Vec<Sample> = (0..distinct)
            .map(|i| {
                t += 1;
                sample(t, 100_000, BASE + i * 4, 1000)
            })
            .collect();
        agg.on_drain(0, t + 1, &mut s, &mut Vec::new());
        let r = agg.take_resolved(true);
        assert_eq!(r.samples, distinct, "nothing lost while resizing");
        agg.stats().table_bytes - overflow
    };
    // Busy intervals: 20 000 distinct keys each. The table doubles per flush up to the bound.
    let mut sizes = Vec::new();
    for _ in 0..6 {
        sizes.push(interval(20_000));
    }
    assert!(sizes.windows(2).all(|w| w[1] >= w[0]), "{sizes:?}");
    assert_eq!(*sizes.last().expect("sizes"), 2 * table(32 * 1024), "{sizes:?}");
    // A few quiet intervals (load that comes and goes) keep the size: no new tables.
    for _ in 0..(SHRINK_AFTER - 2) {
        assert_eq!(interval(100), 2 * table(32 * 1024));
    }
    // A long quiet spell: back to the initial size (32 Ki -> 4 Ki is three halvings),
    // never below.
    for _ in 0..(3 * SHRINK_AFTER + 4) {
        interval(100);
    }
    assert_eq!(interval(100), 2 * table(INITIAL_TABLE_ENTRIES));
}

/// An aggregator of one CPU with a stack table (16 stacks, 64 frames); the directory holds the
/// resolver's empty /proc and must outlive it.
fn one_cpu_with_stacks() -> (tempfile::TempDir, Arc<Aggregator>, Arc<StackTables>) {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    let tables = Arc::new(StackTables::new(1, 16, 64));
    agg.set_stack_tables(Arc::clone(&tables));
    (dir, agg, tables)
}

#[test]
fn stacks_are_counted_once_per_key_and_resolve_in_their_own_address_space() {
    let (_dir, agg, tables) = one_cpu_with_stacks();
    // Leaf BASE+0x10, caller's return address BASE+0x41 (interned as BASE+0x40).
    let id = tables.cpu(0).intern_pcs(&[BASE + 0x10, BASE + 0x40], false);
    let with_stack = |t: u64| Sample { stack: id, ..sample(t, 7, BASE + 0x10, 1000) };
    let named = TimedSideBand {
        time: 4,
        cpu: 0,
        record: SideBand::Comm { pid: 7, tid: 7, comm: b"before".to_vec(), exec: false },
    };
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![named, mmap(5, 7, 1)]);
    let mut s: Vec<Sample> = (100..130).map(with_stack).collect();
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    // The process exec's another image: the same pcs are now another image's frames.
    let mut s: Vec<Sample> = (2000..2010).map(with_stack).collect();
    agg.on_drain(0, 3000, &mut s, &mut vec![exec(1500, 7), mmap(1600, 7, 2)]);
    let r = agg.take_resolved(true);
    let p = r.stacks.get(&0).expect("stacks of event 0");
    assert_eq!(p.samples(), 40);
    // Each stack carries its process's command (FORMAT.md §13 v3) as the resolver knows it at
    // the flush, as the who table does: the exec's name ("before" was replaced by "x").
    type Seen<'a> = (Vec<u8>, Vec<u64>, u64, Option<&'a [u8]>);
    let mut seen: Vec<Seen<'_>> = p
        .stacks()
        .map(|s| {
            let img = &p.images()[s.frames[0].0 as usize];
            let ImageId::BuildId(b) = &img.id else { panic!("{img:?}") };
            (b.clone(), s.frames.iter().map(|f| f.1).collect(), s.samples, s.command)
        })
        .collect();
    seen.sort();
    assert_eq!(
        seen,
        [
            (vec![1; 20], vec![0x10, 0x40], 30, Some(&b"x"[..])),
            (vec![2; 20], vec![0x10, 0x40], 10, Some(&b"x"[..]))
        ]
    );
    // The flat profiles are what they were without stacks.
    assert_eq!(count(&r, 1, 0x10).0 + count(&r, 2, 0x10).0, 40);
    // Counted, resolved and taken: nothing names the stack any more, so its slot is free.
    assert!(tables.cpu(0).get(id).is_none(), "a taken stack stays in the table");
    // A stack id a pending sample still names survives the pruning of later flushes.
    let id = tables.cpu(0).intern_pcs(&[BASE + 0x10, BASE + 0x40], false);
    let mut s = vec![Sample { stack: id, ..sample(10_000, 7, BASE + 0x10, 1000) }];
    agg.on_drain(0, 3000, &mut s, &mut Vec::new());
    for _ in 0..3 {
        assert!(agg.take_resolved(true).stacks.is_empty());
    }
    assert!(tables.cpu(0).get(id).is_some(), "pending sample's stack was freed");
    agg.on_drain(0, 20_000, &mut Vec::new(), &mut Vec::new());
    assert_eq!(agg.take_resolved(true).stacks[&0].samples(), 1);
}

/// A take without the stacks (a timed flush between `stack_flush_interval`s) leaves a live
/// process's stacks counted for a later take, which has them all; those of a process that
/// exited it takes at once, while the resolver still knows its mappings (its gc then forgets
/// them); so do those of a process that has just mapped an image (its older version goes).
/// Kernel stacks of a process the resolver does not know wait too.
#[test]
fn a_take_without_stacks_keeps_what_stays_resolvable_and_takes_the_rest() {
    let (_dir, agg, tables) = one_cpu_with_stacks();
    let on = |stack: u32, pid: u32, t: u64| Sample { stack, ..sample(t, pid, BASE + 0x10, 1000) };
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1), mmap(6, 8, 2)]);
    // Each process has two versions (before and after its mmap) until a take's gc.
    assert!(agg.take_resolved(true).stacks.is_empty());
    let user = tables.cpu(0).intern_pcs(&[BASE + 0x10, BASE + 0x40], false);
    let kernel = tables.cpu(0).intern_pcs(&[KERNEL_START + 0x100], false);
    let mut s: Vec<Sample> = (100..110).map(|t| on(user, 7, t)).collect();
    s.extend((110..115).map(|t| on(user, 8, t)));
    s.extend((115..118).map(|t| Sample { pc: KERNEL_START + 0x100, ..on(kernel, 9, t) }));
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    // Nothing exited: every stack stays counted, the flat samples go.
    let r = agg.take_resolved(false);
    assert!(
        r.stacks.is_empty(),
        "{:?}",
        r.stacks.get(&0).map(profile_format::StackProfile::samples)
    );
    assert_eq!(count(&r, 1, 0x10).0 + count(&r, 2, 0x10).0, 15);
    assert!(tables.cpu(0).get(user).is_some(), "a counted stack was pruned");
    // Process 8 exits: its stacks are taken by the next take, stacks or not, and resolve.
    let exit = TimedSideBand {
        time: 1200,
        cpu: 0,
        record: SideBand::Exit { pid: 8, ppid: 1, tid: 8, ptid: 1 },
    };
    let mut s: Vec<Sample> = (1100..1104).map(|t| on(user, 7, t)).collect();
    agg.on_drain(0, 2000, &mut s, &mut vec![exit]);
    let r = agg.take_resolved(false);
    let p = r.stacks.get(&0).expect("the exited process's stacks");
    assert_eq!(p.samples(), 5);
    let first = p.stacks().next().expect("a stack");
    let img = &p.images()[first.frames[0].0 as usize];
    assert_eq!(img.id, ImageId::BuildId(vec![2; 20]), "resolved in its own mappings");
    // A take with the stacks has the rest: process 7's 14 samples and the kernel stack's 3.
    let r = agg.take_resolved(true);
    assert_eq!(r.stacks.get(&0).map(profile_format::StackProfile::samples), Some(17));
    assert!(tables.cpu(0).get(user).is_none(), "a take of every stack prunes");
}

/// With `stack_one_in = N` each taken stack counts N samples in the stack profile (an estimate
/// of the samples), while the flat profile counts every sample once.
#[test]
fn a_sampled_stack_counts_one_in_samples() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two slots: a CPU's, whose stacks are sampled, and one after it (the off-CPU source's),
    // whose stacks are all taken and count once.
    let agg = Aggregator::new(resolver(dir.path()), 2);
    let mut tables = StackTables::new(2, 16, 64);
    tables.set_one_in(4, 1);
    assert_eq!((tables.cpu(0).one_in(), tables.cpu(1).one_in()), (4, 1));
    let tables = Arc::new(tables);
    agg.set_stack_tables(Arc::clone(&tables));
    let id = tables.cpu(0).intern_pcs(&[BASE + 0x10, BASE + 0x40], false);
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1)]);
    // 12 samples, 3 of which carry the stack (the drain thread skipped the others' stacks).
    let mut s: Vec<Sample> = (100..112)
        .map(|t| Sample {
            stack: if t % 4 == 0 { id } else { 0 },
            ..sample(t, 7, BASE + 0x10, 1000)
        })
        .collect();
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    agg.on_drain(1, 1000, &mut Vec::new(), &mut Vec::new());
    let r = agg.take_resolved(true);
    assert_eq!(r.stacks.get(&0).expect("stacks of event 0").samples(), 12, "3 stacks x 4");
    assert_eq!(count(&r, 1, 0x10).0, 12, "the flat profile counts each sample once");
    // The other slot's stacks count once each.
    let id = tables.cpu(1).intern_pcs(&[BASE + 0x10, BASE + 0x40], false);
    let mut s: Vec<Sample> =
        (2000..2005).map(|t| Sample { stack: id, ..sample(t, 7, BASE + 0x10, 1000) }).collect();
    agg.on_drain(1, 3000, &mut s, &mut Vec::new());
    agg.on_drain(0, 3000, &mut Vec::new(), &mut Vec::new());
    let r = agg.take_resolved(true);
    assert_eq!(r.stacks.get(&0).expect("stacks of event 0").samples(), 5, "5 stacks x 1");
}

mod watermark_model {
    //! Model-based: two CPUs' drain passes, cut at random instants and interleaved at random,
    //! must attribute every sample to the image its process had mapped at the sample's time,
    //! whichever CPU carried the exec and mmap records and in whatever order the passes came.
    use proptest::collection;
    use proptest::prelude::*;

    use super::*;

    /// Process 7 execs at `k * SEG` and maps image `k + 1` one tick later; its samples fall
    /// strictly after that, so each sample's true image is that of its segment.
    const SEG: u64 = 1000;

    /// One drain pass of a CPU: drained until, its samples, its side-band records.
    type Pass = (u64, Vec<Sample>, Vec<TimedSideBand>);

    #[derive(Clone, Debug)]
    struct Case {
        /// Per segment: the CPU carrying its exec and its mmap.
        record_cpus: Vec<(u32, u32)>,
        /// Samples: (segment, tick within it in 2..SEG, CPU, offset).
        samples: Vec<(usize, u64, u32, u64)>,
        /// Per CPU: ascending pass boundaries.
        cuts: [Vec<u64>; 2],
        /// The order in which the CPUs' passes are delivered (true: CPU 0's next pass).
        order: Vec<bool>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (1usize..6).prop_flat_map(|segs| {
            let end = segs as u64 * SEG;
            (
                collection::vec((0u32..2, 0u32..2), segs),
                collection::vec((0..segs, 2u64..SEG, 0u32..2, 0u64..8), 1..200),
                collection::vec(1..end, 0..8),
                collection::vec(1..end, 0..8),
                collection::vec(any::<bool>(), 0..20),
            )
                .prop_map(|(record_cpus, samples, mut c0, mut c1, order)| {
                    c0.sort_unstable();
                    c1.sort_unstable();
                    Case { record_cpus, samples, cuts: [c0, c1], order }
                })
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]
        #[test]
        fn samples_take_the_image_mapped_at_their_time(c in case()) {
            let dir = tempfile::tempdir().expect("tempdir");
            let agg = Aggregator::new(resolver(dir.path()), 2);
            let segs = c.record_cpus.len();
            let end = segs as u64 * SEG + 1;
            // Everything each CPU will report, by time.
            let mut records: [Vec<TimedSideBand>; 2] = [Vec::new(), Vec::new()];
            let mut samples: [Vec<Sample>; 2] = [Vec::new(), Vec::new()];
            for (k, &(ec, mc)) in c.record_cpus.iter().enumerate() {
                let t = k as u64 * SEG + 1;
                records[ec as usize].push(TimedSideBand { cpu: ec, ..exec(t, 7) });
                records[mc as usize].push(TimedSideBand { cpu: mc, ..mmap(t + 1, 7, k as u8 + 1) });
            }
            let mut want: BTreeMap<(u8, u64), u64> = BTreeMap::new();
            for &(k, tick, cpu, off) in &c.samples {
                let t = k as u64 * SEG + 1 + tick;
                samples[cpu as usize].push(sample(t, 7, BASE + off, 1));
                *want.entry((k as u8 + 1, off)).or_default() += 1;
            }
            for v in &mut records {
                v.sort_by_key(|r| r.time);
            }
            for v in &mut samples {
                v.sort_by_key(|s| s.time);
            }
            // Each CPU's passes: up to each cut, then the rest.
            let mut passes: [Vec<Pass>; 2] = [Vec::new(), Vec::new()];
            for cpu in 0..2 {
                let mut bounds = c.cuts[cpu].clone();
                bounds.push(end);
                let (mut si, mut ri) = (0, 0);
                for b in bounds {
                    let s0 = si;
                    while si < samples[cpu].len() && samples[cpu][si].time <= b {
                        si += 1;
                    }
                    let r0 = ri;
                    while ri < records[cpu].len() && records[cpu][ri].time <= b {
                        ri += 1;
                    }
                    passes[cpu].push((b, samples[cpu][s0..si].to_vec(), records[cpu][r0..ri].to_vec()));
                }
            }
            let mut next = [0usize, 0usize];
            let mut order = c.order.iter().copied();
            while next[0] < passes[0].len() || next[1] < passes[1].len() {
                let want0 = order.next().unwrap_or(next[0] <= next[1]);
                let cpu = if next[1] >= passes[1].len() || (want0 && next[0] < passes[0].len()) {
                    0
                } else {
                    1
                };
                let (b, mut s, mut r) = passes[cpu][next[cpu]].clone();
                next[cpu] += 1;
                agg.on_drain(cpu as u32, b, &mut s, &mut r);
            }
            let mut got: BTreeMap<(u8, u64), u64> = BTreeMap::new();
            for r in [agg.take_resolved(true), agg.flush_all()] {
                for k in 1..=segs as u8 {
                    for off in 0..8u64 {
                        let (n, _) = count(&r, k, off);
                        if n > 0 {
                            *got.entry((k, off)).or_default() += n;
                        }
                    }
                }
                prop_assert!(r.unknown.is_empty(), "unattributed samples: {:?}", r.unknown);
            }
            prop_assert_eq!(got, want);
        }
    }
}

/// Waits (generously: tests run under load) until `done` holds.
fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// One drain pass on a thread named like the sampler's drain threads.
fn drain_pass(agg: &Arc<Aggregator>, cpu: u32, until: u64, s: Vec<Sample>, sb: Vec<TimedSideBand>) {
    let a = Arc::clone(agg);
    std::thread::Builder::new()
        .name(format!("dcpi-drain-{cpu}"))
        .spawn(move || a.on_drain(cpu, until, &mut { s }, &mut { sb }))
        .expect("spawn")
        .join()
        .expect("drain pass");
}

#[test]
fn drain_passes_hand_records_to_the_resolver_thread_and_order_holds() {
    let dir = tempfile::tempdir().expect("tempdir");
    let proc_root = dir.path().join("proc");
    let pid = 42;
    // The new program's mapping has no build-id: its identity is read through map_files.
    let mf = proc_root.join(format!("{pid}/map_files"));
    std::fs::create_dir_all(&mf).expect("mkdir");
    std::fs::write(mf.join(format!("{BASE:x}-{:x}", BASE + 0x1000)), "not an ELF").expect("write");
    let agg = Aggregator::new(resolver(dir.path()), 2);
    agg.start_resolver_thread(None).expect("resolver thread");
    let new_image = TimedSideBand {
        time: 501,
        cpu: 1,
        record: SideBand::Mmap2 {
            pid,
            tid: pid,
            addr: BASE,
            len: 0x1000,
            pgoff: 0,
            dev: None,
            ino: None,
            ino_generation: None,
            prot: 5,
            flags: 2,
            build_id: None,
            filename: b"/bin/new".to_vec(),
            kernel: false,
        },
    };
    // CPU 0: the old program's mapping and a sample; CPU 1: a sample of the old program, the
    // exec and the new mapping, then two samples of the new program.
    drain_pass(&agg, 0, 1000, vec![sample(100, pid, BASE + 1, 1)], vec![mmap(5, pid, 1)]);
    let (s1, r1) = (
        vec![
            sample(400, pid, BASE + 2, 1),
            sample(600, pid, BASE + 3, 1),
            sample(700, pid, BASE + 3, 1),
        ],
        vec![TimedSideBand { cpu: 1, ..exec(500, pid) }, new_image],
    );
    drain_pass(&agg, 1, 1000, s1, r1);
    // Both CPUs reported up to 1000: the records are due, and the resolver thread applies them.
    wait_until("the records to be applied", || agg.resolver_thread_stats().records_applied >= 3);
    let st = agg.resolver_thread_stats();
    assert!(st.running && st.wakeups >= 1, "{st:?}");
    // Later passes aggregate the samples waiting for those records.
    drain_pass(&agg, 0, 2000, Vec::new(), Vec::new());
    drain_pass(&agg, 1, 2000, Vec::new(), Vec::new());
    assert_eq!(agg.stats().pending, 0, "{:?}", agg.stats());
    // A quiet machine: passes that queue nothing due never wake the resolver thread.
    let unparks = agg.worker.unparks.load(Ordering::Relaxed);
    for t in [3000, 4000, 5000] {
        drain_pass(&agg, 0, t, vec![sample(t - 10, pid, BASE + 3, 1)], Vec::new());
        drain_pass(&agg, 1, t, Vec::new(), Vec::new());
    }
    assert_eq!(agg.worker.unparks.load(Ordering::Relaxed), unparks, "quiet passes woke it");

    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 1, 1), (1, 1), "before the exec: the old image {r:?}");
    assert_eq!(count(&r, 1, 2), (1, 1), "before the exec, other CPU: the old image {r:?}");
    let new: Vec<_> = r.profiles.values().filter(|p| p.image.path == b"/bin/new").collect();
    assert_eq!(new.len(), 1, "{r:?}");
    assert!(matches!(new[0].image.id, ImageId::Fallback(_)), "{:?}", new[0].image.id);
    assert_eq!(new[0].counts.get(&3), Some(&(5, 5)), "after the exec: the new image {r:?}");
    assert!(r.unknown.is_empty(), "{r:?}");

    // The files were read (the exec's /proc/PID, the mapping's map_files entry), only by the
    // resolver thread; no drain thread took the resolver for writing.
    let io = io_probe::threads_under(&proc_root);
    assert!(io.len() >= 2, "{io:?}");
    assert!(io.iter().all(|t| t == RESOLVER_THREAD), "file I/O off the resolver thread: {io:?}");
    let writers = lock(&agg.writers).clone();
    assert!(writers.iter().any(|t| t == RESOLVER_THREAD), "{writers:?}");
    assert!(!writers.iter().any(|t| t.starts_with("dcpi-drain")), "{writers:?}");
}

#[test]
fn full_overflow_buffers_are_resolved_by_the_resolver_thread_and_cuts_stay_exact() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = AggregatorConfig { table_entries_per_cpu: 4, overflow_entries_per_cpu: 3 };
    let agg = Aggregator::with_config(resolver(dir.path()), 1, cfg);
    agg.start_resolver_thread(None).expect("resolver thread");
    drain_pass(&agg, 0, 10, Vec::new(), vec![mmap(5, 7, 1)]);
    wait_until("the mmap to be applied", || agg.resolver_thread_stats().records_applied >= 1);
    let mut t = 100;
    let mut want = 0u64;
    // Constant eviction from a 4-entry table; a drain pass hands at most one buffer over at a
    // time, the rest waits (pending) for the next pass.
    for _ in 0..50 {
        let s: Vec<Sample> = (0..40u64).map(|i| sample(t + i, 7, BASE + (i % 32), 1)).collect();
        want += s.len() as u64;
        t += 100;
        drain_pass(&agg, 0, t, s, Vec::new());
    }
    wait_until("an early buffer", || agg.resolver_thread_stats().early_buffers >= 1);
    // A cut at an instant past every sample takes every one of them, exactly once, whether
    // they sit in a table, the overflow buffer, a handed-over buffer or the early results.
    let (r, (), _) = agg.cut(|_| ());
    let total: u64 = (0..32u64).map(|off| count(&r, 1, off).0).sum();
    assert_eq!((r.samples, total), (want, want), "{:?}", agg.stats());
    assert_eq!(agg.flush_all().samples, 0, "nothing counted twice");
    let writers = lock(&agg.writers).clone();
    assert!(!writers.iter().any(|t| t.starts_with("dcpi-drain")), "{writers:?}");
}

#[test]
fn a_late_record_handed_to_the_resolver_thread_still_precedes_the_samples_after_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.start_resolver_thread(None).expect("resolver thread");
    drain_pass(&agg, 0, 1000, Vec::new(), Vec::new());
    assert_eq!(agg.stats().watermark, 1000);
    // A record below the watermark (a CPU that was left out, or a sampler bug) and a sample
    // after it in the same pass: the pass may not aggregate the sample before the resolver
    // thread has applied the record.
    drain_pass(&agg, 0, 1100, vec![sample(600, 7, BASE + 4, 1)], vec![mmap(400, 7, 1)]);
    assert_eq!(agg.stats().late_sideband, 1);
    wait_until("the late record to be applied", || {
        agg.resolver_thread_stats().records_applied >= 1
    });
    let r = agg.take_resolved(true);
    assert_eq!(count(&r, 1, 4), (1, 1), "the sample after the late mmap: {r:?}");
    assert!(r.unknown.is_empty(), "{r:?}");
}

#[test]
fn a_time_weighted_event_counts_nanoseconds_with_period_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(resolver(dir.path()), 1);
    agg.set_time_event(1);
    agg.on_drain(0, 10, &mut Vec::new(), &mut vec![mmap(5, 7, 1)]);
    // Three waits (event 1, periods in ns) and two samples of event 0 at the same pc.
    let mut s = vec![
        Sample { event: 1, ..sample(20, 7, BASE, 1_500) },
        Sample { event: 1, ..sample(21, 7, BASE, 2_500) },
        Sample { event: 1, ..sample(22, 7, BASE, 6_000_000) },
        sample(23, 7, BASE, 1_000_000),
        sample(24, 7, BASE, 1_000_000),
    ];
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    let r = agg.take_resolved(true);
    let ns = r
        .profiles
        .get(&(ImageId::BuildId(vec![1; 20]), 1))
        .and_then(|p| p.counts.get(&0).copied())
        .unwrap_or((0, 0));
    // Counts are the nanoseconds and so is the period sum: a period of 1 per count.
    assert_eq!(ns, (6_004_000, 6_004_000), "{r:?}");
    // The sampled event is unchanged: 2 samples of 1 ms.
    assert_eq!(count(&r, 1, 0), (2, 2_000_000), "{r:?}");
    // `samples` counts samples (waits), not nanoseconds.
    assert_eq!(r.samples, 5);
}
