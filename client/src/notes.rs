//! Warnings of the report tools on stderr, with the per-image notes about missing symbols
//! (a stripped library without its debug file, a binary that is gone, a different build at
//! the recorded path) collapsed into one line: on a stock host every system library is
//! stripped, and one line per library buried a three-line answer under forty (issue 39).
//! `-v` (`--verbose`) lists them one per line, as before.

use dcpi_report::escape;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, Ordering};

/// Whether the notes are listed one per line (`--verbose`): set once per run by the tool.
static VERBOSE: AtomicBool = AtomicBool::new(false);

/// List every missing-symbol note (`--verbose`) instead of one summary line.
pub fn set_verbose(v: bool) {
    VERBOSE.store(v, Ordering::Relaxed);
}

/// Why an image's names are missing or partial, for the summary line.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Why {
    Stripped,
    DynsymOnly,
    NotFound,
    Mismatch,
    Unreadable,
    NoDwarf,
}

impl Why {
    fn words(self) -> &'static str {
        match self {
            Self::Stripped => "stripped without a debug file",
            Self::DynsymOnly => "only exported (.dynsym) symbols",
            Self::NotFound => "binary not found",
            Self::Mismatch => "a different build at the path",
            Self::Unreadable => "unreadable",
            Self::NoDwarf => "no DWARF for --lines/--inlines",
        }
    }
}

/// The kind of a missing-symbol note made by the symbolizer (`dcpi_report::report::load_elf`
/// and its debug-file search), or `None` for any other warning.
fn classify(m: &str) -> Option<Why> {
    if m.contains("no symbols (stripped)") {
        Some(Why::Stripped)
    } else if m.contains("only .dynsym (exported functions)") {
        Some(Why::DynsymOnly)
    } else if m.contains(" not found (tried ") {
        Some(Why::NotFound)
    } else if m.contains(": build-id mismatch: profile was taken from build") {
        Some(Why::Mismatch)
    } else if m.contains("cannot parse as ELF")
        || m.contains(": cannot read symbols: ")
        || (m.contains(": cannot read: ") && m.contains("NAME+0xOFFSET"))
    {
        Some(Why::Unreadable)
    } else if m.contains("no DWARF found (binary or debug file)") {
        Some(Why::NoDwarf)
    } else {
        None
    }
}

/// Write `w`'s warnings as `PROG: warning: ...` lines (escaped for the terminal) and empty
/// it: other warnings one per line, missing-symbol notes in one line unless `--verbose` or
/// there is only one (then it is printed whole, with its advice).
pub fn write_warnings(prog: &str, err: &mut dyn Write, w: &mut Vec<String>) -> io::Result<()> {
    let verbose = VERBOSE.load(Ordering::Relaxed);
    let mut notes: Vec<(Why, String)> = Vec::new();
    for m in w.drain(..) {
        match classify(&m) {
            Some(why) if !verbose => notes.push((why, m)),
            _ => writeln!(err, "{prog}: warning: {}", escape::terminal(&m))?,
        }
    }
    match notes.as_slice() {
        [] => {}
        [(_, one)] => writeln!(err, "{prog}: warning: {}", escape::terminal(one))?,
        many => {
            let mut kinds: Vec<(Why, usize)> = Vec::new();
            for (why, _) in many {
                match kinds.iter_mut().find(|(k, _)| k == why) {
                    Some((_, n)) => *n += 1,
                    None => kinds.push((*why, 1)),
                }
            }
            kinds.sort();
            let parts: Vec<String> =
                kinds.iter().map(|(k, n)| format!("{n} {}", k.words())).collect();
            writeln!(
                err,
                "{prog}: warning: names incomplete for {} images ({}): their samples show as \
                 IMAGE+0xOFFSET; -v lists them with how to get their symbols",
                many.len(),
                parts.join(", ")
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_collapse_into_one_line_and_other_warnings_stay() {
        let mut w: Vec<String> = (0..20)
            .map(|i| {
                format!(
                    "/usr/lib/lib{i}.so: no symbols (stripped) and no debug file found; samples \
                     are shown as NAME+0xOFFSET (install its debug info)"
                )
            })
            .collect();
        w.push(
            "binary for b01 not found (tried recorded path); its samples are shown as \
                NAME+0xOFFSET"
                .into(),
        );
        w.push("skipping corrupt profile x.prof".into());
        let mut out = Vec::new();
        write_warnings("dcpiprof", &mut out, &mut w).expect("write");
        let s = String::from_utf8(out).expect("utf8");
        assert_eq!(s.lines().count(), 2, "{s}");
        assert!(s.contains("skipping corrupt profile x.prof"), "{s}");
        assert!(
            s.contains(
                "names incomplete for 21 images (20 stripped without a debug file, 1 \
                        binary not found)"
            ),
            "{s}"
        );
        assert!(w.is_empty());
        // One note is printed whole.
        let mut w = vec!["/x.so: only .dynsym (exported functions) was available: ...".into()];
        let mut out = Vec::new();
        write_warnings("dcpiprof", &mut out, &mut w).expect("write");
        assert_eq!(
            String::from_utf8(out).expect("utf8"),
            "dcpiprof: warning: /x.so: only .dynsym (exported functions) was available: ...\n"
        );
    }
}
