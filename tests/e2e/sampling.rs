//! End-to-end tests: sampling through the real `dcpid`.

use std::time::{Duration, Instant};

use dcpi_e2e::{run, Sandbox};

fn spin(d: Duration) -> u64 {
    let t = Instant::now();
    let mut x = 1u64;
    while t.elapsed() < d {
        for _ in 0..1000 {
            x = std::hint::black_box(x.wrapping_mul(6364136223846793005).wrapping_add(1));
        }
    }
    x
}

#[dcpi_testkit::test(perf)]
fn probe_describes_what_can_be_sampled() {
    let out = run("dcpid", &["--probe"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("cpu-clock"), "{text}");
    assert!(text.contains("online CPUs"), "{text}");
}

#[dcpi_testkit::test(perf)]
fn daemon_samples_every_online_cpu_with_the_requested_event() {
    let sb = Sandbox::new();
    let mut d = sb.start_daemon("sampling-e2e", &["--events", "cpu-clock:500000"]);
    let hs: Vec<_> =
        (0..2).map(|_| std::thread::spawn(|| spin(Duration::from_millis(1500)))).collect();
    for h in hs {
        h.join().unwrap();
    }
    let st = d.status_json();
    let (code, stderr) = d.terminate();
    assert!(code.success(), "dcpid exit {code}: {stderr}");
    let ev = &st["events"][0];
    assert_eq!(ev["name"], "cpu-clock", "{st}");
    assert_eq!(ev["source"], "software", "{st}");
    // A window of P/16 centred on the nominal period.
    assert_eq!(ev["period_max"], 500_000 + 500_000 / 32, "{st}");
    assert_eq!(ev["period_min"], 500_000 - 500_000 / 32, "{st}");
    let cpus = st["cpus"].as_array().expect("cpus array");
    let online = std::fs::read_to_string("/sys/devices/system/cpu/online").unwrap();
    assert!(!cpus.is_empty(), "{st}");
    for c in cpus {
        assert_eq!(c["online"], true, "{c} (online list {online})");
        assert!(c["samples"].as_u64().unwrap_or(0) > 0, "no samples on {c}");
    }
}

#[test]
fn bad_event_list_is_refused_with_the_item_named() {
    let sb = Sandbox::new();
    let mut args: Vec<String> = sb.daemon_args("bad-events");
    args.extend(["--events".to_string(), "cpu-clock,cyclez:100".to_string()]);
    let argv: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = run("dcpid", &argv);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cyclez"), "{err}");
}
