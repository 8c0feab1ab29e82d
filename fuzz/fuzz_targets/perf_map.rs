//! Any bytes as a JIT perf map (`/tmp/perf-PID.map`, written by an untrusted process): the
//! daemon's parser never panics, keeps at most the bounds, and every symbol it keeps has a
//! non-empty name of at most MAX_NAME bytes that does not overflow its address range.
#![no_main]

use dcpid::resolve::jit::{parse_perf_map, parse_perf_map_bounded, MAX_NAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let all = parse_perf_map(data);
    for s in &all {
        assert!(!s.name.is_empty() && s.name.len() <= MAX_NAME, "{:?}", s.name);
        assert!(s.start.checked_add(s.size).is_some());
    }
    assert!(all.windows(2).all(|w| w[0].start <= w[1].start), "sorted");
    let max = data.first().map_or(0, |&b| usize::from(b % 8));
    let (some, cut) = parse_perf_map_bounded(data, max);
    assert!(some.len() <= max);
    assert_eq!(cut, all.len() > max, "truncation reported exactly when entries were dropped");
});
