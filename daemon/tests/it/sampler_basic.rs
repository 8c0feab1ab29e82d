//! The sampler against the real kernel: samples arrive with sane fields, `auto` falls back to
//! cpu-clock without a PMU, an explicit hardware event fails loudly, status and heartbeats.

use crate::sampler_support;

use std::sync::Arc;
use std::time::Duration;

use dcpid::faults::Faults;
use dcpid::perf::probe;
use dcpid::perf::sampler::online_cpus;
use dcpid::perf::{parse_event_list, EventSource, Sampler, SamplerConfig, SamplerError};
use dcpid::sys;
use dcpid::types::Sample;
use dcpid::types::SampleSink;
use dcpid::types::SideBand;
use dcpid::types::TimedSideBand;
use sampler_support::{spin_for, CollectSink};

fn has_pmu() -> bool {
    probe().is_ok_and(|s| s.contains("hardware PMU available"))
}

#[dcpi_testkit::test(perf)]
fn cpu_clock_samples_arrive_with_sane_fields() {
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock:1000000").unwrap(),
        ..SamplerConfig::default()
    };
    let t0 = sys::time::monotonic_ns();
    let sampler = Sampler::start(&cfg, Arc::<CollectSink>::clone(&sink)).expect("start");
    assert_eq!(sampler.events().len(), 1);
    assert_eq!(sampler.events()[0].desc.name, "cpu-clock");
    assert_eq!(sampler.events()[0].source, EventSource::Software);
    // A window of P/16 centred on the nominal period.
    assert_eq!(sampler.events()[0].desc.period_min, 1_000_000 - 1_000_000 / 32);
    assert_eq!(sampler.events()[0].desc.period_max, 1_000_000 + 1_000_000 / 32);
    // Spawn a child that execs, so side-band records (COMM exec, MMAP2) must appear.
    let st = std::process::Command::new("/bin/true").status().expect("spawn /bin/true");
    assert!(st.success());
    spin_for(Duration::from_millis(1500));
    assert!(sampler.drain_threads_progressing(Duration::from_secs(3)));
    let status = sampler.status();
    let json = serde_json::to_string(&status).unwrap();
    assert!(json.contains("\"cpus\""), "{json}");
    sampler.stop();
    let t1 = sys::time::monotonic_ns();

    let samples = sink.take_samples();
    let me = std::process::id();
    let mine = samples.iter().filter(|s| s.pid == me).count();
    assert!(mine > 200, "expected >200 samples of this process in 1.5 s at 1 kHz, got {mine}");
    for s in &samples {
        assert!(s.time >= t0 && s.time <= t1, "sample time {} outside [{t0}, {t1}]", s.time);
        assert!((968_750..=1_031_250).contains(&s.period), "period {}", s.period);
        assert_eq!(s.event, 0);
        // On x86_64 kernel text is in the upper half.
        if cfg!(target_arch = "x86_64") {
            assert_eq!(s.kernel, s.pc >= 0xffff_8000_0000_0000, "{s:?}");
        }
    }
    assert!(samples.iter().any(|s| s.kernel), "no kernel samples (kernel must not be excluded)");
    // drained_until never goes back, and never passes a sample delivered later on that CPU.
    for (cpu, d) in sink.drains.lock().unwrap().iter() {
        assert!(d.windows(2).all(|w| w[0].0 <= w[1].0), "cpu {cpu} drained_until went back");
        // drained_until is a time already passed when it is delivered.
        assert!(d.iter().all(|(until, at)| until < at), "cpu {cpu}: drained_until in the future");
    }
    let late = sink.late.lock().unwrap();
    assert!(late.is_empty(), "records older than an earlier drained_until: {late:?}");
    let sb = sink.sideband.lock().unwrap();
    let exec = sb
        .iter()
        .any(|r| matches!(&r.record, SideBand::Comm { exec: true, comm, .. } if comm == b"true"));
    assert!(exec, "no COMM exec record for /bin/true among {} side-band records", sb.len());
    let mmap = sb.iter().any(|r| matches!(&r.record, SideBand::Mmap2 { .. }));
    assert!(mmap, "no MMAP2 record");
    let total: u64 = status.cpus.iter().map(|c| c.samples).sum();
    assert!(total > 0);
    assert!(status.events[0].time_enabled > 0, "{status:?}");
}

/// Without a PMU: the real kernel's ENOENT; with one: the `simulate_no_pmu` hook, which makes
/// hardware opens fail with ENOENT exactly where the kernel would.
fn no_pmu_config() -> SamplerConfig {
    let simulate = has_pmu();
    if simulate {
        eprintln!("this machine has a hardware PMU: simulating a PMU-less one");
    }
    SamplerConfig {
        faults: Faults { simulate_no_pmu: simulate, ..Default::default() },
        ..SamplerConfig::default()
    }
}

#[dcpi_testkit::test(perf)]
fn auto_falls_back_to_cpu_clock_without_pmu() {
    let sink = Arc::new(CollectSink::default());
    let sampler =
        Sampler::start(&no_pmu_config(), Arc::<CollectSink>::clone(&sink)).expect("start auto");
    let ev = &sampler.events()[0];
    assert_eq!(ev.source, EventSource::Fallback);
    assert_eq!(ev.desc.name, "cpu-clock");
    assert_eq!(ev.requested, "auto");
    assert_eq!(ev.desc.period_max, 1_000_000 + 1_000_000 / 32);
    let status = sampler.status();
    assert_eq!(status.events[0].source, EventSource::Fallback);
    assert!(serde_json::to_string(&status).unwrap().contains("\"fallback\""));
    spin_for(Duration::from_millis(300));
    sampler.stop();
    let samples = sink.take_samples();
    assert!(samples.len() > 50, "fallback cpu-clock produced {} samples", samples.len());
}

#[dcpi_testkit::test(perf, pmu)]
fn auto_uses_cycles_when_there_is_a_pmu() {
    let sink = Arc::new(CollectSink::default());
    let sampler = Sampler::start(&SamplerConfig::default(), Arc::<CollectSink>::clone(&sink))
        .expect("start auto");
    let ev = sampler.events()[0].clone();
    spin_for(Duration::from_millis(300));
    sampler.stop();
    assert_eq!(ev.source, EventSource::Hardware);
    assert_eq!(ev.desc.name, "cycles");
    assert_eq!((ev.desc.period_min, ev.desc.period_max), (1_875_000, 2_000_000));
    assert!(sink.take_samples().len() > 50);
}

#[dcpi_testkit::test(perf)]
fn explicit_hardware_event_fails_with_its_name_and_errno() {
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock,cycles:1000000").unwrap(),
        ..no_pmu_config()
    };
    let err = Sampler::start(&cfg, sink).expect_err("cycles must not open without a PMU");
    let msg = err.to_string();
    // An event the kernel has no counter for here is a configuration error (dcpid exits 2)
    // that says which events do open.
    assert!(matches!(err, SamplerError::Config(_)), "{msg}");
    assert!(msg.contains("cycles:1000000"), "{msg}");
    assert!(msg.contains("ENOENT"), "{msg}");
    assert!(msg.contains("events that open here: cpu-clock"), "{msg}");
}

#[dcpi_testkit::test(perf)]
fn two_events_share_one_ring_per_cpu() {
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock:2000000,page-faults:160").unwrap(),
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&cfg, Arc::<CollectSink>::clone(&sink)).expect("start");
    // Touch fresh pages to cause page faults: ~20,000 of them. All are kept until the end:
    // freed, the allocator hands the same (already faulted-in) pages back to the next one, and
    // only the first few touched new pages (44 samples instead of ~128, under load).
    let keep: Vec<Vec<u8>> = (0..20).map(|_| vec![1u8; 4 << 20]).collect();
    std::hint::black_box(&keep);
    spin_for(Duration::from_millis(300));
    sampler.stop();
    drop(keep);
    let samples = sink.take_samples();
    let clock = samples.iter().filter(|s| s.event == 0).count();
    let faults: Vec<_> = samples.iter().filter(|s| s.event == 1).collect();
    assert!(clock > 50, "cpu-clock samples: {clock}");
    assert!(faults.len() > 50, "page-fault samples: {}", faults.len());
    assert!(faults.iter().all(|s| (155..=165).contains(&s.period)));
}

#[dcpi_testkit::test(perf)]
fn stalled_drain_thread_is_reported_and_stop_still_returns() {
    let cpus = online_cpus().unwrap();
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock").unwrap(),
        redraw_interval: Duration::from_millis(200),
        faults: Faults {
            stall_drain: Some((cpus[0], Duration::from_millis(300))),
            ..Default::default()
        },
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&cfg, sink).expect("start");
    std::thread::sleep(Duration::from_millis(150));
    assert!(sampler.drain_threads_progressing(Duration::from_millis(600)));
    std::thread::sleep(Duration::from_millis(1500));
    assert!(
        !sampler.drain_threads_progressing(Duration::from_millis(600)),
        "the stalled drain thread of CPU {} must be reported",
        cpus[0]
    );
    let st = sampler.status();
    let c = st.cpus.iter().find(|c| c.cpu == cpus[0]).unwrap();
    assert!(c.last_progress_ms.unwrap() >= 1000, "{c:?}");
    let t = std::time::Instant::now();
    sampler.stop();
    assert!(t.elapsed() < Duration::from_secs(2), "stop took {:?}", t.elapsed());
}

/// A sink that is slow to accept: the ring (one page) overflows and the kernel reports LOST.
struct SlowSink;

impl SampleSink for SlowSink {
    fn on_drain(
        &self,
        _cpu: u32,
        _drained_until: u64,
        samples: &mut Vec<Sample>,
        _sideband: &mut Vec<TimedSideBand>,
    ) {
        samples.clear();
        std::thread::sleep(Duration::from_millis(400));
    }
}

#[dcpi_testkit::test(perf)]
fn ring_overflow_is_counted_as_lost() {
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock:500000").unwrap(),
        ring_pages: 1,
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&cfg, Arc::new(SlowSink)).expect("start");
    let hs: Vec<_> =
        (0..2).map(|_| std::thread::spawn(|| spin_for(Duration::from_millis(2000)))).collect();
    for h in hs {
        h.join().unwrap();
    }
    let st = sampler.status();
    sampler.stop();
    let lost: u64 = st.cpus.iter().map(|c| c.lost).sum();
    let samples: u64 = st.cpus.iter().map(|c| c.samples).sum();
    eprintln!("samples {samples}, lost {lost}: {:?}", st.cpus);
    assert!(lost > 0, "a 1-page ring drained every 400 ms at 2 kHz must lose samples");
    // 2 s at 2 kHz on the busy CPUs: what was delivered plus what was lost accounts for most.
    assert!(samples + lost > 2000, "samples {samples} + lost {lost}");
}

/// CPU hotplug, driven through the `online_cpus_path` hook (really offlining a vCPU would disturb
/// everything else on the machine): CPUs that appear are opened, CPUs that leave are stopped, a
/// garbled list changes nothing. With the sampler's own hotplug thread.
#[dcpi_testkit::test(perf)]
fn cpus_joining_and_leaving_the_online_list_are_followed() {
    follow_hotplug(true);
}

/// The same, driven by the owner's calls to `hotplug_tick` (what dcpid's flush thread does).
#[dcpi_testkit::test(perf)]
fn cpus_joining_and_leaving_are_followed_from_the_owners_ticks() {
    follow_hotplug(false);
}

fn follow_hotplug(hotplug_thread: bool) {
    let cpus = online_cpus().unwrap();
    if cpus.len() < 2 {
        dcpi_testkit::skip!("needs 2 online CPUs");
    }
    let (c0, c1) = (cpus[0], cpus[1]);
    let dir = tempfile::tempdir().unwrap();
    let list = dir.path().join("online");
    // The sampler re-reads the list through one open file, so the test rewrites it in place.
    // One fixed-width write without a truncation: a reader sees the old list or the new one,
    // never an empty file or a prefix ("0" of "0-1" would take CPU 1 offline).
    let set_list = |text: &str| {
        use std::os::unix::fs::FileExt;
        let padded = format!("{text:<31}\n");
        assert_eq!(padded.len(), 32, "{text}");
        let mut opts = std::fs::OpenOptions::new();
        let f = opts.create(true).write(true).truncate(false).open(&list).unwrap();
        f.write_all_at(padded.as_bytes(), 0).unwrap();
    };
    set_list(&format!("{c0}"));
    let sink = Arc::new(CollectSink::default());
    let cfg = SamplerConfig {
        events: parse_event_list("cpu-clock:1000000").unwrap(),
        hotplug_interval: Duration::from_millis(100),
        hotplug_thread,
        online_cpus_path: Some(list.clone()),
        ..SamplerConfig::default()
    };
    let sampler = Sampler::start(&cfg, Arc::<CollectSink>::clone(&sink)).expect("start");
    let online = |s: &Sampler, cpu: u32| {
        s.status().cpus.iter().find(|c| c.cpu == cpu).is_some_and(|c| c.online)
    };
    let wait_for = |what: &str, f: &dyn Fn() -> bool| {
        let t = std::time::Instant::now();
        while !f() {
            assert!(t.elapsed() < Duration::from_secs(30), "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(20));
        }
    };
    let ticking = std::sync::atomic::AtomicBool::new(true);
    // Stops the ticker however the scope ends: a failed assertion must fail the test, not
    // leave the scope waiting for a ticker that never stops.
    struct StopTicking<'a>(&'a std::sync::atomic::AtomicBool);
    impl Drop for StopTicking<'_> {
        fn drop(&mut self) {
            self.0.store(false, std::sync::atomic::Ordering::Release);
        }
    }
    std::thread::scope(|scope| {
        let _stop = StopTicking(&ticking);
        if !hotplug_thread {
            scope.spawn(|| {
                while ticking.load(std::sync::atomic::Ordering::Acquire) {
                    sampler.hotplug_tick();
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        assert!(online(&sampler, c0));
        assert!(!online(&sampler, c1));
        set_list(&format!("{c0}-{c1}"));
        wait_for("the new CPU to be opened", &|| online(&sampler, c1));
        set_list("garbage");
        std::thread::sleep(Duration::from_millis(400));
        assert!(online(&sampler, c0) && online(&sampler, c1), "a bad list must change nothing");
        // The new CPU's thread delivers at its watermark or within its 1 s redraw interval; an
        // idle CPU may need the latter, so wait for it rather than race the removal below.
        wait_for("the new CPU to deliver", &|| {
            sink.drains.lock().unwrap().get(&c1).is_some_and(|d| !d.is_empty())
        });
        set_list(&format!("{c0}"));
        wait_for("the departed CPU's thread to stop", &|| !online(&sampler, c1));
        assert!(online(&sampler, c0));
        assert!(sampler.drain_threads_progressing(Duration::from_secs(2)));
    });
    sampler.stop();
    let drains = sink.drains.lock().unwrap();
    assert!(drains.get(&c1).is_some_and(|d| !d.is_empty()), "CPU {c1} never delivered");
}
