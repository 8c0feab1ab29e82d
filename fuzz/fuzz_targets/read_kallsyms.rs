//! Any input: `KallsymsSnapshot::decode` returns an error or a snapshot, never panics, and
//! whatever it accepts re-encodes to the same bytes.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use profile_format::KallsymsSnapshot;

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = KallsymsSnapshot::decode(data, Path::new("fuzz.snap")) {
        assert_eq!(s.encode(), data, "accepted a non-canonical encoding");
        if let Some(first) = s.symbols.first() {
            let _ = s.lookup(first.addr);
        }
    }
});
