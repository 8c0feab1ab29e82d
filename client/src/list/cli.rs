//! The command line of `dcpilist` (its clap [`Args`], the listing [`Mode`]) and its
//! [`ListError`]: what the listing, top and render modules below [`super`] share, so none of
//! them imports from its parent.

use std::path::PathBuf;

use clap::Parser;

use super::disasm;

use crate::args::{NamesArgs, Selection};
use crate::prof::output::TableFormat as Format;
use crate::prof::whoprof::WhoSel;
use dcpi_report::error::ProfError;

/// The skid caveat, printed in `--help` and in every listing's header.
pub const SKID_NOTE: &str = "skid: with cpu-clock or another non-precise event a sample lands on \
an instruction shortly after the one that stalled (often the next one): read a hot \
instruction together with the one(s) just before it";

/// Long help: what the numbers mean and the JSON schema (the man page is generated from it).
pub const HELP: &str = "\
SKID
  With cpu-clock (the usual event without a hardware PMU) or any non-precise hardware event,
  the sampled instruction pointer is the instruction *after* the one that was executing or
  stalled, sometimes a few later: a slow division shows its samples on the next instruction.
  Read a hot instruction together with the one(s) just before it. Precise events (cycles:pp
  on a PMU with PEBS/IBS) reduce skid.

NUMBERS
  samples   raw samples on the instruction (or source line).
  events    samples weighted by each profile's mean period and multiplexing scale, as in
            dcpiprof; percent is the share of the function's `events` of that event.
  cpi       cycles per instruction: weighted `cycles` events / weighted `instructions`
            events of the row, shown when both events were sampled.
  Samples whose offset falls inside an instruction (not at its first byte) count for that
  instruction.
  Counts are those of the published profiles: the current epoch's newest samples, which
  dcpiprof adds from the time slices (FORMAT.md §7.3), are kept there at 16-byte offsets, not
  per instruction, so dcpilist leaves them out and says how many on stderr; `dcpictl flush`
  publishes them.

MODES
  --asm     (default) one row per instruction: offset (file offset from the image start, as
            stored in the profile), instruction (AT&T syntax, --syntax intel for Intel), the
            source line it comes from. Labels (L1:, L2: ...) mark branch targets inside the
            function, `-> L3` shows where a branch goes, a blank line separates basic blocks,
            and calls are annotated with their target's symbol.
  --source  one row per source line (file:line of the innermost DWARF frame, so inlined code
            is listed on the inlined function's lines), in file and line order, with the
            line's text when the file is readable.
  --both    the instructions in address order, each run of instructions of one source line
            preceded by that line (with the whole line's counts) as perf annotate shows.
  JIT code ([anon:...] images with a perf map) has no code bytes: its samples are listed by
  offset inside the perf-map symbol. Kernel functions ([kernel.kallsyms]) are disassembled from
  --vmlinux FILE (an uncompressed vmlinux with symbols) or, when the profile's kernel is the
  running one, /proc/kcore (root).

TOP INSTRUCTIONS (--top N)
  The N hottest instructions of every image in the selection (of one image with --image), by
  the first event's events: image, symbol, offset, instruction and counts. Needs every
  profile's counts in memory.

BIG FUNCTIONS (--min-percent PCT)
  Only the rows with at least PCT percent of the function's samples, each with --context rows
  (default 3) before and after it, as perf annotate shows the hot part of a function: a
  17,000-instruction function is a screen, not 19,000 lines. Each run of rows left out is one
  line (`... N rows below --min-percent`; a gap row in JSON, nothing in CSV).

JSON SCHEMA (--format json; numbers are plain JSON numbers)
  Listing:
    { \"report\": \"listing\", \"database\": str, \"epochs\": [str], \"hosts\": [str],
      \"time\": TIME (only with --since/--until; as dcpiprof --help describes it),
      \"image\": str, \"kind\": str, \"build_id\": str|null, \"binary\": str|null,
      \"symbol\": str, \"mode\": \"asm\"|\"source\"|\"both\", \"start_offset\": int, \"size\": int,
      \"instructions\": int, \"code\": bool (false: no code bytes, e.g. JIT), \"skid_note\": str,
      \"events\": [EVENT], \"total_samples\": int (first event, in the function),
      \"image_samples\": int (first event, whole image), \"rows\": [ROW] }
  ROW (asm; every row in --asm, the instructions of --both):
    { \"type\": \"asm\", \"offset\": int, \"address\": int|null (virtual address),
      \"bytes\": str (hex)|null, \"instruction\": str, \"source\": \"file:line\"|null,
      \"block_start\": bool, \"label\": str|null, \"branch_target\": int|null (offset),
      \"target_label\": str|null, \"call_target\": str|null,
      \"samples\": int, \"percent\": num, \"cpi\": num|null, \"events\": [COUNT] }
  ROW (gap; with --min-percent, in place of each run of rows left out):
    { \"type\": \"gap\", \"skipped\": int }
  ROW (source; every row in --source, the line headers of --both):
    { \"type\": \"source\", \"source\": \"file:line\"|null, \"file\": str|null, \"line\": int|null,
      \"text\": str|null, \"samples\": int, \"percent\": num, \"cpi\": num|null,
      \"events\": [COUNT] }
  Top instructions (--top):
    { \"report\": \"top\", \"database\", \"epochs\", \"hosts\" as above, \"events\": [EVENT],
      \"total_samples\": int, \"rows\": [ { \"image\": str, \"build_id\": str|null, \"symbol\": str|null,
      \"offset\": int, \"instruction\": str|null, \"source\": \"file:line\"|null,
      \"samples\": int, \"percent\": num (of the machine's total), \"events\": [COUNT] } ] }
  EVENT = { \"name\": str, \"samples\": int, \"events\": int, \"mean_period\": num,
            \"nominal_period\": int, \"multiplex_scale\": num }
  COUNT = { \"event\": str, \"samples\": int, \"events\": int, \"percent\": num }

CSV (--format csv): a header line, then one line per row:
  type,offset,source,label,branch_target,instruction, then <event>.samples,<event>.events,
  <event>.percent per event, then cpi. Source rows have type `source`, an empty offset and the
  line's text as instruction. --top: image,symbol,offset,instruction,source, then the counts.

EXIT STATUS
  0 success; 1 output error; 2 usage or data error: bad arguments, no database/epoch/host/
  image/event matching, --symbol not found in the image (the hottest symbols are listed) or
  ambiguous (the matches are listed), an image whose code cannot be read (binary not found,
  another build) or whose architecture is not x86-64 (--source still works).";

/// Command line of `dcpilist`.
#[derive(Parser, Debug, Clone)]
#[command(
    name = "dcpilist",
    version,
    about = "List the samples of one function per instruction and per source line",
    long_about = "List where inside one function the samples fall: per instruction (--asm, \
                  default), per source line (--source) or both interleaved (--both), with one \
                  column per event and a CPI column when cycles and instructions were sampled. \
                  --top N lists the N hottest instructions of the whole machine instead.\n\n\
                  Note on skid: with cpu-clock or a non-precise event, samples land on the \
                  instruction after the one that stalled.",
    after_long_help = HELP
)]
pub struct Args {
    #[command(flatten)]
    pub sel: Selection,
    /// The image: a path, a basename or a unique prefix or substring of one, a build-id or a
    /// prefix of >= 8 hex digits, `kernel`, a module name, `anon` or `[anon...]` (JIT), as
    /// dcpiprof --image.
    #[arg(long, value_name = "IMAGE", required_unless_present_any = ["top", "generate"])]
    pub image: Option<String>,
    /// The function: its name as dcpiprof shows it (demangled), its mangled name, a C++ name
    /// without the parameter list, or 0xOFFSET (a file offset inside it, to choose among
    /// functions of the same name).
    #[arg(long, value_name = "NAME", required_unless_present_any = ["top", "generate"])]
    pub symbol: Option<String>,
    /// Only the samples of processes with this command name (comm, as `dcpiprof --by command`
    /// shows it), from the per-command profiles dcpid writes by default (`by_command`); a
    /// database recorded without them is an error saying so. Whole epochs only: not with
    /// --since/--until.
    #[arg(long, value_name = "NAME", conflicts_with = "cgroup")]
    pub command: Option<String>,
    /// Only the samples of this cgroup v2 path or its sub-groups (`/system.slice`), of a unit
    /// (`nginx.service`; `--unit` is the same selector) or of a container id prefix (12+ hex
    /// digits), as `dcpiprof --cgroup` selects them: from the per-cgroup profiles (dcpid's
    /// `by_cgroup`; a database recorded without them is an error saying so). Whole epochs
    /// only: not with --since/--until.
    #[arg(long, value_name = "PATH|UNIT", visible_alias = "unit")]
    pub cgroup: Option<String>,
    /// One row per instruction (default).
    #[arg(long, group = "mode")]
    pub asm: bool,
    /// One row per source line.
    #[arg(long, group = "mode")]
    pub source: bool,
    /// Source lines interleaved with their instructions.
    #[arg(long, group = "mode")]
    pub both: bool,
    /// The N hottest instructions across all images (instead of --symbol), or of one image
    /// with --image.
    #[arg(long, value_name = "N", conflicts_with_all = ["symbol", "min_percent"])]
    pub top: Option<usize>,
    /// Only the instructions (or source lines) with at least PCT percent of the function's
    /// samples, each with --context rows around it; the rows left out are counted in one line
    /// per run (JSON: {"type": "gap", "skipped": N}). For big functions.
    #[arg(long, value_name = "PCT", value_parser = parse_percent)]
    pub min_percent: Option<f64>,
    /// Rows shown before and after each row of --min-percent.
    #[arg(long, value_name = "N", default_value_t = 3, requires = "min_percent")]
    pub context: usize,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    pub format: Format,
    /// Assembly syntax.
    #[arg(long, value_enum, default_value = "att")]
    pub syntax: disasm::Syntax,
    /// Show each instruction's bytes in the table (JSON and CSV always have them).
    #[arg(long)]
    pub bytes: bool,
    /// Uncompressed vmlinux (with symbols) to disassemble kernel functions from.
    #[arg(long, value_name = "FILE")]
    pub vmlinux: Option<PathBuf>,
    #[command(flatten)]
    pub names: NamesArgs,
}

fn parse_percent(s: &str) -> Result<f64, String> {
    match s.trim_end_matches('%').parse::<f64>() {
        Ok(p) if (0.0..=100.0).contains(&p) => Ok(p),
        _ => Err(format!("{s:?} is not a percentage between 0 and 100")),
    }
}

/// What a listing shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Asm,
    Source,
    Both,
}

impl Mode {
    pub fn name(self) -> &'static str {
        match self {
            Self::Asm => "asm",
            Self::Source => "source",
            Self::Both => "both",
        }
    }
}

impl Args {
    pub fn mode(&self) -> Mode {
        if self.source {
            Mode::Source
        } else if self.both {
            Mode::Both
        } else {
            Mode::Asm
        }
    }
}

/// Errors of a `dcpilist` run.
#[derive(Debug, thiserror::Error)]
pub enum ListError {
    #[error(transparent)]
    Prof(#[from] ProfError),
    /// A data or usage problem (exit 2): the message names what and what to do.
    #[error("{0}")]
    Data(String),
    #[error("--symbol {spec:?} is ambiguous in {image}: {} functions match", candidates.len())]
    Ambiguous { spec: String, image: String, candidates: Vec<String> },
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
}

impl ListError {
    /// Process exit status: 2 for usage and data errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Prof(e) => e.exit_code(),
            Self::Output(_) => 1,
            _ => 2,
        }
    }
}

impl Args {
    /// Whose profiles `--command`/`--cgroup` select (`None`: everyone's, the flat profiles).
    pub fn who(&self) -> Option<WhoSel> {
        WhoSel::of(self.command.as_deref(), self.cgroup.as_deref())
    }
}
