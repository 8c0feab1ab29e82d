//! Any bytes as a symbol name (lossily decoded, as names from ELF files, perf maps and
//! kallsyms reach the report tools): demangling and display never panic, and what a report
//! would print holds no control character, and the escaper for terminals leaves no control,
//! format or separator character.
#![no_main]

use dcpi_client::escape::{controls, is_unsafe_for_terminal, terminal};
use dcpi_client::prof::names::display_name;
use libfuzzer_sys::fuzz_target;

fn check(name: &str) {
    // `display_name(_, false)` is the demangling under test: it demangles, then escapes.
    for raw in [false, true] {
        let shown = display_name(name, raw);
        assert!(!shown.chars().any(char::is_control), "control character in {shown:?}");
    }
    // The one escaper: idempotent, and what a terminal gets holds no control, format or
    // separator character (Unicode Cc, Cf, Zl, Zp).
    let e = controls(name);
    assert_eq!(controls(&e), e, "escaping is idempotent");
    let t = terminal(name);
    assert_eq!(terminal(&t), t, "escaping is idempotent");
    assert!(!t.chars().any(is_unsafe_for_terminal), "unsafe character in {t:?}");
}

fuzz_target!(|data: &[u8]| {
    let name = String::from_utf8_lossy(data);
    check(&name);
    // The name cut at one char boundary (a name sliced by a bound), chosen by a hash of the
    // input so that the runs between them try every cut of every input. (Checking every prefix
    // of every input cost ~70 demangle calls per input, and re-tested the same short prefixes
    // millions of times.)
    let hash = data.iter().fold(0u32, |h, &b| h.wrapping_mul(31).wrapping_add(u32::from(b)));
    let cuts = name.char_indices().count();
    if let Some((i, _)) = name.char_indices().nth(hash as usize % cuts.max(1)) {
        check(&name[..i]);
    }
    // With the mangling prefixes in front, so that mutations reach the demanglers' parsers.
    for prefix in ["_Z", "_ZN", "_R", "_RNv"] {
        check(&format!("{prefix}{name}"));
    }
});
