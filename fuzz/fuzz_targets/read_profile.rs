//! Any input: `Profile::decode` returns an error or a profile, never panics, and whatever it
//! accepts re-encodes to the same bytes (the format is canonical).
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use profile_format::Profile;

fuzz_target!(|data: &[u8]| {
    if let Ok(p) = Profile::decode(data, Path::new("fuzz.prof")) {
        assert_eq!(p.encode(), data, "accepted a non-canonical encoding");
        let sum: u64 = p.counts.values().fold(0, |a, &c| a.saturating_add(c));
        assert_eq!(sum, p.header.total_samples);
    }
});
