//! Any bytes as a symbol name (lossily decoded, as names from ELF files, perf maps and
//! kallsyms reach the report tools): demangling and display never panic, and what a report
//! would print holds no control character.
#![no_main]

use dcpi_client::prof::names::{demangle, display_name, escape_controls};
use libfuzzer_sys::fuzz_target;

fn check(name: &str) {
    let _ = demangle(name);
    for raw in [false, true] {
        let shown = display_name(name, raw);
        assert!(!shown.chars().any(char::is_control), "control character in {shown:?}");
    }
    let e = escape_controls(name);
    assert_eq!(escape_controls(&e), e, "escaping is idempotent");
}

fuzz_target!(|data: &[u8]| {
    let name = String::from_utf8_lossy(data);
    check(&name);
    // Names cut at every byte boundary that is a char boundary (a name sliced by a bound), and
    // with the mangling prefixes in front.
    for i in (0..name.len()).filter(|&i| name.is_char_boundary(i)).take(64) {
        check(&name[..i]);
    }
    for prefix in ["_Z", "_ZN", "_R", "_RNv"] {
        check(&format!("{prefix}{name}"));
    }
});
