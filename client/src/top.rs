//! `dcpictl top`: the hottest functions, commands, processes or images of the last few
//! seconds, from the daemon's memory (`Request::Top`), named here by the one symbolizer
//! (binaries checked by build-id, the kernel from this machine's `/proc/kallsyms`).
//!
//! As `perf top`: rows are functions by default, merged over every process that ran them (a
//! function spread over four backends of a server is one row); kernel functions are named; code
//! without a symbol is shown by its page (`image+0xOFFSET`). `--by` groups by command, process
//! or image instead, `--command`/`--image` zoom into one, `--event` picks the event to rank
//! by, `--no-idle` leaves the idle task out of the rows (the header still says how idle the
//! machine was, as top(1)'s %idle). On a terminal, keys change all of these while it runs.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::mpsc;
use std::time::Duration;

use dcpi_proto::{Request, TopResult, TopRow};
use profile_format::{ImageId, KallsymsSnapshot};
use serde::Serialize;

use crate::ctl::{parse_result, request_value, CtlError};
use dcpi_report::debuginfo::file_identity;
use dcpi_report::escape;
use dcpi_report::escape::controls as escape_controls;
use dcpi_report::names::display_name;
use dcpi_report::render;
use dcpi_report::render::{Column, Kind, Output, Style, Table};
use dcpi_report::report::ElfState;
use dcpi_report::symbolize::{ElfSymbolizer, SymbolTable};
use dcpi_report::symbolizer::{unsymbolized, Kallsyms, Source};

/// What the rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum By {
    /// Functions (image and symbol), over every process.
    Symbol,
    /// Commands (every process of one name together).
    Command,
    /// Processes.
    Pid,
    /// Images (executables, libraries, the kernel).
    Image,
}

impl By {
    fn name(self) -> &'static str {
        match self {
            Self::Symbol => "symbol",
            Self::Command => "command",
            Self::Pid => "pid",
            Self::Image => "image",
        }
    }
}

/// What to show: the grouping, the zoom, the event, the idle task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct View {
    pub by: By,
    /// Only this command's samples (its comm, exactly).
    pub command: Option<String>,
    /// Only this image's samples (its path, or its file name).
    pub image: Option<String>,
    /// The event to rank by (its name); `None`: the first event.
    pub event: Option<String>,
    /// Leave the idle task out of the rows.
    pub no_idle: bool,
    pub limit: usize,
}

impl Default for View {
    fn default() -> Self {
        Self { by: By::Symbol, command: None, image: None, event: None, no_idle: false, limit: 40 }
    }
}

/// One row as `dcpictl top` shows it. Fields that the grouping does not determine are null.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Row {
    /// `--by symbol`: the function (`image+0xPAGE` without a symbol, `[idle]` for the idle
    /// task); null otherwise.
    pub symbol: Option<String>,
    /// The image's path (`--by symbol`, `--by image`).
    pub image: Option<String>,
    /// The command (`--by command`, `--by pid`; `--by symbol`: the command with the most
    /// samples in the row, null for kernel functions, which the daemon does not keep apart
    /// per process).
    pub command: Option<String>,
    /// How many commands ran the row's code (`--by symbol`, `--by image`).
    pub commands: Option<usize>,
    pub pid: Option<u32>,
    pub samples: u64,
    /// Of every sample of the event in the window, idle included.
    pub percent: f64,
}

/// A snapshot: the window's totals and its rows, hottest first.
#[derive(Clone, Debug, Serialize)]
pub struct Snapshot {
    pub window_ms: u64,
    pub event: String,
    pub events: Vec<String>,
    pub by: By,
    pub zoom_command: Option<String>,
    pub zoom_image: Option<String>,
    /// Every sample of the event in the window.
    pub samples: u64,
    /// The idle task's samples of the window, and their share.
    pub idle_samples: u64,
    pub idle_percent: f64,
    pub rows: Vec<Row>,
    /// What the view could not do (e.g. kernel functions are not kept per command).
    pub notes: Vec<String>,
}

/// Symbol sources, loaded once per image for the life of `dcpictl top`, named by the one
/// symbolizer as every report names them.
#[derive(Default, Debug)]
pub struct Symbols {
    elf: HashMap<(String, Option<String>), Option<Source>>,
    /// This machine's kernel symbols (`/proc/kallsyms`), read once on the first kernel row.
    kernel: Option<Option<Rc<KallsymsSnapshot>>>,
    modules: HashMap<String, Source>,
    core: Option<Source>,
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

    /// The live kernel's symbols: `/proc/kallsyms` as root shows it (without addresses, as
    /// `kptr_restrict` may hide them, the snapshot is empty and kernel rows are pages).
    fn kallsyms(&mut self) -> Option<Rc<KallsymsSnapshot>> {
        self.kernel
            .get_or_insert_with(|| {
                let text = std::fs::read_to_string("/proc/kallsyms").ok()?;
                let modules = std::fs::read_to_string("/proc/modules").unwrap_or_default();
                let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")
                    .unwrap_or_default()
                    .trim()
                    .to_owned();
                KallsymsSnapshot::from_proc_text(&text, &modules, release, None, &|_| None)
                    .ok()
                    .map(Rc::new)
            })
            .clone()
    }

    fn kernel_source(&mut self, module: Option<&str>) -> Option<&Source> {
        let snap = self.kallsyms();
        // The snapshot is of the running kernel, which the daemon samples: no build-id check.
        let id = ImageId::special("[kernel.kallsyms]", b"live");
        let make = |m: Option<&str>| {
            Source::Kernel(Kallsyms::new(
                snap.clone(),
                m,
                &id,
                "[kernel]",
                Path::new("/proc"),
                &mut |_| {},
            ))
        };
        match module {
            None => Some(self.core.get_or_insert_with(|| make(None))),
            Some(m) => Some(self.modules.entry(m.to_owned()).or_insert_with(|| make(Some(m)))),
        }
    }

    /// The row's function, or its page when no symbol covers it.
    fn name(&mut self, r: &TopRow) -> String {
        let label = short(&r.image);
        let Some(offset) = r.offset else { return escape_controls(&r.image).into_owned() };
        let f = match r.kind.as_str() {
            "elf" | "" => self
                .elf
                .entry((r.image.clone(), r.build_id.clone()))
                .or_insert_with(|| Self::load(&r.image, r.build_id.as_deref(), r.pid))
                .as_ref()
                .and_then(|s| s.function(offset).map(|f| display_name(f.raw, false))),
            "kernel" => self
                .kernel_source(None)
                .and_then(|s| s.function(offset).map(|f| display_name(f.raw, false))),
            "module" => self
                .kernel_source(Some(&r.image))
                .and_then(|s| s.function(offset).map(|f| display_name(f.raw, false))),
            _ => None,
        };
        f.unwrap_or_else(|| unsymbolized(&escape_controls(label), offset))
    }
}

/// The file name of an image path (`[kernel.kallsyms]` as it is).
fn short(image: &str) -> &str {
    if image.starts_with('[') {
        image
    } else {
        image.rsplit('/').next().unwrap_or(image)
    }
}

fn image_matches(image: &str, want: &str) -> bool {
    image == want || short(image) == want
}

/// Accumulates one output row.
#[derive(Default)]
struct Acc {
    samples: u64,
    /// Samples per command, for the row's hottest command and count.
    commands: HashMap<String, u64>,
    pid: Option<u32>,
    image: Option<String>,
    command: Option<String>,
    symbol: Option<String>,
}

/// Group the daemon's rows as `view` asks.
pub fn snapshot(t: &TopResult, syms: &mut Symbols, view: &View) -> Result<Snapshot, CtlError> {
    let events: Vec<String> =
        if t.events.is_empty() { vec!["(first event)".into()] } else { t.events.clone() };
    let ev = match &view.event {
        None => 0,
        Some(e) => t.events.iter().position(|n| n == e).ok_or_else(|| {
            CtlError::Usage(format!(
                "--event {e}: dcpid does not sample it (it samples {})",
                events.join(", ")
            ))
        })?,
    };
    let total = t.totals.get(ev).copied().unwrap_or(if ev == 0 { t.samples } else { 0 });
    let idle = t.idle.get(ev).copied().unwrap_or(0);
    let mut notes = Vec::new();
    let mut acc: HashMap<String, Acc> = HashMap::new();
    let mut add = |key: String, samples: u64, command: Option<&str>, fill: &dyn Fn(&mut Acc)| {
        let a = acc.entry(key).or_default();
        if a.samples == 0 {
            fill(a);
        }
        a.samples += samples;
        if let Some(c) = command {
            *a.commands.entry(c.to_owned()).or_insert(0) += samples;
        }
    };
    let is_idle = |r: &TopRow| r.kind == "idle" || (r.offset.is_none() && r.pid == 0);
    let zoomed_out = |command: &str, image: &str| {
        view.command.as_deref().is_some_and(|c| c != command)
            || view.image.as_deref().is_some_and(|i| !image_matches(image, i))
    };
    let code = t.rows.iter().filter(|r| r.event as usize == ev);
    match view.by {
        By::Symbol | By::Image => {
            for r in code {
                let kernel_code = r.command.is_empty() && !is_idle(r);
                if view.no_idle && is_idle(r) {
                    continue;
                }
                if kernel_code {
                    // Kernel code is kept over every process together: it cannot be zoomed
                    // into one command (its per-command total is added below instead).
                    if view.command.is_some()
                        || view.image.as_deref().is_some_and(|i| !image_matches(&r.image, i))
                    {
                        continue;
                    }
                } else if zoomed_out(&r.command, &r.image) {
                    continue;
                }
                let (key, symbol) = if view.by == By::Symbol {
                    let name = if is_idle(r) { "[idle]".to_owned() } else { syms.name(r) };
                    (format!("{}\0{}", r.image, name), Some(name))
                } else {
                    (r.image.clone(), None)
                };
                let image = r.image.clone();
                let cmd = (!kernel_code).then_some(r.command.as_str());
                add(key, r.samples, cmd, &|a| {
                    a.image = Some(image.clone());
                    a.symbol = symbol.clone();
                });
            }
            if let Some(c) = &view.command {
                let kernel: u64 = t
                    .processes
                    .iter()
                    .filter(|p| p.event as usize == ev && &p.command == c)
                    .filter(|p| p.image == "[kernel.kallsyms]")
                    .map(|p| p.samples)
                    .sum();
                if kernel > 0 && view.image.as_deref().is_none_or(|i| i == "[kernel.kallsyms]") {
                    let sym = (view.by == By::Symbol).then(|| "[kernel, all functions]".to_owned());
                    let key = format!("[kernel.kallsyms]\0{}", sym.clone().unwrap_or_default());
                    add(key, kernel, Some(c), &|a| {
                        a.image = Some("[kernel.kallsyms]".into());
                        a.symbol = sym.clone();
                    });
                    notes.push(
                        "kernel functions are not kept per command: one kernel row for the command"
                            .into(),
                    );
                }
            }
        }
        By::Command | By::Pid => {
            for p in t.processes.iter().filter(|p| p.event as usize == ev) {
                if zoomed_out(&p.command, &p.image) {
                    continue;
                }
                let key = match view.by {
                    By::Pid => p.pid.to_string(),
                    _ => p.command.clone(),
                };
                let (pid, command) = (p.pid, p.command.clone());
                let by = view.by;
                add(key, p.samples, Some(&p.command), &|a| {
                    a.command = Some(command.clone());
                    a.pid = (by == By::Pid).then_some(pid);
                });
            }
            if !view.no_idle && idle > 0 && view.command.as_deref().is_none_or(|c| c == "swapper") {
                let by = view.by;
                add("[idle]".into(), idle, Some("swapper"), &|a| {
                    a.command = Some("swapper".into());
                    a.pid = (by == By::Pid).then_some(0);
                });
            }
        }
    }
    let pct = |n: u64| if total > 0 { n as f64 * 100.0 / total as f64 } else { 0.0 };
    let mut rows: Vec<Row> = acc
        .into_values()
        .map(|a| {
            let hottest = a
                .commands
                .iter()
                .max_by(|x, y| x.1.cmp(y.1).then_with(|| y.0.cmp(x.0)))
                .map(|(c, _)| c.clone());
            let (symbol, command, commands) = match view.by {
                By::Symbol => (a.symbol, hottest, Some(a.commands.len())),
                By::Image => (None, hottest, Some(a.commands.len())),
                By::Command | By::Pid => (None, a.command, None),
            };
            Row {
                symbol,
                image: a.image.map(|i| escape_controls(&i).into_owned()),
                command: command.map(|c| escape_controls(&c).into_owned()),
                commands,
                pid: a.pid,
                samples: a.samples,
                percent: pct(a.samples),
            }
        })
        .collect();
    rows.sort_by(|a, b| {
        b.samples
            .cmp(&a.samples)
            .then_with(|| (&a.symbol, &a.image, &a.command).cmp(&(&b.symbol, &b.image, &b.command)))
    });
    rows.truncate(view.limit);
    Ok(Snapshot {
        window_ms: t.window_ms,
        event: events.get(ev).cloned().unwrap_or_default(),
        events,
        by: view.by,
        zoom_command: view.command.clone(),
        zoom_image: view.image.clone(),
        samples: total,
        idle_samples: idle,
        idle_percent: pct(idle),
        rows,
        notes,
    })
}

/// Cut `s` to `width` terminal columns in the middle (`abc…xyz`), so that the live view's
/// columns keep their widths from one refresh to the next.
fn cut(s: &str, width: usize) -> String {
    use dcpi_report::render::display_width;
    if display_width(s) <= width || width < 3 {
        return s.to_owned();
    }
    let chars: Vec<char> = s.chars().collect();
    let keep = width - 1;
    let (head, tail) = (keep / 2, keep - keep / 2);
    let mut out: String = chars[..head].iter().collect();
    out.push('…');
    out.extend(&chars[chars.len() - tail..]);
    // Wide characters may still overflow: drop from the head until it fits.
    while display_width(&out) > width && out.chars().count() > 2 {
        out.remove(0);
    }
    out
}

/// The snapshot's table (one description for text, CSV and JSON). `fixed`: column widths that
/// stay put between refreshes (names cut in the middle), for the live view.
pub fn table(s: &Snapshot, fixed: bool) -> Table {
    let mut t = Table::new();
    let name_w = |w: usize| if fixed { w } else { 0 };
    let fit = |v: &Option<String>, w: usize| -> Option<String> {
        v.as_ref().map(|x| if fixed { cut(&escape::terminal(x), w) } else { x.clone() })
    };
    t.column(Column::new("samples", Kind::Count).right().min_width(name_w(8)).csv("samples"));
    t.column(Column::new("%", Kind::Decimal(2)).right().min_width(name_w(6)).csv("percent"));
    let mut cells_of: Vec<Box<dyn Fn(&Row) -> render::Cell>> = Vec::new();
    match s.by {
        By::Symbol => {
            t.column(Column::new("command", Kind::Text).min_width(name_w(16)).csv("command"));
            t.column(Column::new("image", Kind::Text).min_width(name_w(20)).csv("image"));
            t.column(Column::new("symbol", Kind::Text).csv("symbol"));
            cells_of.push(Box::new(move |r| {
                let c = match (&r.command, r.commands) {
                    (Some(c), Some(n)) if n > 1 => Some(format!("{c} +{}", n - 1)),
                    (c, _) => c.clone(),
                };
                fit(&c, 16).unwrap_or_else(|| "-".into()).into()
            }));
            cells_of.push(Box::new(move |r| {
                fit(&r.image.as_deref().map(|i| short(i).to_owned()), 20).into()
            }));
            cells_of.push(Box::new(|r| r.symbol.clone().into()));
        }
        By::Image => {
            t.column(
                Column::new("commands", Kind::Count).right().min_width(name_w(8)).csv("commands"),
            );
            t.column(Column::new("image", Kind::Text).csv("image"));
            cells_of.push(Box::new(|r| r.commands.map(|n| n as u64).into()));
            cells_of.push(Box::new(|r| r.image.clone().into()));
        }
        By::Pid => {
            t.column(Column::new("pid", Kind::Count).right().min_width(name_w(7)).csv("pid"));
            t.column(Column::new("command", Kind::Text).csv("command"));
            cells_of.push(Box::new(|r| r.pid.map(u64::from).into()));
            cells_of.push(Box::new(|r| r.command.clone().into()));
        }
        By::Command => {
            t.column(Column::new("command", Kind::Text).csv("command"));
            cells_of.push(Box::new(|r| r.command.clone().into()));
        }
    }
    let zoom = [
        s.zoom_command.as_ref().map(|c| format!("command {c}")),
        s.zoom_image.as_ref().map(|i| format!("image {i}")),
    ]
    .into_iter()
    .flatten()
    .collect::<Vec<_>>();
    t.head(
        escape::terminal(&format!(
            "dcpi top: last {:.0} s, {} {} samples, idle {:.1}%, by {}{}",
            s.window_ms as f64 / 1000.0,
            s.samples,
            s.event,
            s.idle_percent,
            s.by.name(),
            if zoom.is_empty() { String::new() } else { format!(", zoom: {}", zoom.join(", ")) }
        ))
        .into_owned(),
    );
    for r in &s.rows {
        let mut cells = vec![r.samples.into(), r.percent.into()];
        cells.extend(cells_of.iter().map(|f| f(r)));
        t.row(cells);
    }
    for n in &s.notes {
        t.foot(format!("# {n}"));
    }
    t
}

/// How `dcpictl top` prints a snapshot.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    Table,
    Csv,
    Json,
}

fn write(out: &mut dyn Write, s: &Snapshot, format: Format, fixed: bool) -> std::io::Result<()> {
    let form = match format {
        Format::Table => Output::Text,
        Format::Csv => Output::Csv,
        Format::Json => Output::Json,
    };
    table(s, fixed).write(out, form, Style { human: fixed, ..Style::default() }, s)
}

/// One request and its snapshot.
pub fn fetch(socket: &Path, syms: &mut Symbols, view: &View) -> Result<Snapshot, CtlError> {
    let v = request_value(socket, Request::Top, Duration::from_secs(15))?;
    let t: TopResult = parse_result(socket, Request::Top, v)?;
    snapshot(&t, syms, view)
}

/// The terminal in "a key at a time, no echo" mode while the live view runs, restored on drop.
/// Through stty(1) on /dev/tty (no FFI here); without it the view runs without keys.
struct RawTerminal {
    saved: String,
}

impl RawTerminal {
    fn stty(args: &[&str]) -> Option<String> {
        let tty = std::fs::File::open("/dev/tty").ok()?;
        let out = std::process::Command::new("stty").args(args).stdin(tty).output().ok()?;
        out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_owned())
    }

    fn enter() -> Option<Self> {
        let saved = Self::stty(&["-g"])?;
        // -isig: Ctrl-C arrives as a key, so that the terminal is restored before exiting.
        Self::stty(&["-icanon", "-echo", "-isig", "min", "1"])?;
        Some(Self { saved })
    }
}

impl Drop for RawTerminal {
    fn drop(&mut self) {
        Self::stty(&[self.saved.as_str()]);
    }
}

/// What a key does to the view; `None`: quit.
fn apply_key(view: &mut View, key: u8, s: &Snapshot) -> Option<()> {
    match key {
        b'q' | 3 | 4 => return None,
        b's' => view.by = By::Symbol,
        b'c' => view.by = By::Command,
        b'p' => view.by = By::Pid,
        b'i' => view.by = By::Image,
        b'n' => view.no_idle = !view.no_idle,
        b'e' if s.events.len() > 1 => {
            let i = s.events.iter().position(|e| *e == s.event).unwrap_or(0);
            view.event = Some(s.events[(i + 1) % s.events.len()].clone());
        }
        // Zoom into the top row: its command (by command/pid), else its image.
        b'z' => {
            if let Some(r) = s.rows.iter().find(|r| r.symbol.as_deref() != Some("[idle]")) {
                match s.by {
                    By::Command | By::Pid => view.command = r.command.clone(),
                    By::Symbol | By::Image => view.image = r.image.clone(),
                }
            }
        }
        b'u' => {
            view.command = None;
            view.image = None;
        }
        _ => {}
    }
    Some(())
}

const KEYS: &str = "keys: s symbol  c command  p pid  i image  z zoom into the top row  u unzoom  e next event  n idle on/off  q quit";

/// `dcpictl top`: with `once` (or when stdout is not a terminal, or a machine format) one
/// snapshot; otherwise redraw every `interval` until `q`, taking keys meanwhile.
pub fn run(
    socket: &Path,
    once: bool,
    format: Format,
    mut view: View,
    interval: Duration,
) -> Result<(), CtlError> {
    use std::io::IsTerminal;
    let mut syms = Symbols::default();
    let mut stdout = std::io::stdout().lock();
    let io = |source| CtlError::Io { socket: socket.to_path_buf(), what: "writing output", source };
    if once || format != Format::Table || !stdout.is_terminal() {
        let s = fetch(socket, &mut syms, &view)?;
        return write(&mut stdout, &s, format, false).map_err(io);
    }
    let raw = RawTerminal::enter();
    let (tx, keys) = mpsc::channel();
    if raw.is_some() {
        std::thread::spawn(move || {
            let mut stdin = std::io::stdin();
            let mut b = [0u8; 1];
            while stdin.read(&mut b).is_ok_and(|n| n == 1) {
                if tx.send(b[0]).is_err() {
                    break;
                }
            }
        });
    }
    let rows = terminal_rows().saturating_sub(5).max(5);
    loop {
        let mut v = view.clone();
        v.limit = view.limit.min(rows);
        let s = fetch(socket, &mut syms, &v)?;
        let mut buf = Vec::new();
        // Home, clear screen: a terminal only (checked above).
        buf.extend_from_slice(b"\x1b[H\x1b[2J");
        write(&mut buf, &s, Format::Table, true).map_err(io)?;
        if raw.is_some() {
            buf.extend_from_slice(KEYS.as_bytes());
        }
        stdout.write_all(&buf).map_err(io)?;
        stdout.flush().map_err(io)?;
        match keys.recv_timeout(interval) {
            Ok(k) => {
                if apply_key(&mut view, k, &s).is_none() {
                    writeln!(stdout).map_err(io)?;
                    return Ok(());
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout | mpsc::RecvTimeoutError::Disconnected) => {}
        }
    }
}

fn terminal_rows() -> usize {
    std::env::var("LINES").ok().and_then(|l| l.parse().ok()).unwrap_or(24)
}

#[cfg(test)]
mod tests {
    use super::*;
    use dcpi_report::escape;
    use dcpi_report::render;

    fn row(command: &str, pid: u32, image: &str, kind: &str, off: Option<u64>, n: u64) -> TopRow {
        TopRow {
            command: command.into(),
            pid,
            image: image.into(),
            kind: kind.into(),
            build_id: None,
            offset: off,
            event: 0,
            samples: n,
        }
    }

    fn result(rows: Vec<TopRow>, processes: Vec<dcpi_proto::TopProcess>) -> TopResult {
        TopResult {
            window_ms: 5000,
            samples: 100,
            rows,
            events: vec!["cpu-clock".into()],
            totals: vec![100],
            idle: vec![30],
            processes,
        }
    }

    fn proc(pid: u32, command: &str, image: &str, n: u64) -> dcpi_proto::TopProcess {
        dcpi_proto::TopProcess {
            pid,
            command: command.into(),
            image: image.into(),
            event: 0,
            samples: n,
        }
    }

    /// Rows of one function from two commands merge; pages name unsymbolized code; the idle
    /// row goes with --no-idle while the header keeps its share.
    #[test]
    fn rows_merge_by_symbol_over_commands_and_idle_can_go() {
        let t = result(
            vec![
                row("swapper", 0, "[idle]", "idle", None, 30),
                row("pg", 1, "/nonexistent/pg", "elf", Some(0x1010), 20),
                row("pg2", 2, "/nonexistent/pg", "elf", Some(0x1020), 25),
                row("other", 3, "/nonexistent/x", "elf", Some(0x5000), 10),
            ],
            vec![],
        );
        let s = snapshot(&t, &mut Symbols::default(), &View::default()).expect("snapshot");
        assert_eq!(s.rows[0].symbol.as_deref(), Some("pg+0x1000"), "{:?}", s.rows);
        assert_eq!(s.rows[0].samples, 45);
        assert_eq!(s.rows[0].commands, Some(2));
        assert_eq!(s.rows[0].command.as_deref(), Some("pg2"));
        assert_eq!(s.rows[1].symbol.as_deref(), Some("[idle]"));
        let v = View { no_idle: true, ..View::default() };
        let s = snapshot(&t, &mut Symbols::default(), &v).expect("snapshot");
        assert!(s.rows.iter().all(|r| r.symbol.as_deref() != Some("[idle]")), "{:?}", s.rows);
        assert!((s.idle_percent - 30.0).abs() < 1e-9);
        let text = {
            let mut b = Vec::new();
            write(&mut b, &s, Format::Table, false).expect("write");
            String::from_utf8(b).expect("utf8")
        };
        assert!(
            text.starts_with("dcpi top: last 5 s, 100 cpu-clock samples, idle 30.0%, by symbol"),
            "{text}"
        );
    }

    /// --by command and --by pid add each process's samples over its images; a zoom keeps one
    /// command; an unknown event is an error naming the flag.
    #[test]
    fn groupings_zoom_and_event() {
        let t = result(
            vec![
                row("pg", 1, "/nonexistent/pg", "elf", Some(0x1010), 20),
                row("", 0, "[kernel.kallsyms]", "kernel", Some(0x10), 9),
            ],
            vec![
                proc(1, "pg", "/nonexistent/pg", 12),
                proc(2, "pg", "/nonexistent/pg", 8),
                proc(1, "pg", "[kernel.kallsyms]", 5),
                proc(3, "sh", "/bin/sh", 4),
            ],
        );
        let s = snapshot(&t, &mut Symbols::default(), &View { by: By::Command, ..View::default() })
            .expect("snapshot");
        let got: Vec<_> = s.rows.iter().map(|r| (r.command.as_deref(), r.samples)).collect();
        assert_eq!(got, [(Some("swapper"), 30), (Some("pg"), 25), (Some("sh"), 4)]);
        let s = snapshot(
            &t,
            &mut Symbols::default(),
            &View { by: By::Pid, no_idle: true, ..View::default() },
        )
        .expect("snapshot");
        let got: Vec<_> = s.rows.iter().map(|r| (r.pid, r.samples)).collect();
        assert_eq!(got, [(Some(1), 17), (Some(2), 8), (Some(3), 4)]);
        let zoom = View { command: Some("pg".into()), ..View::default() };
        let s = snapshot(&t, &mut Symbols::default(), &zoom).expect("snapshot");
        let got: Vec<_> = s.rows.iter().map(|r| (r.symbol.as_deref(), r.samples)).collect();
        assert_eq!(got, [(Some("pg+0x1000"), 20), (Some("[kernel, all functions]"), 5)], "{s:?}");
        let e = snapshot(
            &t,
            &mut Symbols::default(),
            &View { event: Some("cycles".into()), ..View::default() },
        )
        .expect_err("unknown event");
        assert!(
            e.to_string().contains("--event cycles") && e.to_string().contains("cpu-clock"),
            "{e}"
        );
    }

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
        let processes = names
            .iter()
            .enumerate()
            .map(|(i, n)| proc(100 + i as u32, n, &format!("/opt/{n}"), 10 + i as u64))
            .collect();
        let t = result(vec![], processes);
        for fixed in [false, true] {
            let s = snapshot(&t, &mut Symbols::default(), &View { by: By::Pid, ..View::default() })
                .expect("snapshot");
            let mut b = Vec::new();
            write(&mut b, &s, Format::Table, fixed).expect("write");
            let text = String::from_utf8(b).expect("utf8");
            let raw: Vec<char> =
                text.chars().filter(|&c| c != '\n' && escape::is_unsafe_for_terminal(c)).collect();
            assert!(raw.is_empty(), "raw {raw:?} in {text}");
            for want in ["rlo\\u{202e}gnp.exe", "lri\\u{2066}x\\u{2069}", "esc\\u{1b}[2J"] {
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
            for n in ["=HYPERLINK(\"x\")", "rlo\u{202e}gnp.exe", "lri\u{2066}x\u{2069}"] {
                assert!(commands.contains(&n), "{n:?} not in {commands:?}");
            }
        }
    }

    /// The live view's columns keep their widths whatever the names: a long command is cut
    /// in the middle to the column.
    #[test]
    fn live_view_columns_are_stable() {
        let mk = |command: &str| {
            result(
                vec![row(
                    command,
                    1,
                    "/nonexistent/a-very-long-library-name.so.6",
                    "elf",
                    Some(0x10),
                    50,
                )],
                vec![],
            )
        };
        let line = |t: &TopResult| {
            let s =
                snapshot(t, &mut Symbols::default(), &View { no_idle: true, ..View::default() })
                    .expect("snapshot");
            let mut b = Vec::new();
            write(&mut b, &s, Format::Table, true).expect("write");
            let text = String::from_utf8(b).expect("utf8");
            let row = text.lines().nth(2).expect("a row").to_owned();
            let at = row.find("0x0").expect("symbol page");
            render::display_width(&row[..at])
        };
        assert_eq!(line(&mk("sh")), line(&mk("kworker/1:1H-kblockd-and-more")));
        assert_eq!(cut("kworker/1:1H-kblockd", 10), "kwor…lockd");
    }
}
