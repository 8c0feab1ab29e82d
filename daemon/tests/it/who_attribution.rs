//! Who used the CPU, through the aggregator: idle-task samples become the `[idle]` image (same
//! offsets as the kernel, its own identity), kernel time is counted per process, samples per
//! CPU, and the live view ranks them.

use std::path::Path;
use std::time::Duration;

use dcpid::aggregate::Aggregator;
use dcpid::aggregate::Resolved;
use dcpid::resolve::{Resolver, ResolverConfig};
use dcpid::types::{Sample, SampleSink, SideBand, TimedSideBand};
use profile_format::{ImageId, ImageKind};

fn write(p: &Path, data: impl AsRef<[u8]>) {
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, data).expect("write");
}

/// A /proc with only a kernel (no build-id note: the kernel's id is its special id).
fn fake_kernel(dir: &Path) -> ResolverConfig {
    write(
        &dir.join("proc/kallsyms"),
        "ffffffff81000000 T _text\nffffffff81000100 T default_idle\n\
         ffffffff81f00000 T _etext\nffffffff82000000 B _end\n",
    );
    write(&dir.join("proc/modules"), "");
    write(&dir.join("proc/sys/kernel/osrelease"), "6.0.0-test\n");
    write(&dir.join("proc/7/comm"), "kworker/0:1\n");
    ResolverConfig {
        proc_root: dir.join("proc"),
        sys_root: dir.join("sys"),
        jit_map_dir: dir.join("tmp"),
    }
}

fn ksample(time: u64, pid: u32) -> Sample {
    Sample {
        time,
        pid,
        tid: pid,
        pc: 0xffffffff81000123,
        event: 0,
        period: 1000,
        kernel: true,
        cgroup: 0,
        stack: 0,
    }
}

#[test]
fn idle_samples_are_the_idle_image_and_kernel_time_is_per_process() {
    let dir = tempfile::tempdir().expect("tempdir");
    let agg = Aggregator::new(Resolver::new(fake_kernel(dir.path())), 2);
    // CPU 0: 30 idle samples; CPU 1: 5 samples of pid 7 (a kernel thread) in the kernel.
    let mut s0: Vec<Sample> = (0..30).map(|i| ksample(10 + i, 0)).collect();
    let mut s1: Vec<Sample> = (0..5).map(|i| ksample(10 + i, 7)).collect();
    agg.on_drain(0, 1000, &mut s0, &mut Vec::new());
    agg.on_drain(1, 1000, &mut s1, &mut Vec::new());
    agg.on_drain(0, 1000, &mut Vec::new(), &mut Vec::new());
    let r = agg.flush_all();
    assert_eq!(r.samples, 35);
    let mut idle = None;
    let mut kernel = None;
    for p in r.profiles.values() {
        assert_eq!(p.image.kind, ImageKind::Kernel);
        let n: u64 = p.counts.values().map(|c| c.0).sum();
        match p.image.path.as_slice() {
            b"[idle]" => idle = Some((p.image.id.clone(), n, p.counts.keys().copied().collect())),
            b"[kernel.kallsyms]" => kernel = Some((p.image.id.clone(), n)),
            other => panic!("unexpected image {}", String::from_utf8_lossy(other)),
        }
    }
    let (idle_id, idle_n, offsets): (ImageId, u64, Vec<u64>) = idle.expect("an [idle] profile");
    let (kernel_id, kernel_n) = kernel.expect("a kernel profile");
    assert_eq!((idle_n, kernel_n), (30, 5));
    assert_eq!(offsets, vec![0x123], "idle offsets are the kernel's");
    assert_ne!(idle_id, kernel_id);

    let w = &r.who;
    assert_eq!(w.kernel.get(&(0, 0)), Some(&30));
    assert_eq!(w.kernel.get(&(7, 0)), Some(&5));
    assert_eq!(w.cpus.get(&(0, 0)), Some(&30));
    assert_eq!(w.cpus.get(&(1, 0)), Some(&5));
    assert_eq!(w.command(7), b"kworker/0:1", "kernel threads are named from /proc/PID/comm");
    assert_eq!(w.command(0), b"swapper");

    let v = agg.top(Duration::from_secs(60), 10);
    assert_eq!((v.totals.as_slice(), v.idle.as_slice()), (&[35][..], &[30][..]));
    let rows = &v.rows;
    assert_eq!((rows[0].pid, rows[0].image.as_slice(), rows[0].samples), (0, &b"[idle]"[..], 30));
    // The kernel thread's kernel code, by offset, with no command (kept for every process).
    assert_eq!(
        (rows[1].command.as_slice(), rows[1].image.as_slice(), rows[1].offset, rows[1].samples),
        (&b""[..], &b"[kernel.kallsyms]"[..], Some(0x123), 5)
    );
    let p = &v.processes[0];
    assert_eq!((p.pid, p.command.as_slice(), p.samples), (7, &b"kworker/0:1"[..], 5));
}

/// Per-process profiles (`by_pid`/`by_cgroup`): off, batches carry none and every process's
/// kernel samples share one table entry; on, each process's kernel samples are its own
/// profile (pid 0 stays `[idle]`), and the flat profiles are the same either way.
#[test]
fn per_process_profiles_split_kernel_time_by_process_only_when_on() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = |on: bool| {
        let agg = Aggregator::new(Resolver::new(fake_kernel(dir.path())), 1);
        agg.set_who_profiles(on);
        let mut s: Vec<Sample> = (0..4).map(|i| ksample(10 + i, 7)).collect();
        s.extend((0..6).map(|i| ksample(20 + i, 8)));
        s.extend((0..3).map(|i| ksample(30 + i, 0)));
        agg.on_drain(0, 1000, &mut s, &mut Vec::new());
        let created = agg.stats().entries_created;
        (agg.flush_all(), created)
    };
    let (off, created_off) = run(false);
    assert!(off.pid_profiles.is_none());
    assert_eq!(created_off, 2, "one kernel entry for pids 7 and 8, one for the idle task");
    let (on, created_on) = run(true);
    assert_eq!(created_on, 3);
    let flat = |r: &Resolved| {
        let mut v: Vec<(Vec<u8>, u64)> = r
            .profiles
            .values()
            .map(|p| (p.image.path.clone(), p.counts.values().map(|c| c.0).sum()))
            .collect();
        v.sort();
        v
    };
    assert_eq!(flat(&on), flat(&off));
    let pp = on.pid_profiles.as_ref().expect("per-process profiles");
    let mut got: Vec<(u32, Vec<u8>, u64)> = pp
        .iter()
        .map(|((_, _, pid), p)| (*pid, p.image.path.clone(), p.counts.values().map(|c| c.0).sum()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        [
            (0, b"[idle]".to_vec(), 3),
            (7, b"[kernel.kallsyms]".to_vec(), 4),
            (8, b"[kernel.kallsyms]".to_vec(), 6)
        ]
    );
}

/// Thread names (the who table's thread rows, FORMAT.md §12 version 2): a thread that renamed
/// itself is named by its COMM record (the kernel sends one for `prctl(PR_SET_NAME)` and
/// `pthread_setname_np`), a thread it then creates inherits its name (FORK record), a thread
/// named before the daemon started is named from `/proc/PID/task/TID/comm`; the leader, threads
/// named as their process and threads no one can name make no row.
#[test]
fn renamed_threads_are_counted_under_their_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cfg = fake_kernel(dir.path());
    write(&dir.path().join("proc/9/comm"), "app\n");
    write(&dir.path().join("proc/9/task/11/comm"), "pre-named\n");
    write(&dir.path().join("proc/9/task/14/comm"), "app\n");
    let agg = Aggregator::new(Resolver::new(cfg), 1);
    let rec = |time, record| TimedSideBand { time, cpu: 0, record };
    let mut side = vec![
        rec(5, SideBand::Comm { pid: 9, tid: 9, comm: b"app".to_vec(), exec: true }),
        rec(6, SideBand::Fork { pid: 9, ppid: 9, tid: 10, ptid: 9 }),
        rec(7, SideBand::Comm { pid: 9, tid: 10, comm: b"renamed".to_vec(), exec: false }),
        rec(8, SideBand::Fork { pid: 9, ppid: 9, tid: 12, ptid: 10 }),
    ];
    let mut s = Vec::new();
    for (tid, n) in [(9, 5), (10, 4), (11, 3), (12, 2), (13, 1), (14, 2)] {
        s.extend((0..n).map(|i| Sample { tid, ..ksample(20 + i, 9) }));
    }
    agg.on_drain(0, 1000, &mut s, &mut side);
    let r = agg.flush_all();
    let mut rows = r.who.thread_rows();
    rows.sort();
    assert_eq!(
        rows,
        [(9, b"pre-named".to_vec(), 0, 3), (9, b"renamed".to_vec(), 0, 6)],
        "renamed (4) and its child (2); pre-named from /proc; not 9 (leader), 13 (no name), 14 \
         (named as the process)"
    );
    assert_eq!(r.who.command(9), b"app");
    assert_eq!(r.who.kernel.get(&(9, 0)), Some(&17), "the command still counts every thread");
}

/// A kernel sample of pid -1 (a task whose pid its parent had already reaped, in its last
/// instructions) counts as the command `[exiting]`, not as a process `[pid 4294967295]`,
/// and dcpid does not look for a `/proc/4294967295`.
#[test]
fn a_sample_of_a_reaped_task_is_the_exiting_command() {
    let dir = tempfile::tempdir().expect("tempdir");
    // A planted /proc entry for the sentinel pid must not name it.
    write(&dir.path().join(format!("proc/{}/comm", profile_format::EXITING_PID)), "planted\n");
    let agg = Aggregator::new(Resolver::new(fake_kernel(dir.path())), 1);
    let mut s: Vec<Sample> = (0..3).map(|i| ksample(10 + i, profile_format::EXITING_PID)).collect();
    agg.on_drain(0, 1000, &mut s, &mut Vec::new());
    let r = agg.flush_all();
    assert_eq!(r.samples, 3);
    let w = &r.who;
    assert_eq!(w.kernel.get(&(profile_format::EXITING_PID, 0)), Some(&3), "{:?}", w.kernel);
    assert_eq!(w.command(profile_format::EXITING_PID), profile_format::EXITING_COMMAND);
    assert_eq!(w.command(8), b"[pid 8]", "an unnamed process keeps its pid");
}
