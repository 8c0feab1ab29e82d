//! `dcpiprof --by command|pid|cgroup|unit|container|cpu` and the filters `--command`,
//! `--cgroup`, `--pid`, `--cpu`: reports from the who tables (FORMAT.md §12) of the selected
//! host directories. With a filter, `--by image|host|epoch` read them too.

use std::collections::BTreeMap;
use std::io::Write;

use profile_format::{ThreadKey, WhoKey, WhoTable};
use serde_json::{json, Map, Value};

use super::by::By;
use super::output::r4;
use dcpi_report::error::ProfError;
use dcpi_report::image::{display_path, IDLE};
use dcpi_report::render::{Column, Kind, Output, Style};
use dcpi_report::select;

use super::output::TableFormat;
use crate::args::Selection;
use dcpi_report::escape::{controls, terminal};
use dcpi_report::render;
use dcpi_report::render::CsvCell;
use dcpi_report::report;

/// The filters of the who tables.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WhoFilters {
    pub command: Option<String>,
    /// `--thread`: samples of the threads of that name only (thread rows, FORMAT.md §12 v2).
    pub thread: Option<String>,
    pub cgroup: Option<String>,
    pub pid: Option<u32>,
    pub cpu: Option<u32>,
    /// `--image`: rows of that image only.
    pub image: Option<String>,
}

/// A report from the who tables.
#[derive(Clone, Debug)]
pub struct Who {
    pub sel: Selection,
    pub by: WhoBy,
    pub filters: WhoFilters,
    /// `--threads`: the thread names under each command in text and CSV (JSON always).
    pub threads: bool,
    pub no_idle: bool,
    pub limit: Option<usize>,
    pub format: TableFormat,
}

/// The systemd unit of a cgroup path: its innermost `*.service` component, else its innermost
/// `*.scope` (sessions, containers started by a runtime), else none.
pub fn unit_of(cgroup: &str) -> Option<&str> {
    let comps = || cgroup.split('/').rev();
    comps().find(|c| c.ends_with(".service")).or_else(|| comps().find(|c| c.ends_with(".scope")))
}

/// A container id in a cgroup path: a run of 64 hex digits in one component
/// (`docker-<id>.scope`, `cri-containerd-<id>.scope`, `/docker/<id>`, `/kubepods/.../<id>`).
pub fn container_of(cgroup: &str) -> Option<&str> {
    for comp in cgroup.split('/').rev() {
        let b = comp.as_bytes();
        let mut i = 0;
        while i < b.len() {
            let run = b[i..].iter().take_while(|c| c.is_ascii_hexdigit()).count();
            if run == 64 {
                return Some(&comp[i..i + 64]);
            }
            i += run.max(1);
        }
    }
    None
}

/// Whether a who row's image is the one `--image` names: its path, its basename, or the
/// pseudo-image's name (`[kernel.kallsyms]`/`kernel`, `[idle]`/`idle`, `[unknown]`).
fn image_matches(spec: &str, image: &[u8]) -> bool {
    let bare = |s: &str| s.trim_start_matches('[').trim_end_matches(']').to_owned();
    let img = display_path(image);
    if img == spec || (spec.contains('/') && image == spec.as_bytes()) {
        return true;
    }
    let base = img.rsplit('/').next().unwrap_or(&img);
    if !spec.contains('/') && (base == spec || bare(&img) == bare(spec)) {
        return true;
    }
    // `anon`, `[anon]`, `anon:PID`, `[anon:PID`: JIT regions `[anon:PID:comm]`, as
    // `--image` selects them for the per-symbol report.
    let anon = spec.trim_start_matches('[').trim_end_matches(']');
    if (anon == "anon" || anon.starts_with("anon:")) && img.starts_with(&format!("[{anon}")) {
        return true;
    }
    matches!(spec, "kernel" | "vmlinux") && img == "[kernel.kallsyms]"
}

/// What a who report has a row per: a `--by` the who tables can answer, every one but `symbol`
/// and `time` (the who tables have neither symbols nor time slices). [`WhoBy::new`] checks
/// that once, so the variants are listed once, in [`By`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WhoBy(By);

impl WhoBy {
    /// `by`, if the who tables can answer it.
    pub fn new(by: By) -> Option<Self> {
        (!matches!(by, By::Symbol | By::Time)).then_some(Self(by))
    }

    pub fn by(self) -> By {
        self.0
    }

    /// The `--by` value; also the key of JSON rows.
    pub fn name(self) -> &'static str {
        self.0.name()
    }
}

impl PartialEq<By> for WhoBy {
    fn eq(&self, other: &By) -> bool {
        self.0 == *other
    }
}

fn key_of(by: WhoBy, k: &WhoKey, d: &profile_format::HostDir) -> Option<String> {
    Some(match by.by() {
        By::Command => display_path(&k.command),
        By::Pid => k.pid.to_string(),
        By::Cgroup => {
            if k.cgroup.is_empty() {
                "(unknown)".to_owned()
            } else {
                // The display form, as commands and paths have (JSON included).
                controls(&k.cgroup).into_owned()
            }
        }
        By::Unit => controls(unit_of(&k.cgroup).unwrap_or("(none)")).into_owned(),
        By::Container => container_of(&k.cgroup).unwrap_or("(none)").to_owned(),
        By::Image => display_path(&k.image),
        By::Host => d.host.clone(),
        By::Epoch => d.epoch.to_string(),
        // Never in a WhoBy: symbol and time.
        By::Cpu | By::Symbol | By::Time => return None,
    })
}

/// Run a report from the who tables (its flags checked by [`super::mode::Mode::from_args`]:
/// `--cpu` only with `--by cpu`, which takes no other filter).
pub fn run(who: &Who, out: &mut dyn Write, err: &mut dyn Write) -> Result<(), ProfError> {
    let (by, f) = (who.by, &who.filters);
    who.sel.no_time_axis("who tables (--by command/pid/cgroup/user/cpu, --command)")?;
    let db = select::open_db(&who.sel.db)?;
    let dirs = select::select_host_dirs(&db, &who.sel.epoch_sel(), &who.sel.host_sel())?;
    let mut tables: Vec<(usize, WhoTable)> = Vec::new();
    let mut missing = Vec::new();
    for (i, d) in dirs.iter().enumerate() {
        match WhoTable::read(&d.who_path()) {
            Ok(t) => tables.push((i, t)),
            Err(profile_format::Error::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                missing.push(format!("{}/{}", d.epoch, d.host));
            }
            Err(e) if who.sel.keep_going => writeln!(
                err,
                "dcpiprof: warning: skipping corrupt who table: {}",
                terminal(&e.to_string())
            )?,
            Err(e) => return Err(e.into()),
        }
    }
    if tables.is_empty() {
        return Err(ProfError::Empty(format!(
            "no who table (who.tbl) in the selected host directories ({}): it is written by \
             dcpid with the profiles' summary (run `dcpictl flush`), by versions since the \
             table exists",
            missing.join(", ")
        )));
    }
    if !missing.is_empty() {
        writeln!(err, "dcpiprof: warning: no who table in {}; left out", missing.join(", "))?;
    }
    // The event: --event's first, else the first any table has.
    let mut events: Vec<String> = Vec::new();
    for (_, t) in &tables {
        for k in t.rows.keys() {
            if !events.contains(&k.event) {
                events.push(k.event.clone());
            }
        }
        for (_, e) in t.cpus.keys() {
            if !events.contains(e) {
                events.push(e.clone());
            }
        }
    }
    let event = match who.sel.events.first() {
        Some(e) if events.contains(e) => e.clone(),
        Some(e) => {
            return Err(ProfError::UnknownEvent {
                event: e.clone(),
                available: events.join(", "),
                scope: "the who tables".into(),
            })
        }
        None => events.first().cloned().unwrap_or_else(|| "cpu-clock".into()),
    };
    let mut parts: BTreeMap<String, u64> = BTreeMap::new();
    let mut total = 0u64;
    let mut any_pid = false;
    // The second level of --by command: samples per (command, thread name) of the thread rows;
    // what a command has beyond them is its threads named as it is.
    let mut second: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    // --thread: per row key, the selected threads' samples (signed: a command's own-named
    // threads are its rows less its thread rows).
    let mut picked: BTreeMap<String, i128> = BTreeMap::new();
    for (di, t) in &tables {
        let d = &dirs[*di];
        if by == By::Cpu {
            for ((cpu, ev), &n) in &t.cpus {
                if *ev != event || f.cpu.is_some_and(|c| c != *cpu) {
                    continue;
                }
                *parts.entry(cpu.to_string()).or_default() += n;
                total += n;
            }
            continue;
        }
        for (k, &n) in &t.rows {
            if k.event != event || (who.no_idle && k.image == IDLE.as_bytes()) {
                continue;
            }
            any_pid |= k.pid != 0;
            if f.command.as_ref().is_some_and(|c| display_path(&k.command) != *c)
                || f.pid.is_some_and(|p| p != k.pid)
                || f.cgroup.as_ref().is_some_and(|c| !cgroup_matches(c, &k.cgroup))
                || f.image.as_ref().is_some_and(|i| !image_matches(i, &k.image))
            {
                continue;
            }
            let Some(key) = key_of(by, k, d) else { continue };
            match &f.thread {
                // The command's own-named threads are that thread name's.
                Some(name) if display_path(&k.command) == *name => {
                    *picked.entry(key).or_default() += i128::from(n);
                }
                Some(_) => {}
                None => {
                    *parts.entry(key).or_default() += n;
                    total += n;
                }
            }
        }
        for (tk, &n) in &t.threads {
            if tk.event != event
                || f.command.as_ref().is_some_and(|c| display_path(&tk.command) != *c)
                || f.pid.is_some_and(|p| p != tk.pid)
                || f.cgroup.as_ref().is_some_and(|c| !cgroup_matches(c, &tk.cgroup))
            {
                continue;
            }
            let command = display_path(&tk.command);
            let thread = display_path(&tk.thread);
            match &f.thread {
                Some(name) => {
                    let Some(key) = key_of(by, &row_of(tk), d) else { continue };
                    if command == *name {
                        *picked.entry(key.clone()).or_default() -= i128::from(n);
                    }
                    if thread == *name {
                        *picked.entry(key).or_default() += i128::from(n);
                    }
                }
                None if by == By::Command && f.image.is_none() => {
                    *second.entry(command).or_default().entry(thread).or_default() += n;
                }
                None => {}
            }
        }
    }
    for (key, n) in picked {
        // Never below 0: a table whose rows lost counts (a crash) keeps its thread rows.
        let n = u64::try_from(n.max(0)).unwrap_or(u64::MAX);
        if n > 0 {
            parts.insert(key, n);
            total += n;
        }
    }
    for (command, threads) in &mut second {
        let all = parts.get(command).copied().unwrap_or(0);
        let named: u64 = threads.values().sum();
        if all > named {
            *threads.entry(command.clone()).or_default() += all - named;
        }
    }
    if (by == By::Pid || f.pid.is_some()) && !any_pid {
        return Err(ProfError::Empty(
            "the who tables hold no per-process rows: start dcpid with `by_pid = true` (or \
             --by-pid true) to record them; --by command groups by command name meanwhile"
                .into(),
        ));
    }
    let mut rows: Vec<(String, u64)> = parts.into_iter().collect();
    if !matches!(by.by(), By::Epoch | By::Host | By::Cpu) {
        rows.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    }
    let omitted = match who.limit {
        Some(n) if n > 0 && rows.len() > n => {
            let o = rows.len() - n;
            rows.truncate(n);
            o
        }
        _ => 0,
    };
    let pct = |n: u64| if total > 0 { r4(n as f64 / total as f64 * 100.0) } else { 0.0 };
    let idle = if by == By::Cpu {
        "the idle task included"
    } else if who.no_idle {
        "the idle task ([idle]) left out"
    } else {
        "the idle task ([idle]) included"
    };
    let of = if report::time_weighted(&event) {
        format!("all {event} time selected ({idle})")
    } else {
        format!("all samples of {event} selected ({idle})")
    };
    let form = Output::from(who.format);
    // The JSON document (its schema in --help), made only when asked for.
    let v = if form == Output::Json {
        let rows: Vec<Value> = rows
            .iter()
            .map(|(k, n)| {
                let mut m = Map::new();
                match (by.by(), k.parse::<u64>()) {
                    (By::Pid | By::Cpu, Ok(v)) => m.insert(by.name().to_owned(), json!(v)),
                    _ => m.insert(by.name().to_owned(), json!(k)),
                };
                if by == By::Cgroup {
                    m.insert("unit".into(), json!(unit_of(k)));
                    m.insert("container".into(), json!(container_of(k)));
                }
                m.insert("samples".into(), json!(n));
                m.insert("percent".into(), json!(pct(*n)));
                if let Some(threads) = second.get(k) {
                    let rows: Vec<Value> = thread_rows(threads)
                        .into_iter()
                        .map(|(t, n)| json!({"thread": t, "samples": n, "percent": pct(n)}))
                        .collect();
                    m.insert("threads".into(), Value::Array(rows));
                }
                Value::Object(m)
            })
            .collect();
        json!({
            "report": "by",
            "by": by.name(),
            "source": "who",
            "database": who.sel.db.display().to_string(),
            "event": event,
            "filters": {
                "command": f.command, "thread": f.thread, "cgroup": f.cgroup, "pid": f.pid,
                "cpu": f.cpu, "image": f.image,
            },
            "idle_included": !who.no_idle || by == By::Cpu,
            "total_samples": total,
            "percent_of": of,
            "rows_omitted": omitted,
            "rows": rows,
        })
    } else {
        Value::Null
    };
    // A time-weighted event (off-CPU time): counts are nanoseconds, shown as seconds in text
    // (`time`), nanoseconds in CSV (`ns`) and JSON (`samples`).
    let timed = report::time_weighted(&event);
    let secs = report::seconds_text;
    let mut t = super::by::group_table(
        by.name(),
        [
            if timed {
                Column::new("time", Kind::Count).csv("ns").min_width(7)
            } else {
                Column::new("samples", Kind::Count).min_width(7)
            },
            Column::new("%", Kind::Decimal(2)).csv("percent").min_width(7),
        ],
        &who.sel.db,
    );
    let mut what = if timed {
        format!("# event {event}: {} (nanoseconds in CSV and JSON); % of {of}", secs(total))
    } else {
        format!("# event {event}: {total} samples; % of {of}")
    };
    for (name, v) in [
        ("command", f.command.clone()),
        ("thread", f.thread.clone()),
        ("cgroup", f.cgroup.clone()),
        ("pid", f.pid.map(|p| p.to_string())),
        ("cpu", f.cpu.map(|p| p.to_string())),
        ("image", f.image.clone()),
    ] {
        if let Some(v) = v {
            what.push_str(&format!("; {name} {v}"));
        }
    }
    t.head(terminal(&what));
    for (k, n) in &rows {
        let first = if timed {
            let csv = CsvCell::Number(n.to_string());
            render::Value::Both { text: secs(*n), csv }
        } else {
            (*n).into()
        };
        let key = if by == By::Image {
            render::Value::image(k.as_str(), None)
        } else {
            k.as_str().into()
        };
        t.row(vec![key.into(), first.into(), pct(*n).into()]);
        if !who.threads {
            continue;
        }
        for (thread, n) in second.get(k).map(thread_rows).unwrap_or_default() {
            let first = if timed {
                let csv = CsvCell::Number(n.to_string());
                render::Value::Both { text: secs(n), csv }
            } else {
                n.into()
            };
            let name = format!("{k}/{thread}");
            let name = render::Value::from(name.as_str());
            t.row(vec![name.into(), first.into(), pct(n).into()]);
        }
    }
    if omitted > 0 {
        t.foot(format!("# {omitted} more rows (--limit)"));
    }
    t.write(out, form, Style::default(), &v)?;
    out.flush()?;
    Ok(())
}

/// A thread row as a who row without image, for [`key_of`] (which reads no image but for
/// `--by image`, refused with thread rows).
fn row_of(t: &ThreadKey) -> WhoKey {
    WhoKey {
        cgroup: t.cgroup.clone(),
        command: t.command.clone(),
        pid: t.pid,
        image: Vec::new(),
        event: t.event.clone(),
    }
}

/// The thread names under one command, most samples first (then by name).
fn thread_rows(threads: &BTreeMap<String, u64>) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = threads.iter().map(|(t, &n)| (t.clone(), n)).collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v
}

/// `--cgroup`: a path (`/system.slice/x.service`) or a prefix of one at a component boundary,
/// or a unit name / container id prefix appearing as a component.
pub fn cgroup_matches(spec: &str, cgroup: &str) -> bool {
    if spec.starts_with('/') {
        let s = spec.trim_end_matches('/');
        return s.is_empty()
            || cgroup == s
            || cgroup.strip_prefix(s).is_some_and(|rest| rest.starts_with('/'));
    }
    cgroup.split('/').any(|c| c == spec)
        || unit_of(cgroup) == Some(spec)
        || container_of(cgroup).is_some_and(|id| spec.len() >= 12 && id.starts_with(spec))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_containers_from_cgroup_paths() {
        assert_eq!(unit_of("/system.slice/nginx.service"), Some("nginx.service"));
        assert_eq!(
            unit_of("/system.slice/docker.service/x"),
            Some("docker.service"),
            "the innermost .service"
        );
        assert_eq!(unit_of("/user.slice/user-0.slice/session-3.scope"), Some("session-3.scope"));
        assert_eq!(unit_of("/"), None);
        let id = "4f".repeat(32);
        assert_eq!(container_of(&format!("/system.slice/docker-{id}.scope")), Some(id.as_str()));
        assert_eq!(container_of(&format!("/kubepods/besteffort/pod1/{id}")), Some(id.as_str()));
        assert_eq!(container_of("/system.slice/nginx.service"), None);
        assert_eq!(container_of(&format!("/x/{}", "a".repeat(65))), None);
    }

    #[test]
    fn cgroup_filter_is_a_path_prefix_at_a_boundary() {
        assert!(cgroup_matches("/system.slice", "/system.slice/a.service"));
        assert!(cgroup_matches("/system.slice/", "/system.slice"));
        assert!(!cgroup_matches("/system", "/system.slice/a.service"));
        assert!(cgroup_matches("a.service", "/system.slice/a.service"));
        assert!(cgroup_matches("/", "/anything"));
    }

    #[test]
    fn image_filter_names() {
        assert!(image_matches("/usr/bin/python3", b"/usr/bin/python3"));
        assert!(image_matches("python3", b"/usr/bin/python3"));
        assert!(image_matches("idle", b"[idle]"));
        assert!(image_matches("kernel", b"[kernel.kallsyms]"));
        assert!(!image_matches("python", b"/usr/bin/python3"));
    }
}
