//! End-to-end: per-command profiles by default (issue 38 item 1, FORMAT.md §5.6).

use dcpi_e2e::Sandbox;

/// One binary, two hot functions: `BIN a SECS` spins in `hot_a`, `BIN b SECS` in `hot_b`, each
/// until the process has used SECS of CPU time.
const TWO_HOT_C: &str = include_str!("two_hot_cpu.c");

fn rows(v: &serde_json::Value) -> Vec<serde_json::Value> {
    v["rows"].as_array().cloned().unwrap_or_default()
}

/// Samples per row key (`symbol`, `command`, ...) of a JSON report.
fn per(v: &serde_json::Value, key: &str) -> std::collections::BTreeMap<String, u64> {
    let mut m = std::collections::BTreeMap::new();
    for r in rows(v) {
        let k = r[key].as_str().unwrap_or_default().to_owned();
        *m.entry(k).or_insert(0) += r["samples"].as_u64().unwrap_or(0);
    }
    m
}

/// Issue 38's acceptance: with dcpid's default settings, two programs (one binary run under
/// two command names, each spinning in its own function) are told apart per symbol by
/// `dcpiprof --command X --image BIN`, and the three sources agree exactly: each command's
/// per-command total is the who table's count of (command, image), and per symbol the two
/// commands add up to the flat profile's row.
#[dcpi_testkit::test(perf)]
fn per_command_profiles_agree_with_the_who_table_and_the_flat_profile() {
    let sb = Sandbox::new();
    let src = sb.dir.path().join("twohot.c");
    std::fs::write(&src, TWO_HOT_C).expect("write source");
    let bin = sb.dir.path().join("twohot");
    let st = std::process::Command::new("cc")
        .args(["-O1", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .expect("cc");
    assert!(st.success(), "cc failed");
    // Two commands of one image: the comm is the name the binary was executed by.
    let (alpha, beta) = (sb.dir.path().join("pcalpha"), sb.dir.path().join("pcbeta"));
    std::os::unix::fs::symlink(&bin, &alpha).expect("symlink");
    std::os::unix::fs::symlink(&bin, &beta).expect("symlink");

    let host = "e2e-percommand";
    // Default settings: no by_pid, by_cgroup or by_command flag.
    let mut d = sb.start_daemon(host, &[]);
    let mut pa = std::process::Command::new(&alpha).args(["a", "2.0"]).spawn().expect("alpha");
    let mut pb = std::process::Command::new(&beta).args(["b", "1.2"]).spawn().expect("beta");
    assert!(pa.wait().expect("wait").success(), "pcalpha failed");
    assert!(pb.wait().expect("wait").success(), "pcbeta failed");
    // A stop publishes everything it held: the three sources are then final.
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid: {status}: {err}");

    let json = |extra: &[&str]| -> serde_json::Value {
        let out = sb.prof(&[&["--host", host, "--format", "json"][..], extra].concat());
        assert!(out.status.success(), "{extra:?}: {}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("JSON")
    };
    let image = bin.display().to_string();
    let who = per(&json(&["--by", "command", "--image", &image]), "command");
    let flat = json(&["--image", &image]);
    let flat_syms = per(&flat, "symbol");
    let a = json(&["--command", "pcalpha", "--image", &image]);
    let b = json(&["--command", "pcbeta", "--image", &image]);
    assert_eq!(a["report"], "symbols", "{a:#}");
    let (sa, sb_) = (per(&a, "symbol"), per(&b, "symbol"));
    let total = |v: &serde_json::Value| v["total_samples"].as_u64().unwrap_or(0);
    eprintln!(
        "who {who:?}; flat {} {flat_syms:?}; pcalpha {} {sa:?}; pcbeta {} {sb_:?}",
        total(&flat),
        total(&a),
        total(&b)
    );
    // Enough samples to mean something (about 2 s and 1.2 s of CPU).
    assert!(total(&a) >= 200 && total(&b) >= 100, "too few samples: {a:#} {b:#}");
    // The who table and the per-command profiles: exactly the same counts.
    assert_eq!(who.get("pcalpha").copied(), Some(total(&a)), "who {who:?} vs {a:#}");
    assert_eq!(who.get("pcbeta").copied(), Some(total(&b)), "who {who:?} vs {b:#}");
    // The flat profile: per symbol, exactly the two commands' rows added up.
    assert_eq!(total(&flat), total(&a) + total(&b), "{flat:#}");
    let mut names: std::collections::BTreeSet<&String> = flat_syms.keys().collect();
    names.extend(sa.keys());
    names.extend(sb_.keys());
    for s in names {
        let (f, x, y) = (
            flat_syms.get(s).copied().unwrap_or(0),
            sa.get(s).copied().unwrap_or(0),
            sb_.get(s).copied().unwrap_or(0),
        );
        assert_eq!(f, x + y, "{s}: flat {f} != pcalpha {x} + pcbeta {y}");
    }
    // Each command's own function, and none of the other's.
    assert!(sa.get("hot_a").copied().unwrap_or(0) * 10 >= total(&a) * 8, "{a:#}");
    assert_eq!(sa.get("hot_b").copied().unwrap_or(0), 0, "{a:#}");
    assert!(sb_.get("hot_b").copied().unwrap_or(0) * 10 >= total(&b) * 8, "{b:#}");
    assert_eq!(sb_.get("hot_a").copied().unwrap_or(0), 0, "{b:#}");
}
