//! The off-CPU source follows CPU hotplug through `OffCpu::follow_cpus`, which dcpid's flush
//! thread calls with the online list of each hotplug check (`Sampler::hotplug_tick`). Really
//! offlining a vCPU would disturb everything else on the machine, so the test hands the list
//! over as a hotplug check would read it: CPU 1 "comes online", then "goes offline".

use crate::sampler_support::CollectSink;

use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use dcpid::offcpu::tracepoint;
use dcpid::offcpu::{OffCpu, OffCpuConfig, Source};
use dcpid::perf::sampler;
use dcpid::sys::perf::pin_current_thread;

/// `yes | cat`, both on CPU 1 only (they inherit the spawning thread's affinity): each blocks
/// on the pipe thousands of times a second, so their waits are timed iff CPU 1's ring is open.
struct PipeOnCpu1(Child, Child);

impl PipeOnCpu1 {
    fn start() -> Self {
        pin_current_thread(1).expect("pin to CPU 1");
        let mut yes =
            Command::new("yes").stdout(Stdio::piped()).stderr(Stdio::null()).spawn().expect("yes");
        let out = yes.stdout.take().expect("yes stdout");
        let cat = Command::new("cat").stdin(out).stdout(Stdio::null()).spawn().expect("cat");
        pin_current_thread(0).expect("pin to CPU 0");
        Self(yes, cat)
    }

    fn pids(&self) -> [u32; 2] {
        [self.0.id(), self.1.id()]
    }
}

impl Drop for PipeOnCpu1 {
    fn drop(&mut self) {
        for c in [&mut self.0, &mut self.1] {
            drop(c.kill());
            drop(c.wait());
        }
    }
}

fn waits_of(sink: &CollectSink, pids: [u32; 2]) -> usize {
    sink.take_samples().iter().filter(|s| pids.contains(&s.pid)).count()
}

/// Polls until `f` holds, or fails with `what` after a generous deadline.
fn until(what: &str, mut f: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !f() {
        assert!(Instant::now() < deadline, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[dcpi_testkit::test(perf)]
fn the_off_cpu_source_opens_a_cpu_that_comes_online_and_closes_one_that_goes() {
    let online = sampler::online_cpus().expect("online CPUs");
    if !(online.contains(&0) && online.contains(&1)) {
        dcpi_testkit::skip!("needs CPUs 0 and 1 online, has {online:?}");
    }
    // The source's reading thread (spawned from here) runs on CPU 0 with this one.
    pin_current_thread(0).expect("pin to CPU 0");
    follows_hotplug(Source::SwitchRecords);
    if let Err(e) = tracepoint::find() {
        dcpi_testkit::skip!("the tracepoint source: {e}");
    }
    follows_hotplug(Source::Tracepoint);
}

fn follows_hotplug(source: Source) {
    let sink = Arc::new(CollectSink::default());
    let cfg = OffCpuConfig {
        event: 0,
        slot: 2,
        threshold_ns: 0,
        max_stack: 32,
        ring_pages: 64,
        max_threads: 1024,
        source,
    };
    let mut o = OffCpu::start(cfg, &[0], Arc::<CollectSink>::clone(&sink), None).expect("start");
    assert_eq!(o.source(), source);
    let pipe = PipeOnCpu1::start();
    let pids = pipe.pids();
    let passes = |o: &OffCpu| o.status().passes;

    // Only CPU 0 is open: a second of the pipe on CPU 1 (several passes) times none of its waits.
    assert_eq!(o.status().cpus, 1);
    let p0 = passes(&o);
    std::thread::sleep(Duration::from_secs(1));
    until("three passes", || passes(&o) >= p0 + 3);
    assert_eq!(waits_of(&sink, pids), 0, "waits timed on a CPU whose ring is not open");

    // CPU 1 comes online: its ring opens and the pipe's waits are timed.
    o.follow_cpus(&[0, 1]);
    until("CPU 1's ring is open", || o.status().cpus == 2);
    let mut seen = 0;
    until("the pipe's waits on CPU 1 are timed", || {
        seen += waits_of(&sink, pids);
        seen >= 100
    });

    // CPU 1 goes offline: its ring closes, and once the passes that held its records are
    // delivered, no more waits of the pipe arrive.
    o.follow_cpus(&[0]);
    until("CPU 1's ring is closed", || o.status().cpus == 1);
    let p1 = passes(&o);
    until("two passes", || passes(&o) >= p1 + 2);
    drop(sink.take_samples());
    let p2 = passes(&o);
    std::thread::sleep(Duration::from_millis(500));
    until("three passes", || passes(&o) >= p2 + 3);
    assert_eq!(waits_of(&sink, pids), 0, "waits timed after CPU 1's ring was closed");
    drop(pipe);
    o.stop();
}
