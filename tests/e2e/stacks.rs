//! End-to-end test of call stacks (`dcpid --callchains fp`): a program whose hot function is
//! reached through two callers in a known proportion, sampled by dcpid and reported by
//! `dcpiprof --callers` and `--format folded`.

use std::process::Command;

use dcpi_e2e::{require_perf, Sandbox};

/// hot() does all the work; via_a gives it 3 units per round and via_b 2: a 60/40 split.
const CALLERS_C: &str = include_str!("callers.c");

fn json(out: std::process::Output) -> serde_json::Value {
    assert!(out.status.success(), "dcpiprof: {}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("JSON report")
}

#[test]
fn callers_of_hot_split_60_40_and_folded_has_full_stacks() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let dir = sb.dir.path();
    let src = dir.join("callers.c");
    std::fs::write(&src, CALLERS_C).expect("write source");
    let bin = dir.join("callers");
    let st = Command::new("cc")
        .args([
            "-O1",
            "-fno-omit-frame-pointer",
            "-fno-inline",
            "-fno-optimize-sibling-calls",
            "-Wl,--build-id=sha1",
            "-o",
        ])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed");
    let host = "e2e-stacks";
    let mut d = sb.start_daemon(
        host,
        &["--events", "cpu-clock:250000", "--flush-interval", "1s", "--callchains", "fp"],
    );
    let st = Command::new(&bin).arg("2").status().expect("run workload");
    assert!(st.success() || st.code() == Some(1), "workload failed: {st}");
    let fl = d.ctl(&["flush"]);
    assert!(fl.status.success(), "flush: {}", String::from_utf8_lossy(&fl.stderr));
    // dcpictl status carries the stack counters (typed, through dcpi-proto).
    let status = d.status_json();
    let stk = &status["stacks"];
    let field = |k: &str| stk[k].as_u64().unwrap_or_else(|| panic!("stacks.{k}: {status:#}"));
    let recorded = field("recorded");
    assert!(recorded >= 500, "stacks recorded {recorded}: {stk}");
    // `overflow` (stacks not interned because the per-CPU table was full) is not bounded by
    // this workload: the daemon samples the whole machine, and a loaded one (compilers with
    // deep, varied stacks) filled the table. The 60/40 split below shows this program's stacks
    // were kept.
    assert!(field("truncated") <= recorded && stk["overflow"].is_u64(), "{stk}");
    let per_cpu: Vec<u64> = stk["distinct_per_cpu"]
        .as_array()
        .expect("distinct_per_cpu")
        .iter()
        .map(|v| v.as_u64().expect("count"))
        .collect();
    assert!(!per_cpu.is_empty() && per_cpu.iter().sum::<u64>() > 0, "{stk}");
    assert!(per_cpu.iter().all(|&n| n <= field("capacity_per_cpu")), "{stk}");
    let text = d.ctl(&["status"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(text.contains("stacks: ") && text.contains(" recorded, "), "{text}");
    let overflowed = d.status_json()["stacks"]["overflow"].as_u64().unwrap_or(0) > 0;
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    // The idle task's stacks are `[idle]` frames, as its flat samples are `[idle]`.
    let db = profile_format::Database::open(&sb.db()).expect("open db");
    let (mut flat_idle, mut stack_idle) = (0u64, 0u64);
    for epoch in db.epochs().expect("epochs") {
        let Ok(hd) = db.host_dir(&epoch, host) else { continue };
        for e in hd.profiles().expect("profiles") {
            let p = profile_format::Profile::read(&e.path).expect("profile");
            if p.header.image_path == b"[idle]" {
                flat_idle += p.header.total_samples;
            }
        }
        if let Ok(p) = profile_format::StackProfile::read(&hd.stacks_path("cpu-clock")) {
            let idle: Vec<bool> = p.images().iter().map(|i| i.path == b"[idle]").collect();
            stack_idle += p
                .stacks()
                .filter(|s| s.frames.first().is_some_and(|f| idle[f.0 as usize]))
                .map(|s| s.samples)
                .sum::<u64>();
        }
    }
    eprintln!("idle samples: {flat_idle} flat, {stack_idle} in stacks");
    // Idle stacks can be among those a full stack table dropped (a loaded machine filled it
    // with 3 idle samples in all): then only the bound below holds.
    assert!(
        flat_idle == 0 || stack_idle > 0 || overflowed,
        "{flat_idle} flat [idle] samples, none in stacks"
    );
    assert!(stack_idle <= flat_idle, "{stack_idle} [idle] stack samples > {flat_idle} flat");

    let cache = dir.join("symbols.sqlite").display().to_string();
    let common = ["--host", host, "--symbol-cache", cache.as_str()];
    let with = |more: &[&str]| -> Vec<String> {
        common.iter().chain(more).map(|s| s.to_string()).collect()
    };
    let prof = |args: Vec<String>| {
        let a: Vec<&str> = args.iter().map(String::as_str).collect();
        sb.prof(&a)
    };

    let r = json(prof(with(&["--callers", "hot", "--format", "json"])));
    let rows = r["rows"].as_array().expect("rows");
    let samples = |name: &str| {
        rows.iter()
            .find(|row| row["symbol"] == name)
            .and_then(|row| row["samples"].as_u64())
            .unwrap_or_else(|| panic!("no caller {name}: {r:#}"))
    };
    let (a, b) = (samples("via_a"), samples("via_b"));
    let share = 100.0 * a as f64 / (a + b) as f64;
    eprintln!("callers of hot: via_a {a}, via_b {b} ({share:.1}% via_a); report {r}");
    assert!(a + b >= 500, "too few samples to judge: {a} + {b}");
    assert!((share - 60.0).abs() <= 5.0, "via_a has {share:.1}% of hot's samples, not ~60%");
    // The two callers are (nearly) all of hot's samples: stacks reach past the leaf.
    let through = r["samples"].as_u64().expect("samples");

    assert!((a + b) as f64 >= 0.9 * through as f64, "{a} + {b} of {through}");
    assert!(r["truncated_percent"].as_f64().is_some_and(|t| (0.0..=100.0).contains(&t)));

    // Callees of via_a: hot, at depth 1.
    let c = json(prof(with(&["--callees", "via_a", "--format", "json"])));
    assert_eq!(c["rows"][0]["symbol"], "hot", "{c:#}");

    let o = prof(with(&["--format", "folded"]));
    assert!(o.status.success(), "folded: {}", String::from_utf8_lossy(&o.stderr));
    let folded = String::from_utf8_lossy(&o.stdout);
    let line = |tail: &str| {
        folded
            .lines()
            .find(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s.ends_with(tail)))
            .map(str::to_owned)
    };
    let la =
        line(";main;via_a;hot").unwrap_or_else(|| panic!("no ...;main;via_a;hot in:\n{folded}"));
    assert!(line(";main;via_b;hot").is_some(), "no ...;main;via_b;hot in:\n{folded}");
    let n: u64 = la.rsplit_once(' ').and_then(|(_, n)| n.parse().ok()).expect("count");
    assert!(n > 0 && n <= a, "{la}: folded count vs callers report {a}");

    // With --image, the stacks whose leaf is in that image (as `perf script --dsos`), not
    // its flat one-frame samples: the same via_a stack, and no stack that ends elsewhere.
    let image = bin.display().to_string();
    let o = prof(with(&["--image", &image, "--format", "folded"]));
    assert!(o.status.success(), "folded --image: {}", String::from_utf8_lossy(&o.stderr));
    let only = String::from_utf8_lossy(&o.stdout);
    let la2 = only
        .lines()
        .find(|l| l.rsplit_once(' ').is_some_and(|(s, _)| s.ends_with(";main;via_a;hot")))
        .unwrap_or_else(|| panic!("--image {image}: no ...;main;via_a;hot in:\n{only}"));
    assert_eq!(la2, la, "--image keeps the stack and its count");
    let full: std::collections::HashSet<&str> = folded.lines().collect();
    for l in only.lines() {
        assert!(full.contains(l), "--image {image}: {l} is not a stack of the whole export");
        let (stack, _) = l.rsplit_once(' ').expect("folded line");
        let leaf = stack.rsplit(';').next().unwrap_or_default();
        assert!(
            ["hot", "via_a", "via_b", "main", "_start"].contains(&leaf)
                || leaf.contains("plt")
                || leaf.contains("+0x"),
            "--image {image}: a stack whose leaf is not in it: {l}"
        );
    }
}
