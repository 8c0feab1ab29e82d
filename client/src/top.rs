//! `dcpictl top`: the hottest commands, images and symbols of the last few seconds, from the
//! daemon's memory (`Request::Top`), symbolized here from the binaries (checked by build-id).

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use dcpi_proto::{Request, TopResult};
use serde::Serialize;

use crate::ctl::{parse_result, request_value, CtlError};
use dcpi_report::debuginfo::file_identity;
use dcpi_report::escape::{controls as escape_controls, terminal};
use dcpi_report::names::display_name;
use dcpi_report::report::ElfState;
use dcpi_report::symbolize::{ElfSymbolizer, SymbolTable};
use dcpi_report::symbolizer::Source;

/// One row as `dcpictl top` shows it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Row {
    pub command: String,
    pub pid: u32,
    pub image: String,
    /// The function, when the binary was found with the recorded build-id; null for kernel
    /// and idle rows (per process, not per function) and for images without symbols.
    pub symbol: Option<String>,
    pub samples: u64,
}

/// A snapshot: every sample of the window and its rows, hottest first.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub window_ms: u64,
    pub samples: u64,
    pub rows: Vec<Row>,
}

/// Binaries' symbols, loaded once per (path, build-id) for the life of `dcpictl top`, and
/// named by the one symbolizer as every report names them.
#[derive(Default, Debug)]
pub struct Symbols {
    elf: HashMap<(String, Option<String>), Option<Source>>,
}

impl Symbols {
    /// The binary for `image` of process `pid`: its path, else the same path in the process's
    /// mount namespace (`/proc/PID/root`, containers), if its build-id is the recorded one.
    fn load(image: &str, build_id: Option<&str>, pid: u32) -> Option<Source> {
        let candidates = [
            PathBuf::from(image),
            Path::new("/proc")
                .join(pid.to_string())
                .join("root")
                .join(image.trim_start_matches('/')),
        ];
        for path in candidates {
            // The build-id and the symbol tables only: a large binary is not read whole.
            let Ok(id) = file_identity(&path) else { continue };
            if let Some(want) = build_id {
                if id.build_id.as_deref().map(hex::encode).as_deref() != Some(want) {
                    continue;
                }
            }
            let table = SymbolTable::from_files(&path, None).ok()?;
            let s = ElfSymbolizer::from_table(table, None, None);
            return Some(Source::Elf(ElfState::Ready(Box::new(s), None)));
        }
        None
    }

    fn symbol(&mut self, r: &dcpi_proto::TopRow) -> Option<String> {
        let offset = r.offset?;
        let s = self
            .elf
            .entry((r.image.clone(), r.build_id.clone()))
            .or_insert_with(|| Self::load(&r.image, r.build_id.as_deref(), r.pid))
            .as_ref()?;
        Some(display_name(s.function(offset)?.raw, false))
    }
}

/// Group the daemon's (process, image, offset) rows by function.
pub fn snapshot(t: &TopResult, syms: &mut Symbols, limit: usize) -> Snapshot {
    let mut rows: HashMap<(u32, String, String, Option<String>), u64> = HashMap::new();
    for r in &t.rows {
        let symbol = syms.symbol(r);
        let key = (
            r.pid,
            escape_controls(&r.command).into_owned(),
            escape_controls(&r.image).into_owned(),
            symbol,
        );
        *rows.entry(key).or_insert(0) += r.samples;
    }
    let mut rows: Vec<Row> = rows
        .into_iter()
        .map(|((pid, command, image, symbol), samples)| Row {
            command,
            pid,
            image,
            symbol,
            samples,
        })
        .collect();
    rows.sort_by(|a, b| {
        b.samples.cmp(&a.samples).then_with(|| (a.pid, &a.image).cmp(&(b.pid, &b.image)))
    });
    rows.truncate(limit);
    Snapshot { window_ms: t.window_ms, samples: t.samples, rows }
}

/// Render a snapshot as a table. Names are escaped for the terminal here (the snapshot, which
/// `--json` prints, has only their control characters escaped): a bidi override in a command
/// name must not reorder the row.
pub fn render(s: &Snapshot) -> String {
    let mut out = format!(
        "dcpi top: last {:.0} s, {} samples (hottest first)\n{:>7}  {:>6}  {:>7}  {:<16}  {:<24}  {}\n",
        s.window_ms as f64 / 1000.0,
        s.samples,
        "samples",
        "%",
        "pid",
        "command",
        "symbol",
        "image"
    );
    for r in &s.rows {
        let pct = if s.samples > 0 { r.samples as f64 * 100.0 / s.samples as f64 } else { 0.0 };
        out.push_str(&format!(
            "{:>7}  {:>6.2}  {:>7}  {:<16}  {:<24}  {}\n",
            r.samples,
            pct,
            r.pid,
            terminal(&r.command),
            terminal(r.symbol.as_deref().unwrap_or("-")),
            terminal(&r.image)
        ));
    }
    out
}

/// One request and its snapshot.
pub fn fetch(socket: &Path, syms: &mut Symbols, limit: usize) -> Result<Snapshot, CtlError> {
    let v = request_value(socket, Request::Top, Duration::from_secs(15))?;
    let t: TopResult = parse_result(socket, Request::Top, v)?;
    Ok(snapshot(&t, syms, limit))
}

/// `dcpictl top`: with `once` (or when stdout is not a terminal) one snapshot; otherwise
/// redraw every `interval` until interrupted.
pub fn run(
    socket: &Path,
    once: bool,
    json: bool,
    limit: usize,
    interval: Duration,
) -> Result<(), CtlError> {
    use std::io::IsTerminal;
    let mut syms = Symbols::default();
    let mut stdout = std::io::stdout().lock();
    let io = |source| CtlError::Io { socket: socket.to_path_buf(), what: "writing output", source };
    if once || json || !stdout.is_terminal() {
        let s = fetch(socket, &mut syms, limit)?;
        let text = if json {
            serde_json::to_string_pretty(&s).unwrap_or_default() + "\n"
        } else {
            render(&s)
        };
        return stdout.write_all(text.as_bytes()).map_err(io);
    }
    let rows = terminal_rows().saturating_sub(3).max(5);
    loop {
        let s = fetch(socket, &mut syms, limit.min(rows))?;
        // Home, clear screen: a terminal only (checked above).
        write!(stdout, "\x1b[H\x1b[2J{}", render(&s)).map_err(io)?;
        stdout.flush().map_err(io)?;
        std::thread::sleep(interval);
    }
}

fn terminal_rows() -> usize {
    std::env::var("LINES").ok().and_then(|l| l.parse().ok()).unwrap_or(24)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Command and image names with controls, bidi overrides and isolates, line separators and
    /// a spreadsheet formula: the table shows them escaped, the JSON snapshot keeps the format
    /// characters exact (JSON's own escaping makes it valid).
    #[test]
    fn hostile_names_are_escaped_in_the_table_and_exact_in_json() {
        let names = [
            "=HYPERLINK(\"x\")",
            "rlo\u{202e}gnp.exe",
            "lri\u{2066}x\u{2069}",
            "ls\u{2028}ps\u{2029}",
            "esc\u{1b}[2J",
            "zw\u{200b}\u{feff}",
        ];
        let rows = names
            .iter()
            .enumerate()
            .map(|(i, n)| dcpi_proto::TopRow {
                command: (*n).into(),
                pid: 100 + i as u32,
                image: format!("/opt/{n}"),
                build_id: None,
                offset: None,
                samples: 10 + i as u64,
            })
            .collect();
        let t = TopResult { window_ms: 5000, samples: 100, rows };
        let s = snapshot(&t, &mut Symbols::default(), 50);
        let text = render(&s);
        let raw: Vec<char> = text
            .chars()
            .filter(|&c| c != '\n' && dcpi_report::escape::is_unsafe_for_terminal(c))
            .collect();
        assert!(raw.is_empty(), "raw {raw:?} in {text}");
        for want in [
            "rlo\\u{202e}gnp.exe",
            "lri\\u{2066}x\\u{2069}",
            "ls\\u{2028}ps\\u{2029}",
            "esc\\u{1b}[2J",
        ] {
            assert!(text.contains(want), "{want} not in {text}");
        }
        assert!(text.contains("=HYPERLINK(\"x\")"), "{text}");
        let json = serde_json::to_value(&s).expect("json");
        let commands: Vec<&str> = json["rows"]
            .as_array()
            .expect("rows")
            .iter()
            .filter_map(|r| r["command"].as_str())
            .collect();
        for n in [
            "=HYPERLINK(\"x\")",
            "rlo\u{202e}gnp.exe",
            "lri\u{2066}x\u{2069}",
            "ls\u{2028}ps\u{2029}",
        ] {
            assert!(commands.contains(&n), "{n:?} not exact in {commands:?}");
        }
    }
}
