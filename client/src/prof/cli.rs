//! The command line of `dcpiprof` (its clap [`Args`]) and the report documentation its long
//! help prints. [`super::mode`] reads it; nothing here reads a report module's internals.
// The doc comments of the clap types here are the --help text and man pages, printed as
// written: backticks around names would show up there.
#![allow(clippy::doc_markdown)]

use std::path::PathBuf;

use clap::Parser;

use super::by::By;
use super::output::Format;
use crate::args::{parse_limit, Selection, SymbolSearch};
use dcpi_manpage::Generate;

/// Documentation of the report semantics and of the JSON schema (long help and rustdoc).
pub const SCHEMA: &str = "\
NUMBERS
  samples   raw number of samples.
  events    estimated number of events those samples represent: each profile's counts are
            weighted by its own total_period/total_samples (the mean period actually used)
            before summing across epochs, hosts and period windows, then multiplied by
            time_enabled/time_running of the event on that host when the counter was
            multiplexed (ratio > 1).
  percent   share of `events` of the event within the report (per-image: of everything
            selected, including [unknown]; per-symbol: of the image). Rows are sorted by the
            first event's `events`; cumulative_percent follows that order.
  On a terminal the table groups digits (1,234,567); in a pipe or file, and always in JSON
  and CSV, numbers are plain. The table's header gives the selection (database, epochs,
  hosts, each event with its mean and nominal period) and how old the newest data is (from
  the hosts' summary.json). A report of the current epoch is fresh without `dcpictl flush`:
  it adds to the published profiles the time slices they do not hold yet (FORMAT.md §7.3),
  so it lags the machine by one slice_interval plus a flush interval; right after a new
  epoch starts it is an empty report that says so (exit 0). Those slices keep offsets at 16
  bytes: per-image counts are exact, per-symbol counts too except a 16-byte block that
  straddles a symbol's start (dcpilist, per instruction, leaves them out and says so). With --since/--until the counts
  are those of the time slices in the range, and a `# time:` line (JSON `time`) names the
  range they exactly cover and how the request was rounded.

JSON SCHEMA (--format json; numbers are plain JSON numbers)
  Per-image report (no --image):
    { \"report\": \"images\", \"database\": str, \"epochs\": [str], \"hosts\": [str],
      \"time\": TIME (only with --since/--until: { \"since\": int|null, \"until\": int|null,
        the request in Unix seconds; \"covered\": [int, int]|null, what the time slices used
        exactly cover; \"whole_epochs\", \"left_out\": [str], epoch/host without slices;
        every report below has it too),
      \"events\": [EVENT], \"total_samples\": int, \"rows_omitted\": int,
      \"idle\": { \"included\": bool, \"percent\": num },
      \"rows\": [ { \"image\": str, \"kind\": \"elf\"|\"kernel\"|\"module\"|\"vdso\"|\"anon\"|\"unknown\",
                  \"image_id\": str|null, \"build_id\": str|null,
                  \"samples\": int, \"events\": int, \"percent\": num,
                  \"cumulative_percent\": num, \"counts\": [COUNT] } ] }
  Per-symbol report (--image):
    { \"report\": \"symbols\", \"database\", \"epochs\", \"hosts\" as above,
      \"image\": { \"path\": str, \"kind\": str, \"image_id\": str|null, \"build_id\": str|null,
                 \"binary\": str|null, \"debug_file\": str|null },
      \"events\": [EVENT], \"total_samples\": int, \"rows_omitted\": int,
      \"rows\": [ { \"symbol\": str, \"source\": \"file:line\" (only with --lines),
                  \"samples\": int, \"events\": int, \"percent\": num,
                  \"cumulative_percent\": num, \"counts\": [COUNT] } ] }
  Who reports (--by command|pid|cgroup|unit|container|cpu, or any --by with --command,
  --cgroup, --pid, --cpu; from the who tables):
    { \"report\": \"by\", \"by\": str, \"source\": \"who\", \"database\": str,
      \"event\": str, \"filters\": {...}, \"idle_included\": bool, \"total_samples\": int,
      \"percent_of\": str, \"rows_omitted\": int,
      \"rows\": [ { <by>: str|int, \"samples\": int, \"percent\": num } ] }
    (--by cgroup rows also carry \"unit\" and \"container\", each str|null. --by command
    rows of a command whose threads have names of their own carry \"threads\": [ {
    \"thread\": str, \"samples\": int, \"percent\": num } ], most samples first, adding up
    to the row; its threads named as the command are the entry of the command's own name.
    --thread NAME narrows any of these to the threads of that name.)
  --pid N, --cgroup PATH or --command NAME with --by symbol, --by image, --image,
    --symbols or an export: the per-image, per-symbol or all-symbols report or the export
    above, of that process's, cgroup's or command's samples only, read from the
    per-process/per-cgroup/per-command profiles dcpid writes with by_pid / by_cgroup /
    by_command (by_command is on by default). A database recorded without them is an error
    (exit 2) saying so, except for --by image, which then comes from the who tables (a who
    report whose rows carry the same \"image\", \"samples\" and \"percent\"), and an
    export with --command, which then holds that command's call stacks only. These profiles
    are whole-epoch totals: with --since/--until they are an error (exit 2) saying so.
  Callers/callees (--callers SYM or --callees SYM, from the call stacks):
    { \"symbol\": str, \"direction\": \"callers\"|\"callees\", \"depth\": int, \"event\": str,
      \"samples\": int (first event's samples whose stack contains SYM),
      \"stack_samples\": int, \"truncated_percent\": num,
      \"rows\": [ { \"symbol\": str, \"samples\": int, \"percent\": num (of \"samples\") } ] }
  Stack health (--stack-health, from the call stacks):
    { \"report\": \"stack-health\", \"database\": str, \"event\": str,
      \"stack_samples\": int, \"ended_early\": int, \"ended_early_percent\": num,
      \"threshold_percent\": num, \"rows_omitted\": int,
      \"rows\": [ { \"image\": str, \"kind\": str, \"build_id\": str|null,
                  \"stack_samples\": int, \"ended_early\": int (of them, ended early
                  anywhere), \"ended_here\": int (ended early in this image),
                  \"percent\": num (ended_here of stack_samples),
                  \"no_caller\": int, \"lost\": int, \"cut\": int,
                  \"verdict\": \"sound\"|\"no-frame-pointers\"|\"cut-short\"|\"few-samples\",
                  \"advice\": str } ] }
  All symbols (--symbols, no --image):
    { \"report\": \"global-symbols\", \"database\", \"epochs\", \"hosts\", \"events\",
      \"total_samples\", \"rows_omitted\" as above,
      \"rows\": [ { \"image\": str, \"kind\": str, \"build_id\": str|null, \"symbol\": str,
                  \"samples\": int, \"events\": int, \"percent\": num (of the machine's total),
                  \"cumulative_percent\": num, \"counts\": [COUNT] } ] }
  EVENT = { \"name\": str, \"samples\": int, \"events\": int, \"mean_period\": num,
            \"nominal_period\": int, \"multiplex_scale\": num }
  COUNT = { \"event\": str, \"samples\": int, \"events\": int, \"percent\": num }  (one per event,
          in the order of \"events\"; a row's top-level samples/events/percent are those of the
          first event, and total_samples is the first event's samples)

CSV (--format csv): a header line, then one line per row: image,kind,build_id,image_id (or
  symbol,source), then <event>.samples,<event>.events,<event>.percent per event, then
  cumulative_percent.

OFF-CPU TIME (--event off-cpu, dcpid's off_cpu = true)
  A time-weighted event: its counts are nanoseconds that threads waited, not samples. Text
  tables show them as seconds (column `time`, `off-cpu:s` beside other events; `--by time`:
  seconds and ms/s; --callers/--callees: seconds); CSV titles them <event>.ns (`ns`,
  `ns_per_second`) and JSON keeps the nanoseconds in `samples`; flame graphs count ns;
  pprof's sample type is off-cpu/nanoseconds. With an on-CPU clock event beside it
  (`--event cpu-clock --event off-cpu`) the table gains a `wall` column (CSV wall.ns): the
  clock event's samples converted to time by their sampling period (its events estimate,
  nanoseconds) plus the off-CPU nanoseconds; the header states the conversion. dcpidiff
  compares off-CPU time as ns per second of the host's sampled time (ms/s in text), without
  a significance test (nanoseconds are not Poisson counts).

TIMELINE (--by time)
  Samples of the first event per time bucket, read from each selected host-epoch's slices.log
  (dcpid's time slices, FORMAT.md section 14), hosts and epochs added up by time. Buckets are
  --resolution long (default: the stored slice length), aligned to UTC; a slice falls, whole,
  into the bucket of its start, so the buckets sum exactly to the slices' samples, which are
  the epoch profiles' samples once dcpid has published them (a stopped or flushed daemon).
  A slice is never split: hour slices rolled up by dcpid stay one row of an hour (`seconds`
  says each row's length). Buckets in which nothing was sampled are not listed; the header's
  one-line chart (samples per second, a space where there is no data) shows the gaps.
  --since/--until keep the slices overlapping that range. --image (and --symbol) count that
  image's (function's) samples, their share being of the bucket's samples; --no-idle leaves
  the idle task out. Slices have no process, cgroup or CPU: --command, --cgroup, --pid and
  --cpu are refused (--by epoch with them gives a per-epoch trend from the who tables).
  Host-epochs without a slices.log (older dcpid, slice_interval = 0) are named in a warning;
  when none has one the run fails (exit 2).
  JSON: { \"report\": \"by\", \"by\": \"time\", \"database\": str, \"event\": str,
    \"image\": str|null, \"symbol\": str|null, \"resolution\": int (seconds),
    \"stored_resolution\": int, \"since\": int|null, \"until\": int|null (Unix seconds covered),
    \"total_samples\": int, \"profile_samples\": int|null (the epoch profiles' samples of the
    same selection, without --since/--until), \"percent_of\": str,
    \"rows\": [ { \"time\": str (UTC), \"start\": int, \"seconds\": int, \"samples\": int,
      \"per_second\": num, \"percent\": num } ] }
  CSV: time,seconds,samples,per_second,percent.

SYMBOL NAMES
  Rust (legacy and v0) and C++ (Itanium) names are demangled as perf does; Rust hashes are
  dropped. --raw-names shows the names as stored. Control characters are escaped (\\u{1b},
  \\n), bytes that are not UTF-8 are written \\xNN, in every format. Tables and CSV also
  escape format and separator characters (Unicode Cf, Zl, Zp: bidi overrides such as
  \\u{202e}, zero-width characters), which JSON keeps as they are. A CSV text cell beginning
  with = + - @, tab or CR gets a leading ' (no spreadsheet formula); numbers are unchanged.
EXPORT FORMATS (every selection; with --image, only that image)
  folded    `image;symbol count` per line (flamegraph.pl, inferno, speedscope): raw samples
            of the first event, summing to the report's total_samples. `;` in a name is
            written as `:`. Where dcpid recorded call stacks (--callchains fp) each line is a
            whole stack, root first, rooted at the command that ran it (as stackcollapse-perf):
            `app;main;via_a;hot count` (`[unknown command]` for stacks recorded before dcpid
            kept commands), and pprof, svg, html and speedscope show the same stacks (with
            --image, the stacks whose sampled frame is in that image, as `perf script --dsos`;
            with --command NAME, that command's: its per-command profile's samples, its
            stacks replacing them; without per-command profiles its stacks only).
  pprof     gzipped profile.proto for go tool pprof, Parca, Pyroscope. Sample types per
            event: samples/count (EVENT_samples/count with several events) and the weighted
            estimate (cpu/nanoseconds for cpu-clock, EVENT/events otherwise; the first event's
            is the default). One mapping per image (path, build-id) at a synthetic address
            range: a location's address is mapping start + the sampled file offset (kernel:
            offset from the text/module base), so pprof (github.com/google/pprof, which
            uses addr2line) can re-symbolize from the binaries (PPROF_BINARY_PATH) images
            dcpi could not; `go tool pprof` symbolizes Go binaries only.
            Functions carry dcpi's names (demangled; system name = symbol table name) and,
            with --lines, file and line. Labels: host, epoch, and on call-stack samples comm
            (whose outermost location is a synthetic one named by the command). Written to
            stdout only when it is not a terminal.
  svg       flame graph of the folded stacks: hover for counts, click to zoom, Search (or
            Ctrl-F) highlights a regular expression and shows its share; ?s=REGEX in the URL.
  html      one self-contained page (no network access): per-image table, per-symbol tables
            of the top 5 images (100 rows each, or --limit), the flame graph, a timeline
            (samples per second per stored slice, from slices.log, where dcpid recorded time
            slices; not with --pid/--cgroup), and a chart of the top images' share per epoch
            when several epochs are selected. Click a column
            header to sort.
  speedscope  speedscope's JSON file format: one sampled profile per event, weighted by
            its event estimate (nanoseconds for cpu-clock), frames image then symbol.
  --output FILE writes any format to FILE atomically instead of stdout: a new temporary file
  (O_EXCL, unpredictable name) in FILE's directory, fsync, rename. A symbolic link or FIFO at
  FILE is replaced, never written through. A progress bar is drawn on a terminal's stderr for exports of 500+ files.

CALL STACKS (dcpid --callchains fp)
  --callers SYM lists who called function SYM (exact name, as the reports show it): one row
  per caller with the samples of the stacks through it, `[no caller]` for stacks ending in
  SYM; --callees SYM lists what SYM called, `[self]` being SYM's own samples; --depth N makes
  each row a chain of N frames. A stack counts once (recursion: SYM's innermost occurrence
  for callers, outermost for callees). The header gives the share of truncated stacks: cut
  at dcpid's sample_max_stack, or ending in a frame that is no entry point (_start,
  __libc_start_call_main, start_thread, clone, ret_from_fork, ...): frame-pointer unwinding
  stops at code built without frame pointers (and may skip the caller of a leaf function
  compiled without one). Frames other than the sampled pc are return addresses minus one, so
  they name the calling function even when the call is its last instruction.
  --stack-health gives, per image, the samples of the stacks through it, how many of them
  ended early (anywhere), how many ended early in it (`here`: charged to the outermost frame
  of a known image; the verdict's share) and why: `no caller`
  (truncated after the first user frame: no frame pointer or unwind information), `lost` (not
  truncated, but ending in a frame that is no entry point: a frame-pointer chain that went
  astray), `cut` (truncated deeper: sample_max_stack, the copied user stack's end, or a frame
  without unwind information). Verdict: `sound` below 5% ended early, `no-frame-pointers`
  (rebuild with -fno-omit-frame-pointer, or give it CFI and record with callchains =
  \"dwarf\"), `cut-short`, or `few-samples` (fewer than 20 stack samples through it).
  The exports (folded, pprof, svg, html, speedscope) show the full stacks; with --image,
  those whose sampled (leaf) frame is in that image, with all their callers.
  --image IMAGE narrows SYM to that image's function (another program's function of the
  same name is not counted); --command NAME counts only the stacks of processes with that
  command (comm). Stacks keep their command, not their pid or cgroup: --pid, --cgroup and
  --cpu with --callers/--callees are a usage error. A function a stripped image has no symbol
  for is named as the reports name it (`image+0xOFFSET`).
  The exports (folded, pprof, svg, html, speedscope) show the full stacks, each rooted at its
  command; with --image, those whose sampled (leaf) frame is in that image, with all their
  callers.
  Idle-task stacks are `[idle]` frames; JIT frames are named from the perf map symbols the
  stack file carries (also for a JIT region sampled only as a caller), else from those of
  the image's flat profile.

SPECIAL ROWS
  [unknown]              samples the daemon could not attribute (per-image); per symbol
                         `--image unknown` splits them by reason ([unknown: no-map], ...).
  [idle]                 samples of the idle task (pid 0, the swapper): CPU time nobody
                         used. Its own row, symbolized like the kernel (`--image idle`); the
                         header says its share and whether the machine was mostly idle.
                         --no-idle leaves it out, so percentages are of busy time; JSON
                         \"idle\": {\"included\": bool, \"percent\": num}.
  [kernel.kallsyms]      kernel code run on behalf of processes (system calls, interrupts,
                         page faults), not the idle loop.
  IMAGE+0xOFFSET         no symbol covers the sample (binary not found or cannot be parsed,
                         stripped, or between symbols): IMAGE is the file's basename (or [kernel.kallsyms],
                         [MODULE], [anon:...]) and OFFSET the file offset (kernel: offset from
                         the text/module base) rounded down to its 4 KiB page. [vdso]+0xOFFSET
                         is exact.
  [.plt] etc.            no symbol, but inside that section (other than .text).
  [build-id mismatch]    the binary at the recorded path is another build; its symbols are
                         never used (a warning names the path and both ids).

IMAGE NAMES
  Tables name an image by its basename (`libc.so.6`); two images that differ only in
  directory by as many trailing path components as tell them apart (`v1/app`, `v2/app`),
  and two builds of one path by a short build-id (`app (3b3b3b3b)`, usable as --image). The
  same in dcpilist, dcpidiff and dcpistats. JSON and CSV have the whole paths.

BINARIES AND DEBUG INFO
  A binary is looked up by build-id: at its recorded path, in --binary-path dirs, then in the
  build-id caches (--cache-dir, then <db>/binaries, laid out <xx>/<rest-of-hex>). The daemon
  does not copy binaries: fill the cache with `dcpiprof --cache-binary FILE` (e.g. from CI).
  Images without a build-id are used only if path, size, mtime and inode still match.
  Separate debug files: <dir>/.build-id/xx/rest.debug for each --debug-dir then
  /usr/lib/debug, then .gnu_debuglink (CRC32 checked) in --debug-dirs, beside the binary,
  its .debug/ dir and /usr/lib/debug/<dir>. Kernel and module samples are symbolized from the
  epoch's kallsyms snapshot, never from the live /proc/kallsyms. vDSO samples use a copy found
  by build-id (--binary-path, caches) or this machine's vDSO if its build-id matches; otherwise
  they are shown as [vdso]+0xOFFSET. JIT regions ([anon:PID:comm]) use the perf-PID.map
  symbols stored with the profile.
  --lines keys rows by file:line of the innermost DWARF frame (the table lists each
  function's lines under it, the function's row summing them); --inlines names the innermost
  inlined function instead of the enclosing symbol. Both need DWARF (in the binary or a
  separate debug file) and fall back to symbols with a warning.

SYMBOL CACHE
  Symbol tables of images with a build-id, and the DWARF answers --lines/--inlines needed,
  are kept in SQLite at --symbol-cache (default $XDG_CACHE_HOME/dcpi/symbols.sqlite, else
  ~/.cache/dcpi/symbols.sqlite), keyed by build-id and the debug file used (path, size,
  mtime). A later report then only checks the binary's build-id (a few pages) and does not
  parse its symbols or DWARF again. Safe to share between concurrent runs; a corrupt cache
  file is rebuilt with a warning; it can be deleted at any time.

FILES READ
  A per-image report reads the summary.idx of each selected host and epoch: it holds the
  per-image totals (written by dcpid since the index exists); where there is none it reads
  the JSON index of an older summary.json, else the host-epoch's profiles, with the same
  result. A per-symbol report reads only the chosen image's profiles: in closed epochs
  summary.idx names them; in the newest epoch (whose index may trail its files) the
  directories are listed and, unless a build-id (prefix) or `unknown` decides by file name,
  one profile per distinct image is read to learn its path and kind. With --pid or --cgroup
  and a profile report, each selected host directory is listed and the process's
  `*.pid-N.prof` files (--pid), or every `*.cg-*.prof` file (--cgroup: the path is in the
  header), are read. `--verbose` prints the counts.

EXIT STATUS
  0 success (also when --keep-going skipped corrupt files: each is named on stderr, and
    when the reader of a pipe closed it early, as `dcpiprof | head -1` does);
  1 internal or output error (e.g. a full disk);
  2 usage or data error: bad arguments, missing database, no epoch/host/image/event
    matching the selection, a corrupt or foreign-version profile file (without
    --keep-going), --image ambiguous (the matches are listed on stderr). The error is one
    line naming the thing and what to do. A binary that is missing, unreadable or stripped
    is not an error: its rows show IMAGE+0xOFFSET and a warning says how to supply symbols
    (a stripped library whose exported .dynsym symbols were all there was is also said in
    the table's header, `# symbols: only .dynsym ...`). Several such images make one
    warning line counting them by reason; --verbose lists each with its advice.";

/// Command line of `dcpiprof`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "dcpiprof",
    version,
    about = "Report dcpi profiles: per image, or per symbol of one image",
    long_about = "Report dcpi profiles straight from the database (no daemon needed).\n\n\
                  Without --image: one row per image (executable, library, kernel, module, \
                  vDSO, JIT region, [unknown]) for the latest epoch of this host.\n\
                  With --image: one row per function (or source line) of that image.",
    after_long_help = SCHEMA
)]
pub struct Args {
    #[command(flatten)]
    pub sel: Selection,
    /// Per-symbol report of one image: a path, a basename or a unique prefix or substring of
    /// one (`nginx`; an exact basename wins; several matches are listed), a build-id or a
    /// prefix of >= 8 hex digits, `kernel` ([kernel.kallsyms], vmlinux), a module name,
    /// `[vdso]`, `anon` or `[anon...]` (JIT regions, with their perf map symbols; `anon:PID`
    /// those of one process) or `unknown`.
    #[arg(long, value_name = "IMAGE")]
    pub image: Option<String>,
    /// Output format (report: table, json, csv; export: folded, pprof, svg, html, speedscope;
    /// see EXPORT FORMATS below).
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Write the report or export to FILE (atomically) instead of stdout.
    #[arg(long, short = 'o', value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Show at most N rows (the header still counts everything); 0 means no limit.
    #[arg(long, value_name = "N", value_parser = parse_limit)]
    pub limit: Option<usize>,
    /// Per-symbol report: one row per source line (<file:line> of the innermost frame, DWARF).
    #[arg(long)]
    pub lines: bool,
    /// Per-symbol report: attribute samples to the innermost inlined function (DWARF).
    #[arg(long)]
    pub inlines: bool,
    /// Per-symbol report: show symbol names as the binary stores them (mangled, with Rust
    /// hashes), not demangled. Control characters are escaped either way.
    #[arg(long)]
    pub raw_names: bool,
    /// Without --image: the hottest symbols of all images in one table, with the image and
    /// each row's share of the machine's total.
    #[arg(long = "symbols", conflicts_with = "image")]
    pub all_symbols: bool,
    #[command(flatten)]
    pub symbols: SymbolSearch,
    /// Copy FILE into <db>/binaries (named by its build-id) and exit (repeatable).
    #[arg(long = "cache-binary", value_name = "FILE")]
    pub cache_binary: Vec<PathBuf>,
    /// One row per WHAT: epoch or host (of the whole selection, of --image or of its
    /// --symbol: a trend in one command), time (samples per --resolution bucket from the time
    /// slices, of the selection, --image or its --symbol; see TIMELINE below), image or symbol
    /// (the usual reports), or who used the CPU: command, pid (dcpid's by_pid), cgroup, unit,
    /// container, cpu (from the who tables). JSON rows carry the key under WHAT's name, and
    /// `samples`.
    #[arg(long, value_enum, value_name = "WHAT")]
    pub by: Option<By>,
    /// With --by time: the length of a bucket (10s, 1m, 15min, 1h, 1d), aligned to UTC.
    /// Default: the stored slice length (dcpid's slice_interval, 1m unless configured). A
    /// slice is never split: a resolution finer than the slices, or hour slices left by
    /// dcpid's roll-up (after slice_rollup_after, 6h), give buckets as long as the slices.
    #[arg(long, value_name = "DURATION", value_parser = super::timeline::parse_resolution)]
    pub resolution: Option<u64>,
    /// Only samples of processes with this command name (comm, as --by command shows it):
    /// from the who tables for the who reports; with --by symbol, --by image, --image,
    /// --symbols or an export, from the per-command profiles (dcpid's by_command, the
    /// default), an export's call stacks being that command's; with --callers/--callees, the
    /// call stacks of that command.
    #[arg(long, value_name = "NAME")]
    pub command: Option<String>,
    /// Only samples of this cgroup v2 path or its sub-groups (`/system.slice`), or of a unit
    /// (`nginx.service`) or container id prefix (12+ hex digits), from the who tables; with
    /// --by symbol, --by image, --image, --symbols or an export, from the per-cgroup profiles
    /// (needs dcpid's by_cgroup). `--unit` is the same selector.
    #[arg(long, value_name = "PATH", visible_alias = "unit")]
    pub cgroup: Option<String>,
    /// Only samples of this process (needs dcpid's by_pid), from the who tables; with --by
    /// symbol, --by image, --image, --symbols or an export, from the per-process profiles:
    /// where in its code process N spent its time.
    #[arg(long, value_name = "N")]
    pub pid: Option<u32>,
    /// Only samples of threads with this name (the thread's comm, `opt cgu.00`), from the who
    /// tables' thread rows (FORMAT.md §12, version 2); threads named as their process count
    /// under the process's name, as `perf report --comms` counts them. A who report: --by
    /// command (the default with --thread), pid, cgroup, unit, container, host or epoch, with
    /// --command, --cgroup, --pid; not per image or symbol (thread rows are not per image,
    /// and per-thread profiles are not recorded).
    #[arg(long, value_name = "NAME")]
    pub thread: Option<String>,
    /// With --by command: under each command whose threads have names of their own, a row
    /// per thread name (`rustc/opt cgu.00`), the threads named as the process in
    /// `rustc/rustc`; the rows under a command add up to it. Folded (off) by default; the JSON
    /// report always carries them, as each command row's `threads`.
    #[arg(long)]
    pub threads: bool,
    /// Only samples taken on this CPU (with --by cpu).
    #[arg(long, value_name = "N")]
    pub cpu: Option<u32>,
    /// With --image and --by epoch|host|time: only this function (exact name as reported); its
    /// share is of the image.
    #[arg(long, value_name = "NAME", requires = "image", requires = "by")]
    pub symbol: Option<String>,
    /// Call stacks (dcpid `--callchains fp`): who calls function SYM (its exact name as the
    /// reports show it), one row per caller with the samples of the stacks through it; `[no
    /// caller]` counts stacks that end in SYM. Also shows the share of truncated stacks.
    /// Narrowed by --image (that image's SYM) and --command.
    #[arg(long, value_name = "SYM", conflicts_with_all = ["callees", "by", "all_symbols"])]
    pub callers: Option<String>,
    /// Call stacks: what function SYM calls, one row per callee; `[self]` is SYM itself.
    #[arg(long, value_name = "SYM", conflicts_with_all = ["by", "all_symbols"])]
    pub callees: Option<String>,
    /// Call stacks: per image, the share of the stacks through it that ended early (cut, or
    /// not at an entry point) and why, naming the images to rebuild with frame pointers or give
    /// CFI (`callchains = "dwarf"`), and those whose stacks are sound.
    #[arg(long, conflicts_with_all = ["callers", "callees", "image", "by", "all_symbols", "symbol"])]
    pub stack_health: bool,
    /// With --callers/--callees: each row is a chain of N frames (`via_a <- main`).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub depth: u16,
    /// Leave the idle task's samples (`[idle]`) out: rows and percentages are then of the time
    /// the CPUs were busy.
    #[arg(long)]
    pub no_idle: bool,
    /// Print what the report read (profile files, symbol tables, DWARF, cache hits) to stderr.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Write a man page or shell completions to stdout and exit.
    #[arg(long, hide = true, value_enum, value_name = "WHAT")]
    pub generate: Option<Generate>,
}
