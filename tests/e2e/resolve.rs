//! End-to-end tests: resolve. The real daemon attributes samples of processes started after it
//! (a JIT-like process running code from anonymous executable memory that publishes
//! /tmp/perf-PID.map, and a short-lived process) to the right images in the database.

use std::path::{Path, PathBuf};
use std::process::Command;

use dcpi_e2e::{require_perf, Sandbox};
use profile_format::{Database, ImageId, ImageKind, Profile};

fn cc(dir: &Path, name: &str, src: &str) -> PathBuf {
    let c = dir.join(format!("{name}.c"));
    std::fs::write(&c, src).expect("write source");
    let out = dir.join(name);
    let st = Command::new("cc")
        .args(["-O1", "-Wl,--build-id=sha1", "-o"])
        .arg(&out)
        .arg(&c)
        .status()
        .expect("run cc");
    assert!(st.success(), "cc failed for {name}");
    out
}

/// Every profile of `host` in every epoch.
fn all_profiles(db: &Path, host: &str) -> Vec<Profile> {
    let d = Database::open(db).expect("database");
    let mut v = Vec::new();
    for e in d.epochs().expect("epochs") {
        let hd = d.host_dir(&e, host).expect("host dir");
        if !hd.path.exists() {
            continue;
        }
        for p in hd.profiles().expect("profiles") {
            v.push(Profile::read(&p.path).unwrap_or_else(|e| panic!("unreadable profile: {e}")));
        }
    }
    v
}

/// x86-64 machine code of `long f(long n) { long i = 0; do i++; while (i != n); return i; }`,
/// copied into an anonymous RWX mapping, announced in /tmp/perf-PID.map, run for ARGV[1] s.
#[cfg(target_arch = "x86_64")]
const JIT_C: &str = r#"
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>
static const unsigned char code[] = {
    0x48, 0x31, 0xc0,       /* xor rax, rax */
    0x48, 0xff, 0xc0,       /* inc rax      */
    0x48, 0x39, 0xf8,       /* cmp rax, rdi */
    0x75, 0xf8,             /* jne inc      */
    0xc3                    /* ret          */
};
int main(int argc, char **argv) {
    double secs = atof(argv[1]);
    unsigned char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return 2;
    memcpy(p, code, sizeof code);
    char path[64];
    snprintf(path, sizeof path, "/tmp/perf-%d.map", (int)getpid());
    FILE *f = fopen(path, "w");
    if (!f) return 3;
    fprintf(f, "%lx %zx jit_spin_loop\n", (unsigned long)p, sizeof code);
    fclose(f);
    printf("%lx\n", (unsigned long)p);
    fflush(stdout);
    long (*fn)(long) = (long (*)(long))p;
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    long t = 0;
    do {
        t += fn(10000000);
        clock_gettime(CLOCK_MONOTONIC, &b);
    } while ((b.tv_sec - a.tv_sec) + (b.tv_nsec - a.tv_nsec) / 1e9 < secs);
    return (int)(t & 1);
}
"#;

#[cfg(target_arch = "x86_64")]
#[test]
fn jit_code_in_anonymous_memory_is_attributed_with_its_perf_map_symbols() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let jit = cc(sb.dir.path(), "jitter", JIT_C);
    let host = "e2e-resolve-jit";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    let out = Command::new(&jit).arg("1.0").output().expect("run jit program");
    assert!(matches!(out.status.code(), Some(0 | 1)), "jit program failed: {:?}", out.status);
    let base = u64::from_str_radix(String::from_utf8_lossy(&out.stdout).trim(), 16)
        .expect("jit program prints its code address");
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");

    let profiles = all_profiles(&sb.db(), host);
    let anon: Vec<&Profile> = profiles
        .iter()
        .filter(|p| {
            p.header.kind == ImageKind::Anon
                && p.header.jit_symbols.iter().any(|s| s.name == "jit_spin_loop" && s.start == base)
        })
        .collect();
    assert!(!anon.is_empty(), "no [anon] profile with the perf map's symbol");
    let path = String::from_utf8_lossy(&anon[0].header.image_path).to_string();
    assert!(path.starts_with("[anon:") && path.ends_with(":jitter]"), "{path}");
    let (inside, total) =
        anon.iter().flat_map(|p| p.counts.iter()).fold((0, 0), |(i, t), (o, c)| {
            (i + if (base..base + 12).contains(o) { *c } else { 0 }, t + c)
        });
    // 1 s at 1 kHz, on a machine shared with other tests: at least 100.
    assert!(inside >= 100, "only {inside} samples in the JIT code (of {total} in [anon])");
    assert_eq!(inside, total, "[anon] offsets are absolute addresses inside the mapping");
    // The program's perf map stays in /tmp (as JITs leave it); remove it.
    if let Some(pid) = path.trim_start_matches("[anon:").split(':').next() {
        let _ = std::fs::remove_file(format!("/tmp/perf-{pid}.map"));
    }
}

#[test]
fn short_lived_processes_resolve_and_unknowns_stay_rare() {
    if !require_perf() {
        return;
    }
    let sb = Sandbox::new();
    let prog = cc(
        sb.dir.path(),
        "shorty",
        "__attribute__((noinline)) unsigned long burn(unsigned long n) {\n\
           volatile unsigned long s = 0; for (unsigned long i = 0; i < n; i++) s += i; return s; }\n\
         int main(void) { return (int)(burn(30000000) & 1); }\n",
    );
    let host = "e2e-resolve-short";
    let mut d = sb.start_daemon(host, &["--events", "cpu-clock:1000000", "--flush-interval", "1s"]);
    // Many short processes (each a few tens of ms), one after the other.
    for _ in 0..20 {
        let st = Command::new(&prog).status().expect("run");
        assert!(st.code().is_some());
    }
    let v = d.status_json();
    let (status, err) = d.terminate();
    assert!(status.success(), "dcpid exit {status}: {err}");
    let data = std::fs::read(&prog).expect("read prog");
    let id = object_build_id(&data);
    let profiles = all_profiles(&sb.db(), host);
    let mine: u64 = profiles
        .iter()
        .filter(|p| p.header.image_id == ImageId::BuildId(id.clone()))
        .map(|p| p.header.total_samples)
        .sum();
    assert!(mine >= 100, "only {mine} samples attributed to the short-lived processes");
    let frac = v["unknown"]["fraction"].as_f64().expect("unknown fraction in status");
    assert!(frac < 0.1, "unknown fraction {frac}: {v}");
}

/// GNU build-id from the PT_NOTE/section notes of an ELF file (a tiny independent parser).
fn object_build_id(data: &[u8]) -> Vec<u8> {
    // Find the "GNU\0" note of type 3 by scanning: cc was asked for a sha1 build-id (20 bytes).
    let pat = [4u8, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0, 0, b'G', b'N', b'U', 0];
    let at = data.windows(pat.len()).position(|w| w == pat).expect("build-id note");
    data[at + pat.len()..at + pat.len() + 20].to_vec()
}
