//! Size bounds: profiles and kallsyms snapshots must be small.

use crate::common;

use std::path::Path;

use profile_format::{KallsymsSnapshot, Profile};

/// Same data set as `benches/codec.rs`: 100k offsets over a 4 MB text, Zipf counts, ~1M samples.
#[test]
fn zipf_profile_is_at_most_3_bytes_per_pair() {
    let p = common::zipf_profile(100_000, 4 << 20, 1_000_000, 42);
    assert_eq!(p.counts.len(), 100_000);
    assert!(p.header.total_samples > 900_000, "{}", p.header.total_samples);
    let bytes = p.encode();
    let per_pair = bytes.len() as f64 / p.counts.len() as f64;
    eprintln!("{} bytes for {} pairs: {per_pair:.3} bytes/pair", bytes.len(), p.counts.len());
    assert!(per_pair <= 3.0, "{per_pair} bytes per (offset, count) pair");
    // Far smaller than the 4 MB text it describes.
    assert!(bytes.len() < (4 << 20) / 10);
    assert_eq!(Profile::decode(&bytes, Path::new("z.prof")).unwrap(), p);
}

#[test]
fn real_kallsyms_round_trips_and_shrinks() {
    let text = match std::fs::read_to_string("/proc/kallsyms") {
        Ok(t) if !t.is_empty() => t,
        Ok(_) => dcpi_testkit::skip!("/proc/kallsyms is empty"),
        Err(e) => dcpi_testkit::skip!("cannot read /proc/kallsyms: {e}"),
    };
    let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
    let snap = KallsymsSnapshot::from_proc_text(&text, &modules, "test".into(), None, &|_| None)
        .expect("this machine's /proc/kallsyms parses");
    if snap.symbols.is_empty() {
        dcpi_testkit::skip!("/proc/kallsyms shows no addresses (kptr_restrict)");
    }
    let bytes = snap.encode();
    let text_syms = text
        .lines()
        .filter(|l| matches!(l.split_whitespace().nth(1), Some("t" | "T" | "w" | "W")))
        .count();
    eprintln!(
        "/proc/kallsyms: {} bytes, {} lines, {text_syms} text symbols -> {} symbols, {} bytes",
        text.len(),
        text.lines().count(),
        snap.symbols.len(),
        bytes.len()
    );
    assert!(snap.symbols.len() * 10 >= text_syms * 9, "lost text symbols");
    assert!(bytes.len() * 3 < text.len(), "snapshot not much smaller than the text");
    let back = KallsymsSnapshot::decode(&bytes, Path::new("k.snap")).unwrap();
    assert_eq!(back, snap);
    // The daemon's way to the same bytes, without the decoded snapshot.
    let direct = KallsymsSnapshot::file_bytes_from_proc_lines(
        text.lines(),
        &modules,
        "test".into(),
        None,
        &|_| None,
    )
    .unwrap();
    assert!(direct == bytes, "file_bytes_from_proc_lines differs from encode");
    // Lookup agrees with the text for a sample of symbols.
    for s in snap.symbols.iter().step_by(997) {
        let found = snap.lookup(s.addr).expect("symbol address resolves");
        assert_eq!(found.addr, s.addr);
        assert_eq!(found.module, s.module);
    }
    let t = snap.symbols.iter().find(|s| s.name == "_text").expect("_text present");
    assert_eq!(t.addr, snap.text_base);
}
