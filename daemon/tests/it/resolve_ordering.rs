//! The aggregator never merges samples of different images under one key, and applies
//! side-band records in time order across CPUs (synthetic records, fake /proc).

use std::sync::Arc;

use dcpid::aggregate::STALE_AFTER;
use dcpid::aggregate::{Aggregator, Resolved};
use dcpid::resolve::{Resolver, ResolverConfig};
use dcpid::types::{Sample, SampleSink, SideBand, TimedSideBand};
use profile_format::{ImageId, ImageKind, UnknownReason};

struct Fixture {
    _dir: tempfile::TempDir,
    agg: Arc<Aggregator>,
}

fn fixture(ncpus: usize) -> Fixture {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = ResolverConfig {
        proc_root: dir.path().join("proc"),
        sys_root: dir.path().join("sys"),
        jit_map_dir: dir.path().join("tmp"),
    };
    Fixture { agg: Aggregator::new(Resolver::new(cfg), ncpus), _dir: dir }
}

fn bid(n: u8) -> Vec<u8> {
    vec![n; 20]
}

fn mmap(time: u64, cpu: u32, pid: u32, addr: u64, len: u64, pgoff: u64, id: u8) -> TimedSideBand {
    TimedSideBand {
        time,
        cpu,
        record: SideBand::Mmap2 {
            pid,
            tid: pid,
            addr,
            len,
            pgoff,
            dev: None,
            ino: None,
            ino_generation: None,
            prot: 5,
            flags: 2,
            build_id: Some(bid(id)),
            filename: format!("/bin/image{id}").into_bytes(),
            kernel: false,
        },
    }
}

fn exec(time: u64, cpu: u32, pid: u32) -> TimedSideBand {
    TimedSideBand {
        time,
        cpu,
        record: SideBand::Comm { pid, tid: pid, comm: b"new".to_vec(), exec: true },
    }
}

fn fork(time: u64, cpu: u32, pid: u32, ppid: u32) -> TimedSideBand {
    TimedSideBand { time, cpu, record: SideBand::Fork { pid, ppid, tid: pid, ptid: ppid } }
}

fn exit(time: u64, cpu: u32, pid: u32) -> TimedSideBand {
    TimedSideBand { time, cpu, record: SideBand::Exit { pid, ppid: 1, tid: pid, ptid: 1 } }
}

fn sample(time: u64, pid: u32, pc: u64) -> Sample {
    Sample { time, pid, tid: pid, pc, event: 0, period: 1000, kernel: false, cgroup: 0, stack: 0 }
}

fn drain(a: &Aggregator, cpu: u32, until: u64, s: Vec<Sample>, sb: Vec<TimedSideBand>) {
    let (mut s, mut sb) = (s, sb);
    a.on_drain(cpu, until, &mut s, &mut sb);
}

/// Counts at `offset` of the image with build-id `id` (event 0).
fn count(r: &Resolved, id: u8, offset: u64) -> u64 {
    r.profiles
        .get(&(ImageId::BuildId(bid(id)), 0))
        .and_then(|p| p.counts.get(&offset))
        .map_or(0, |c| c.0)
}

fn unknown(r: &Resolved, reason: UnknownReason) -> u64 {
    r.unknown.get(&(0, reason)).map_or(0, |c| c.0)
}

const BASE: u64 = 0x40_0000;

#[test]
fn mmap_on_one_cpu_is_applied_before_a_later_sample_on_another() {
    let f = fixture(2);
    // CPU 1 delivers a sample that needs an mmap CPU 0 has not delivered yet.
    drain(&f.agg, 1, 200, vec![sample(150, 10, BASE + 0x10), sample(50, 10, BASE)], vec![]);
    assert_eq!(f.agg.stats().pending, 2, "samples must wait for CPU 0");
    assert_eq!(f.agg.stats().watermark, 0);
    drain(&f.agg, 0, 300, vec![], vec![mmap(100, 0, 10, BASE, 0x1000, 0x2000, 1)]);
    assert_eq!(f.agg.stats().watermark, 200);
    let r = f.agg.take_resolved(true);
    assert_eq!(r.samples, 2);
    // offset = pc - start + pgoff (file offset).
    assert_eq!(count(&r, 1, 0x2010), 1, "{r:?}");
    // The sample taken before the mmap (ring order is not time order here) is not attributed
    // to an image that was not mapped yet.
    assert_eq!(count(&r, 1, 0x2000), 0);
    assert_eq!(f.agg.stats().pending, 0);
}

#[test]
fn exec_is_not_applied_before_an_earlier_sample() {
    let f = fixture(2);
    drain(&f.agg, 0, 10, vec![], vec![mmap(5, 0, 20, BASE, 0x1000, 0, 1)]);
    drain(&f.agg, 1, 10, vec![], vec![]);
    // CPU 0 reports the exec and the new image at the same address first.
    drain(&f.agg, 0, 1000, vec![], vec![exec(150, 0, 20), mmap(160, 0, 20, BASE, 0x1000, 0, 2)]);
    // Then CPU 1 delivers a sample before the exec and one after, same pc.
    drain(&f.agg, 1, 900, vec![sample(100, 20, BASE + 0x42), sample(200, 20, BASE + 0x42)], vec![]);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0x42), 1, "before exec → old image: {r:?}");
    assert_eq!(count(&r, 2, 0x42), 1, "after exec → new image: {r:?}");
    assert_eq!(r.samples, 2);
}

#[test]
fn exec_without_new_mapping_leaves_no_stale_attribution() {
    let f = fixture(1);
    drain(&f.agg, 0, 10, vec![], vec![mmap(5, 0, 21, BASE, 0x1000, 0, 1)]);
    drain(
        &f.agg,
        0,
        1000,
        vec![sample(100, 21, BASE + 1), sample(300, 21, BASE + 1)],
        vec![exec(200, 0, 21)],
    );
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 1), 1);
    assert_eq!(unknown(&r, UnknownReason::NoMap), 1, "{r:?}");
}

#[test]
fn remmap_at_same_address_of_another_file_splits_counts() {
    let f = fixture(2);
    drain(&f.agg, 0, 10, vec![], vec![mmap(5, 0, 30, BASE, 0x3000, 0, 1)]);
    drain(&f.agg, 1, 10, vec![], vec![]);
    // Another file mapped over the middle page (munmap is not reported; the overlay is).
    drain(&f.agg, 0, 500, vec![], vec![mmap(200, 0, 30, BASE + 0x1000, 0x1000, 0x7000, 2)]);
    drain(
        &f.agg,
        1,
        500,
        vec![
            sample(100, 30, BASE + 0x1010),
            sample(300, 30, BASE + 0x1010),
            sample(300, 30, BASE + 0x2010),
            sample(300, 30, BASE + 0x10),
        ],
        vec![],
    );
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0x1010), 1, "before the overlay: {r:?}");
    assert_eq!(count(&r, 2, 0x7010), 1, "after the overlay: {r:?}");
    assert_eq!(count(&r, 1, 0x2010), 1, "right remainder keeps its file offset");
    assert_eq!(count(&r, 1, 0x10), 1, "left remainder");
}

#[test]
fn pid_reuse_never_merges_images() {
    let f = fixture(2);
    drain(&f.agg, 0, 10, vec![], vec![mmap(5, 0, 1, 0x10_0000, 0x1000, 0, 9)]);
    drain(&f.agg, 1, 10, vec![], vec![]);
    let sb = vec![
        fork(20, 0, 40, 1),
        exec(30, 0, 40),
        mmap(40, 0, 40, BASE, 0x1000, 0, 1),
        exit(300, 0, 40),
        fork(400, 0, 40, 1),
        exec(410, 0, 40),
        mmap(420, 0, 40, BASE, 0x1000, 0, 2),
    ];
    drain(&f.agg, 0, 1000, vec![], sb);
    // Old incarnation's sample arrives late (after the reuse was applied).
    drain(
        &f.agg,
        1,
        1000,
        vec![sample(250, 40, BASE + 8), sample(450, 40, BASE + 8), sample(405, 40, 0x10_0004)],
        vec![],
    );
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 8), 1, "{r:?}");
    assert_eq!(count(&r, 2, 8), 1, "{r:?}");
    // Between fork and exec the child runs the parent's image.
    assert_eq!(count(&r, 9, 4), 1, "{r:?}");
}

#[test]
fn fork_copies_mappings_and_threads_change_nothing() {
    let f = fixture(1);
    let sb = vec![
        mmap(5, 0, 50, BASE, 0x1000, 0, 1),
        fork(10, 0, 50, 50), // a thread
        fork(20, 0, 51, 50), // a child process
    ];
    let s = vec![sample(15, 50, BASE + 2), sample(30, 51, BASE + 3), sample(30, 52, BASE)];
    drain(&f.agg, 0, 100, s, sb);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 2), 1);
    assert_eq!(count(&r, 1, 3), 1);
    assert_eq!(unknown(&r, UnknownReason::ProcessGone), 1, "pid 52 was never seen");
    assert_eq!(r.samples, 3);
}

fn thread_exit(time: u64, cpu: u32, pid: u32, tid: u32) -> TimedSideBand {
    TimedSideBand { time, cpu, record: SideBand::Exit { pid, ppid: pid, tid, ptid: pid } }
}

#[test]
fn process_lives_until_its_last_thread_exits() {
    let f = fixture(1);
    let thread = TimedSideBand {
        time: 20,
        cpu: 0,
        record: SideBand::Fork { pid: 90, ppid: 90, tid: 91, ptid: 90 },
    };
    let sb = vec![
        fork(5, 0, 90, 1),
        mmap(10, 0, 90, BASE, 0x1000, 0, 1),
        thread,
        exit(100, 0, 90), // the leader calls pthread_exit
    ];
    drain(&f.agg, 0, 150, vec![sample(50, 90, BASE)], sb);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0), 1);
    // The other thread still runs after a flush (which collects exited processes).
    drain(&f.agg, 0, 300, vec![sample(200, 90, BASE + 4)], vec![thread_exit(250, 0, 90, 91)]);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 4), 1, "{r:?}");
    assert_eq!(f.agg.with_resolver(|r| r.stats().processes), 0, "gone after the last thread");
}

#[test]
fn samples_wait_for_the_watermark_and_flush_all_takes_everything() {
    let f = fixture(2);
    drain(&f.agg, 0, 100, vec![sample(150, 60, BASE)], vec![mmap(120, 0, 60, BASE, 0x1000, 0, 1)]);
    drain(&f.agg, 1, 90, vec![], vec![]);
    let r = f.agg.take_resolved(true);
    assert_eq!(r.samples, 0, "nothing is below the watermark yet");
    assert_eq!(f.agg.stats().pending, 1);
    let r = f.agg.flush_all();
    assert_eq!(count(&r, 1, 0), 1, "{r:?}");
    let st = f.agg.stats();
    assert_eq!((st.pending, st.samples_in, st.samples_aggregated), (0, 1, 1));
}

#[test]
fn aggregation_merges_identical_keys() {
    let f = fixture(1);
    let s: Vec<Sample> = (0..1000).map(|i| sample(100 + i, 70, BASE + (i % 4))).collect();
    drain(&f.agg, 0, 5000, s, vec![mmap(50, 0, 70, BASE, 0x1000, 0, 1)]);
    let st = f.agg.stats();
    assert_eq!(st.samples_aggregated, 1000);
    assert_eq!(st.entries_created, 4);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 3), 250);
    let p = &r.profiles[&(ImageId::BuildId(bid(1)), 0)];
    assert_eq!(p.counts[&0], (250, 250 * 1000), "period sum");
    assert_eq!(p.image.kind, ImageKind::Elf);
    assert_eq!(p.image.path, b"/bin/image1");
}

#[test]
fn stale_cpu_is_left_out_and_its_late_records_are_applied() {
    let f = fixture(2);
    // CPU 1 never reports; after STALE_AFTER it no longer holds the watermark back.
    drain(&f.agg, 0, 100, vec![], vec![]);
    assert_eq!(f.agg.stats().watermark, 0);
    std::thread::sleep(STALE_AFTER + std::time::Duration::from_millis(100));
    drain(&f.agg, 0, 1000, vec![sample(500, 80, BASE)], vec![]);
    assert_eq!(f.agg.stats().watermark, 1000);
    // CPU 1 wakes up with an old mmap: applied at once, counted as late.
    drain(&f.agg, 1, 1000, vec![sample(600, 80, BASE)], vec![mmap(400, 1, 80, BASE, 0x1000, 0, 1)]);
    assert_eq!(f.agg.stats().late_sideband, 1);
    let r = f.agg.take_resolved(true);
    assert_eq!(count(&r, 1, 0), 1, "late sample after the late mmap: {r:?}");
    // The sample aggregated before the late mmap arrived could not know the mapping.
    assert_eq!(unknown(&r, UnknownReason::NoMap), 1, "{r:?}");
    assert_eq!(r.samples, 2);
}

#[test]
fn state_stays_bounded_over_many_short_processes() {
    let f = fixture(2);
    let mut t = 1000u64;
    drain(&f.agg, 0, t, vec![], vec![mmap(10, 0, 1, BASE, 0x1000, 0, 1)]);
    for round in 0..100u32 {
        for cpu in 0..2u32 {
            let mut sb = Vec::new();
            let mut s = Vec::new();
            for i in 0..500u32 {
                let pid = 1000 + (round * 1000 + cpu * 500 + i) % 30000; // pids get reused
                sb.push(fork(t + 1, cpu, pid, 1));
                sb.push(exec(t + 2, cpu, pid));
                sb.push(mmap(t + 3, cpu, pid, BASE, 0x1000, 0, 2));
                sb.push(mmap(t + 4, cpu, pid, BASE + 0x10_0000, 0x1000, 0, 3));
                s.push(sample(t + 5, pid, BASE + 0x10));
                sb.push(exit(t + 6, cpu, pid));
                t += 10;
            }
            drain(&f.agg, cpu, t, s, sb);
        }
        drain(&f.agg, 0, t + 1, vec![], vec![]);
        drain(&f.agg, 1, t + 1, vec![], vec![]);
        let r = f.agg.take_resolved(true);
        assert_eq!(r.samples, 1000);
        assert_eq!(count(&r, 2, 0x10), 1000, "round {round}");
    }
    let st = f.agg.with_resolver(|r| r.stats());
    assert!(st.processes <= 2, "processes {st:?}");
    assert!(st.retired_processes == 0, "retired {st:?}");
    assert!(st.mappings <= 4, "mappings {st:?}");
    assert!(st.last_asid >= 400_000, "every cycle took fresh asids: {st:?}");
}
