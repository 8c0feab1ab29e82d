//! dcpictl: control a running dcpid.
#![forbid(unsafe_code)]
// The doc comments of the clap types here are the --help text and man pages, printed as
// written: backticks around names would show up there.
#![allow(clippy::doc_markdown)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use clap::{CommandFactory, Parser, Subcommand};
use dcpi_client::ctl::{
    parse_result, reload_outcome, request_value, write_status, CtlError, StatusTable,
    DEFAULT_SOCKET,
};
use dcpi_client::manpages;
use dcpi_client::manpages::Generate;
use dcpi_client::top;
use dcpi_client::top::By;
use dcpi_client::top::Format;
use dcpi_client::top::View;
use dcpi_proto::{EpochResult, FlushResult, ReloadReport, Request, StatusReport};
use dcpi_report::render::Output;

/// Control a running dcpid (the dcpi profiling daemon) over its control socket.
///
/// Exit status: 0 success; 1 the daemon reported an error (e.g. the database is not writable
/// and a flush is incomplete); 2 usage error; 3 dcpid is not running or the socket cannot be
/// reached; 4 communication error (bad or missing response).
#[derive(Parser, Debug)]
#[command(name = "dcpictl", version, about, long_about, max_term_width = 100)]
struct Cli {
    /// dcpid's control socket.
    #[arg(long, value_name = "PATH", default_value = DEFAULT_SOCKET, global = true)]
    socket: PathBuf,
    /// Write the man page or a shell completion script to stdout.
    #[arg(long, value_enum, hide = true, value_name = "WHAT")]
    generate: Option<Generate>,
    #[command(subcommand)]
    command: Option<Cmd>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Show events and their sources, samples per CPU, losses, unknown samples, the epoch,
    /// flush/publish times, error conditions, and the daemon's own CPU and memory use.
    ///
    /// `--json` prints a stable machine-readable object: version, pid, host, db, uptime_s,
    /// events[] {name, requested, source, period_min, period_max, samples}, cpus[] {cpu,
    /// online, samples, lost, throttled, error, wakeups, wakeups_per_s, drain_cpu_ms_per_s},
    /// samples, lost, throttled, unknown {count,
    /// fraction, by_reason}, aggregation {samples_aggregated, entries_created, factor, pending,
    /// late_sideband}, epoch, store {last_flush, last_publish, spool_rows, spool_bytes,
    /// dirty_profiles, pending_batches, pending_bytes, dropped_samples, db_error, spool_error,
    /// ...}, condition ("ok" or what is wrong), daemon {cpu_user_s, cpu_sys_s, rss_kib}, rate
    /// {samples_per_s, samples_per_s_recent, recent_window_s}, overhead {daemon_cpu_pct,
    /// daemon_cpu_pct_recent, sample_cost_us_estimate, sampling_cpu_pct_estimate, ncpus,
    /// machine_pct_estimate, daemon_cpu_ms_per_s, ns_per_sample, stage_cpu_s {drain,
    /// drain_parse, drain_aggregate, drain_rearm, flush_checks, flush_resolve, flush_store,
    /// flush_spool, flush_publish, resolver_thread}}, config {file, events, flush_interval_s, publish_interval_s, ...},
    /// last_reload (null or {unix_ms, trigger, ok, error, applied[], restart_required[]}),
    /// state ("ok", or "degraded" once a daemon thread died), failed_threads[] {thread, reason,
    /// unix_ms}, perf_maps {read, truncated, max_bytes, max_entries}, stacks (null without
    /// --callchains fp, else {recorded, truncated, overflow, empty, distinct_per_cpu[],
    /// capacity_per_cpu, max_stack, early_flushes}). Fields are only ever
    /// added.
    ///
    /// The overhead of sampling interrupts is an estimate (samples/s x an assumed cost per
    /// sample: ~1 µs with a hardware PMU, ~2 µs for cpu-clock, ~20 µs for cpu-clock in a VM);
    /// the daemon's own CPU time is measured, and `stage_cpu_s` (CPU seconds since start)
    /// says where it goes: the drain threads' parse, aggregation and period re-arms (the rest
    /// of `drain` is waking up), the flush thread's checks, take-and-resolve, and store
    /// (spool and publish within it), and the resolver thread. The text form prints them per
    /// second since start.
    ///
    /// `--format csv` writes one of its tables (`--table`): `cpus` (cpu, online, samples,
    /// lost, throttled, wakeups_per_s, drain_cpu_ms_per_s, error) or `events` (samples,
    /// period_min, period_max, source, event). The text form draws the same tables.
    Status {
        /// Machine-readable JSON (the same as `--format json`).
        #[arg(long, conflicts_with = "format")]
        json: bool,
        /// `text`, `csv` (one table, see `--table`) or `json` (the whole object above).
        #[arg(long, value_name = "FORMAT", default_value = "text", value_parser = ["text", "csv", "json"])]
        format: String,
        /// The table `--format csv` writes: `cpus` or `events`.
        #[arg(long, value_name = "TABLE", default_value = "cpus", value_parser = ["cpus", "events"])]
        table: String,
    },
    /// Write every sample taken up to now to the spool and publish every changed profile;
    /// returns when done. Every CPU's drain thread first reads its ring up to the request's
    /// instant (a CPU that does not answer within 2 s is named in a warning).
    Flush,
    /// Re-read the configuration file, as on SIGHUP.
    // The long help lists the keys a reload applies, from the list dcpid uses.
    #[command(long_about = dcpi_client::ctl::reload_help())]
    Reload,
    /// Live view of where the CPU goes, as `perf top`: the hottest functions of the last 5 s
    /// over every process (kernel functions named from /proc/kallsyms, user functions from
    /// the binaries, checked by build-id; code without a symbol by its page, `image+0xOFFSET`),
    /// from the daemon's memory (no disk I/O). `--by` groups by command, process or image
    /// instead; `--command`/`--image` zoom into one; the header gives the window's samples and
    /// the idle share. On a terminal it redraws every `--interval` and takes keys: s symbol,
    /// c command, p pid, i image, z zoom into the top row, u unzoom, e next event, n idle
    /// on/off, q quit. `--once` (or a pipe, or `--format csv|json`) prints one snapshot.
    /// `--format json` prints {"window_ms", "event", "events", "by", "zoom_command",
    /// "zoom_image", "samples", "idle_samples", "idle_percent", "rows": [{"symbol", "image",
    /// "command", "commands", "pid", "samples", "percent"}], "notes"}, hottest first; fields a
    /// grouping does not determine are null. Kernel functions are kept over all processes
    /// together: zoomed into a command, its kernel time is one row. The daemon takes new
    /// samples for the view only when its newest are a second old: at the default interval,
    /// two redraws in three show the same samples.
    Top {
        /// Print one snapshot and exit.
        #[arg(long)]
        once: bool,
        /// `table`, `csv` or `json` (csv and json imply --once).
        #[arg(long, value_name = "FORMAT", default_value = "table", value_parser = ["table", "csv", "json"])]
        format: String,
        /// Show at most N rows.
        #[arg(long, value_name = "N", default_value_t = 40)]
        limit: usize,
        /// What a row is.
        #[arg(long, value_enum, default_value = "symbol")]
        by: By,
        /// Only the processes of this command (comm).
        #[arg(long, value_name = "COMM")]
        command: Option<String>,
        /// Only this image (its path or file name).
        #[arg(long, value_name = "IMAGE")]
        image: Option<String>,
        /// Rank by this event (default: the daemon's first).
        #[arg(long, value_name = "EVENT")]
        event: Option<String>,
        /// Leave the idle task out of the rows (the header still gives its share).
        #[arg(long)]
        no_idle: bool,
        /// Redraw interval of the live view.
        #[arg(long, value_name = "DURATION", default_value = "500ms", value_parser = humantime::parse_duration)]
        interval: Duration,
    },
    /// Epochs: periods of time whose profiles are kept apart.
    Epoch {
        #[command(subcommand)]
        action: EpochCmd,
    },
}

#[derive(Subcommand, Debug)]
enum EpochCmd {
    /// Close the current epoch at this instant and start a new one; print its id. Every
    /// sample goes to the epoch containing its timestamp, whenever it is drained. dcpid also
    /// starts one by itself at each boundary of its `epoch_interval` (by default daily, at
    /// 00:00 UTC); an epoch started here does not move those boundaries.
    New,
    /// Print the current epoch id.
    Show,
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Some(g) = cli.generate {
        let r = manpages::generate(Cli::command(), g, &mut std::io::stdout().lock());
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dcpictl: --generate: {e}");
                ExitCode::FAILURE
            }
        };
    }
    let Some(command) = cli.command else {
        drop(Cli::command().print_help());
        return ExitCode::from(2);
    };
    if let Cmd::Top { once, format, limit, by, command, image, event, no_idle, interval } = &command
    {
        let view = View {
            by: *by,
            command: command.clone(),
            image: image.clone(),
            event: event.clone(),
            no_idle: *no_idle,
            limit: *limit,
        };
        let format = match format.as_str() {
            "json" => Format::Json,
            "csv" => Format::Csv,
            _ => Format::Table,
        };
        let r = top::run(&cli.socket, *once, format, view, *interval);
        return match r {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("dcpictl: {e}");
                ExitCode::from(e.exit_code())
            }
        };
    }
    let req = match &command {
        Cmd::Top { .. } => Request::Top,
        Cmd::Status { .. } => Request::Status,
        Cmd::Flush => Request::Flush,
        Cmd::Reload => Request::Reload,
        Cmd::Epoch { action: EpochCmd::New } => Request::EpochNew,
        Cmd::Epoch { action: EpochCmd::Show } => Request::EpochShow,
    };
    let timeout = Duration::from_secs(if req.is_slow() { 300 } else { 15 });
    match run(&cli.socket, &command, req, timeout) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("dcpictl: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

fn run(
    socket: &Path,
    command: &Cmd,
    req: Request,
    timeout: Duration,
) -> Result<ExitCode, CtlError> {
    let v = request_value(socket, req, timeout)?;
    match command {
        Cmd::Status { json, format, table } => {
            // Checked against the protocol types even when printed as it came, so a field the
            // daemon no longer sends is an error here too.
            let status: StatusReport = parse_result(socket, req, v.clone())?;
            let form = match format.as_str() {
                _ if *json => Output::Json,
                "json" => Output::Json,
                "csv" => Output::Csv,
                _ => Output::Text,
            };
            let table = if table == "events" { StatusTable::Events } else { StatusTable::Cpus };
            let mut out = Vec::new();
            // Writing into memory cannot fail.
            drop(write_status(&mut out, &status, &v, form, table));
            emit(format_args!("{}", String::from_utf8_lossy(&out)));
        }
        Cmd::Flush => {
            let r: FlushResult = parse_result(socket, req, v)?;
            warn_unanswered(&r.unanswered_cpus);
            emit(format_args!("flushed\n"));
        }
        Cmd::Reload => {
            let r: ReloadReport = parse_result(socket, req, v)?;
            emit(format_args!("{}\n", reload_outcome(&r)));
        }
        Cmd::Top { .. } => {}
        Cmd::Epoch { .. } => match parse_result::<EpochResult>(socket, req, v)? {
            EpochResult { epoch: Some(e), unanswered_cpus, .. } => {
                warn_unanswered(&unanswered_cpus);
                emit(format_args!("{e}\n"));
            }
            EpochResult { epoch: None, .. } => {
                eprintln!("dcpictl: no current epoch (database not available?)");
                return Ok(ExitCode::from(1));
            }
        },
    }
    Ok(ExitCode::SUCCESS)
}

/// Write to stdout. A reader that closed the pipe (`dcpictl status | head -1`) has what it
/// wanted: exit 0 quietly, as the other tools do, rather than panic as `println!` would.
fn emit(text: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_fmt(text).and_then(|()| out.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("dcpictl: writing output: {e}");
        std::process::exit(1);
    }
}

/// A flush or new epoch is a barrier at one instant; a CPU whose drain thread did not answer in
/// time has its last samples in a later batch: say which.
fn warn_unanswered(cpus: &[u32]) {
    if !cpus.is_empty() {
        let list: Vec<String> = cpus.iter().map(u32::to_string).collect();
        eprintln!(
            "dcpictl: warning: the drain threads of CPUs {} did not read their rings up to the \
             request in time; their most recent samples go to the next flush",
            list.join(", ")
        );
    }
}
