//! Symbol names as reports show them: demangled (Rust legacy and v0 with `rustc-demangle`,
//! Itanium C++ with `cpp_demangle`, as perf and samply do) and made printable.
//!
//! Names come from untrusted files (ELF symbol tables, DWARF, perf maps, kallsyms snapshots):
//! they may be invalid UTF-8, contain control characters (an ESC would drive the terminal) or be
//! broken mangled names. Nothing here panics on such input; what cannot be demangled is shown
//! as it is, escaped.

use std::borrow::Cow;

use crate::escape::controls as escape_controls;

/// Demangle a Rust (legacy or v0) or C++ symbol; other names are returned unchanged. Rust
/// hashes (`::h0123...`) are dropped.
pub fn demangle(raw: &str) -> String {
    // rustc-demangle accepts only Rust: a C++ name such as `_ZN3foo3barEv` fails on its
    // parameter list, so trying it first never turns C++ into Rust. Legacy Rust paths such as
    // `_ZN50_$LT$a..X$u20$as$u20$a..T$GT$4burn17h…E` are Itanium-shaped, and cpp_demangle would
    // leave the `$LT$` escapes in.
    if let Ok(d) = rustc_demangle::try_demangle(raw) {
        return format!("{d:#}");
    }
    if raw.starts_with("_Z") {
        if let Some(s) = demangle_cpp(raw) {
            return s;
        }
    }
    raw.to_owned()
}

/// The longest C++ name [`demangle`] prints; a longer one is shown mangled. Itanium
/// substitutions let a short name print exponentially much (each `S_IS0_S0_E` doubles the
/// type before it: 300 mangled bytes print 2^40 `pair<...>`s), and `cpp_demangle` bounds only its
/// recursion depth, not its output: without this bound one hostile symbol name in an ELF file or
/// a perf map hangs a report and exhausts memory. Real names stay far below (the longest Boost
/// and Qt names are a few KiB).
const MAX_DEMANGLED_CPP: usize = 64 * 1024;

/// A `String` that refuses to grow past its bound: the write error stops `cpp_demangle`'s printer
/// at once, so its work is bounded by the output bound.
struct BoundedString {
    out: String,
    max: usize,
}

impl std::fmt::Write for BoundedString {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        if self.out.len() + s.len() > self.max {
            return Err(std::fmt::Error);
        }
        self.out.push_str(s);
        Ok(())
    }
}

/// The parse steps `cpp_demangle` may take on a name of `len` bytes before it gives up (its
/// `work_limit`, which the copy in `vendor/cpp_demangle` adds). Its parser backtracks: without a
/// bound, hostile names of a few hundred bytes took seconds (each level of some nestings doubles
/// or triples the work). Real names stay below a fourteenth of it (797 123 C++ names from the
/// binaries of a development machine all demangle the same with a limit 14 times smaller); a
/// step costs ~4 ns, so a name costs at most ~4 ms. Names that need more (mangled names of tens
/// of KiB) are shown mangled.
fn cpp_parse_work_limit(len: usize) -> u32 {
    u32::try_from(len.saturating_mul(100).saturating_add(20_000)).unwrap_or(u32::MAX).min(1_000_000)
}

fn demangle_cpp(raw: &str) -> Option<String> {
    // cpp_demangle bounds its recursion, but it is a parser of hostile input in a third-party
    // crate: a panic there must cost one symbol's name, not the report. Real names need the
    // recursion limit of 256: Qt's `QStringBuilder` nests 39 templates deep.
    std::panic::catch_unwind(|| {
        let parse = cpp_demangle::ParseOptions::default()
            .recursion_limit(256)
            .work_limit(cpp_parse_work_limit(raw.len()));
        let sym = cpp_demangle::Symbol::new_with_options(raw, &parse).ok()?;
        let opts = cpp_demangle::DemangleOptions::new().recursion_limit(256);
        let mut out = BoundedString { out: String::new(), max: MAX_DEMANGLED_CPP };
        sym.structured_demangle(&mut out, &opts).ok()?;
        Some(out.out)
    })
    .ok()
    .flatten()
    .map(|s| drop_empty_template_args(&s))
}

/// An empty template argument list (a function template instantiated with an empty parameter
/// pack, `f<>()`) says nothing: perf and c++filt users read `f()`. Only `<>` directly after an
/// identifier character is dropped, so `operator<` / `operator<<` followed by `<>` keep theirs.
fn drop_empty_template_args(s: &str) -> String {
    if !s.contains("<>") {
        return s.to_owned();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("<>") {
        let before = &rest[..i];
        let ident = before.chars().next_back().is_some_and(|c| c.is_alphanumeric() || c == '_');
        let operator = before.ends_with("operator");
        out.push_str(before);
        if !ident || operator {
            out.push_str("<>");
        }
        rest = &rest[i + 2..];
    }
    out.push_str(rest);
    out
}

/// A symbol name as a report row shows it: demangled unless `raw`, then its control
/// characters escaped ([`crate::escape::controls`]; tables and CSV escape format characters
/// too when they print it).
pub fn display_name(name: &str, raw: bool) -> String {
    if raw {
        escape_controls(name).into_owned()
    } else {
        escape_controls(&demangle(name)).into_owned()
    }
}

/// Bytes from a file as text: valid UTF-8 kept, each invalid byte written `\xNN` (so two
/// different broken names stay different). Control characters are kept: [`display_name`]
/// escapes them after demangling.
pub fn text_from_bytes(raw: &[u8]) -> Cow<'_, str> {
    if let Ok(s) = std::str::from_utf8(raw) {
        return Cow::Borrowed(s);
    }
    let mut out = String::with_capacity(raw.len() + 8);
    for chunk in raw.utf8_chunks() {
        out.push_str(chunk.valid());
        for b in chunk.invalid() {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpp_demangle::error::Error as DemangleError;

    #[test]
    fn rust_legacy_v0_and_cpp() {
        assert_eq!(
            demangle("_ZN4core3ptr13drop_in_place17h0123456789abcdefE"),
            "core::ptr::drop_in_place"
        );
        // A trait method, legacy mangling (the `$LT$` escapes of the issue).
        assert_eq!(
            demangle(
                "_ZN50_$LT$traitburn..Xor$u20$as$u20$traitburn..Burn$GT$4burn17h93a6d854f22ad033E"
            ),
            "<traitburn::Xor as traitburn::Burn>::burn"
        );
        // With an LLVM suffix, as LTO builds have.
        assert_eq!(demangle("_ZN3foo3bar17h0123456789abcdefE.llvm.1234567"), "foo::bar");
        assert_eq!(demangle("_RNvCs1234_7mycrate4main"), "mycrate::main");
        assert_eq!(demangle("_ZN3foo3barEv"), "foo::bar()");
        assert_eq!(demangle("_ZN3foo3bazEi"), "foo::baz(int)");
        assert_eq!(demangle("main"), "main");
    }

    #[test]
    fn empty_parameter_pack_prints_no_angle_brackets() {
        // template <typename... T> void f(T...); f<>()
        assert_eq!(demangle("_Z1fIJEEvDpT_"), "void f()");
        assert_eq!(demangle("_Z1fIJEEvv"), "void f()");
        // A non-empty pack keeps its arguments.
        assert_eq!(demangle("_Z1fIJiEEvDpT_"), "void f<int>(int)");
        assert_eq!(drop_empty_template_args("operator<<>(x)"), "operator<<>(x)");
        assert_eq!(drop_empty_template_args("ns::g<>::h<>()"), "ns::g::h()");
    }

    #[test]
    fn broken_and_hostile_names_do_not_panic() {
        for raw in [
            "_Zgarbage!!",
            "_ZN",
            "_ZN3foo",
            "_R",
            "_RNv",
            "_ZN99999999999999999999foo17h0123456789abcdefE",
            "_Z1fIJEE",
            "_ZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZZ",
            "\u{1b}[31mred",
            "",
        ] {
            drop(demangle(raw));
            let shown = display_name(raw, false);
            assert!(!shown.chars().any(char::is_control), "{raw:?} -> {shown:?}");
        }
        let deep = format!("_Z{}", "P".repeat(100_000));
        drop(demangle(&deep));
        assert_eq!(demangle("_Zgarbage!!"), "_Zgarbage!!");
    }

    /// `_Z1f` with parameters `pair<int, int>` and then `depth` types, each a `pair` of the
    /// one before: the demangled name doubles with every 10 mangled bytes.
    fn doubling_pairs(depth: usize) -> String {
        let mut s = String::from("_Z1f4pairIiiE");
        // S_ is `pair`, S0_ `pair<int, int>`, S1_ the first doubled pair, and so on.
        for i in 0..depth {
            let sub = format!("S{}_", char::from_digit(i as u32, 36).unwrap().to_ascii_uppercase());
            s.push_str(&format!("S_I{sub}{sub}E"));
        }
        s
    }

    #[test]
    fn exponential_cpp_names_are_shown_mangled() {
        // Short enough to print: the bound does not cut real names.
        let d = demangle(&doubling_pairs(8));
        assert!(d.starts_with("f(pair<int, int>, pair<pair<int, int>, pair<int, int> >"), "{d}");
        assert!(d.len() > 10_000 && d.len() <= MAX_DEMANGLED_CPP, "{}", d.len());
        // Past the bound: shown as it is, like any name that cannot be demangled.
        let big = doubling_pairs(12);
        assert_eq!(demangle(&big), big);
        // 2^30 pairs: returns (mangled) instead of printing gigabytes.
        let huge = doubling_pairs(30);
        assert_eq!(demangle(&huge), huge);
        assert_eq!(display_name(&huge, false), huge);
    }

    /// Every real name of `client/tests/data/cpp-real-names.tsv` (C++ symbols of the ELF files
    /// of a development machine, with how they were shown before `cpp_demangle` was patched) is
    /// shown as before: the bound on parse work loses no real name.
    #[test]
    fn real_cpp_names_are_shown_as_before_the_parser_patch() {
        let table = include_str!("../../client/tests/data/cpp-real-names.tsv");
        let mut checked = 0;
        for line in table.lines().filter(|l| !l.starts_with('#')) {
            let (mangled, shown) = line.split_once('\t').expect("mangled<TAB>shown");
            assert_eq!(demangle(mangled), shown, "{mangled}");
            checked += 1;
        }
        assert!(checked >= 490, "{checked} names");
        // Nested 39 deep: needs a recursion limit above 128.
        assert!(table.contains("void QConcatenable<QStringBuilder<QStringBuilder<"));
    }

    /// Names on which `cpp_demangle` 0.5.1 backtracks exponentially are rejected at once and shown
    /// mangled: the patched parser no longer parses the template arguments after a substitution
    /// twice when they fail, and it stops when out of work. Unpatched, in a release build, those
    /// from the `demangle` fuzz target took 0.13-1.8 s each to reject, the fifth over 5 minutes
    /// (2 s with the first patch alone), and the 40-deep one would take days.
    #[test]
    fn names_that_made_the_parser_backtrack_exponentially_are_shown_mangled() {
        let found_by_fuzzer: [&[u8]; 6] = [
            // fuzz/artifacts/demangle/slow-unit-0ed12105 (395 bytes)
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3_S_ES_II1_S1_ES_ISo2_S2_ES\
              _IL4_S3_IL3_S2_OS_\xff\xff\xffISDF1SRes7_I7_DS=c\x1b[Z!\xb7\xaa9__\x00S\x00\xff\
              \xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\
              \x00\x00_Z1f4pairIiiES_IS0_SS_Immmmmmmmmmmmmmmmmmmmmf4pairIihES_IS0_S0_ES_II1_S1_E\
              S_ISo2_S2_ES_IL4_S3_IL3_S_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3_S2_OS_\xff\xff\xffISD\
              F1SRes7_I7_DS=c\x1b[Z!\xb7\xaa9__\x00S\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\
              \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00_Z1f4pairIiiESmmmmmmmmm4pairIi\
              iES_IS0_S04\x00",
            // fuzz/artifacts/demangle/slow-unit-a947ef4c (395 bytes)
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3_S_ES_II1_S1_ES_ISo2_S2_ES\
              _IL4_S3_IL3_S2_OS_\xff\xff\xffISDF1SRes7_I7_DS=c\x1b[Z!\xb7\xaa9__\x00S\x00\xff\
              \xff\xff\xff\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\
              \x00\x00_Z1f4pairIiiES_IS0_SS_Immmmmmmmmmmmmmmmmmmmmf4pairIihES_IS0_S0_ES_II1_S1_E\
              S_ISo2_S2_ES_IL4_S3_IL3_S_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3_S2_OS_\xff\xff\xffISD\
              F1SRes7_I7DS[c_\x1b=Z!\xb7\xaa8__\x00S\x00\xff\xff\xff\xff\x00\x00\x00\x00\x00\x00\
              \x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00_Z1f4pairIiiESmmmmmmmmm4pairIi\
              iES_IS0_S04\x00",
            // fuzz/artifacts/demangle/slow-unit-b9a3e2f5 (312 bytes)
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_IS2_S2_ES_IS3_DpS3_OS_IS4_S4_II1_S1_ES_IS2_IS0_\
              S0_ES_II1_S1_ES_IS1_S0_S2_ES_IS3_S3_OS_IIS0_S0_ES_II1_S1_ESdIS2_S2_ES_IS3_DpS3_OS_\
              IS4_S4_II1_S1_ES_IS2_IS0_S0_ES_II1_S1_ES_IS1_S0_S2_ES_IS3_S3_OS_IS4_S4_ES_IS5_S5_E\
              S_IS6_S6_!SD_IS7_RS4_S4_ES_IS5_S5_ES_IS6_S6_!SD_IS7_RIesS7_DS_c\x1b_S",
            // fuzz/artifacts/demangle/timeout-ffcdc9d1 (318 bytes)
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_IS2_S2_ES_IS3_DpS3_OS_IS4_S4_II1_S1_ES_IS2_IS0_\
              S0_ES_II1_S1_ES_IS1_VVVVVVS0_S2_ES_IS3_S3_OS_IIS0_S0_ES_II1_S1_ES_IS2_S2_ES_IS3_Dp\
              S3_OS_IS4_S4_II1_S1_ES_IS2_IS0_S0_ES_II1_S1_ES_IS1_S0_S2_ES_IS3_S3_OS_IS4_S4_ES_IS\
              5_S5_ES_IS6_S6_!SD_IS7_RS4_S4_ES_IS5_S5_ES_IS6_S6_!SD_IS7_RIesS7_DS_c\x1b_S",
            // fuzz/artifacts/demangle/timeout-e8126a33 (382 bytes, found with the first patch:
            // `L` literals and `L<source-name>` types, each parsed up to three ways)
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3ES_IL4_S3_IL3_S2_OSS_II2_S\
              1_ES_ISo2_S2_ES_ILS0_S0_ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3ES_IL4_S3_IL3_S2_OSS_II2\
              _S1_ES_ISo2_S2_ES_IL4_S3_IL3ES_IL4_S3_IL3_S2_OS?\xff\xff\xffISDF1SRes7_I7_DS=c_S0_\
              ES_II1_S1_ES_ISo2_S2_ES_IL4_S3_IL3_S_ES_II1_S1_EIL4_S3_IL3ES_IL4_S3_IL3_S2_OS?\xff\
              \xff\xffISDF1SRes7_I7_DF1SRes7_I7\x00\x00\x00\x00\x00\x00\x00\xb1iESmmmmmmmmm4pair\
              IiiEM_IS0_S04\x00",
            // The printable 250-byte prefix of the timeout (0.13-0.45 s).
            b"_Z1f4pairIihES_IS0_S0_ES_II1_S1_ES_IS2_S2_ES_IS3_DpS3_OS_IS4_S4_II1_S1_ES_IS2_IS0_S0\
              _ES_II1_S1_ES_IS1_S0_S2_ES_IS3_S3_OS_IIS0_S0_ES_II1_S1_ESdIS2_S2_ES_IS3_DpS3_OS_IS4\
              _S4_II1_S1_ES_IS2_IS0_S0_ES_II1_S1_ES_IS1_S0_S2_ES_IS3_S3_OS_IS4_S4_ES_IS5_S5_ES_IS",
        ];
        // `pair<int, int>` then 40 nested `pair<` whose innermost argument is garbage: 2^40
        // parses of it without the patch (1.3 ms at 12 levels, doubling with each level).
        let deep = format!("_Z1f4pairIiiE{}!", "S_I".repeat(40));
        let mut names: Vec<String> =
            found_by_fuzzer.iter().map(|b| String::from_utf8_lossy(b).into_owned()).collect();
        assert_eq!(names[5].len(), 250);
        // The second timeout repeated to 4000 chars: without the work limit its parse takes ~5 s.
        let long: String = names[4].repeat(11).chars().take(4000).collect();
        let limited = cpp_demangle::ParseOptions::default()
            .recursion_limit(256)
            .work_limit(cpp_parse_work_limit(long.len()));
        assert_eq!(
            cpp_demangle::Symbol::new_with_options(long.as_str(), &limited).err(),
            Some(DemangleError::TooMuchWork)
        );
        names.push(deep);
        names.push(long);
        for name in &names {
            assert_eq!(demangle(name), *name);
            let shown = display_name(name, false);
            assert_eq!(shown, escape_controls(name));
            assert!(!shown.chars().any(char::is_control), "{shown:?}");
        }
    }

    #[test]
    fn escaping() {
        assert_eq!(display_name("evil\u{1b}[2Jname", false), "evil\\u{1b}[2Jname");
        assert_eq!(display_name("a\nb", true), "a\\nb");
        assert_eq!(text_from_bytes(b"ok"), "ok");
        assert_eq!(text_from_bytes(b"bad\xff\xfename"), "bad\\xff\\xfename");
        assert_eq!(text_from_bytes("caf\u{e9}".as_bytes()), "caf\u{e9}");
        // Raw names are not demangled.
        assert_eq!(
            display_name("_ZN4core3ptr13drop_in_place17h0123456789abcdefE", true),
            "_ZN4core3ptr13drop_in_place17h0123456789abcdefE"
        );
    }
}
