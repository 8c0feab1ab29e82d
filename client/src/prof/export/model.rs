//! The export model every format is written from: [`Export`] with its images, functions,
//! locations and samples, and the XML escaper the SVG and HTML writers share. The writers
//! (flame, html, pprof, speedscope) import it from here, not from their parent, so the export
//! modules form no cycle.

use std::collections::HashMap;

use dcpi_report::report::{EventInfo, ImageReport, Scope};
use dcpi_report::timeline::Bucket;

/// One image (an identity: build-id or fallback id; all `[unknown]` samples are one image).
#[derive(Clone, Debug)]
pub struct Image {
    /// As the per-image report names it (`/usr/bin/x`, `[kernel.kallsyms]`, `[unknown]`).
    pub name: String,
    pub kind: &'static str,
    pub build_id: Option<String>,
    /// Whether some offset of the image was resolved to a symbol.
    pub symbolized: bool,
    /// Largest offset seen (for the pprof mapping's extent).
    pub max_offset: u64,
}

/// A function as dcpi's symbolizer names it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Function {
    /// Demangled name (or `IMAGE+0xOFFSET`, `[unknown: reason]`, ...).
    pub name: String,
    /// Name in the symbol table (mangled), when a symbol covers the address.
    pub system_name: Option<String>,
    /// Source file (innermost DWARF frame), with `--lines`.
    pub file: Option<String>,
}

/// One sampled address.
#[derive(Clone, Debug)]
pub struct Location {
    pub image: usize,
    /// The stored offset: file offset (kernel: from the text or module base).
    pub offset: u64,
    pub function: usize,
    /// Source line, with `--lines`.
    pub line: Option<u32>,
}

/// Counts of one stack on one host in one epoch for one event. Kept small (32 bytes): a fleet
/// export holds one per distinct (address, host, epoch).
#[derive(Clone, Copy, Debug)]
pub struct Sample {
    /// Index into [`Export::stacks`].
    pub stack: u32,
    pub host: u32,
    pub epoch: u32,
    pub event: u32,
    pub samples: u64,
    /// Weighted estimate of events (see the report's NUMBERS).
    pub events: f64,
}

/// Everything an exporter needs.
#[derive(Debug)]
pub struct Export {
    pub scope: Scope,
    pub events: Vec<EventInfo>,
    pub images: Vec<Image>,
    pub functions: Vec<Function>,
    pub locations: Vec<Location>,
    /// Distinct stacks: location indices, leaf first.
    pub stacks: Vec<Vec<usize>>,
    /// Commands (comm) that root the call stacks (FORMAT.md §13), indexed by the values of
    /// [`Self::stack_commands`].
    pub commands: Vec<String>,
    /// The command of each stack that came from a stack file, by index into [`Self::stacks`]:
    /// such a stack's root is its command, as in `stackcollapse-perf`'s output. A stack not in
    /// it (a flat sample's) is rooted at its image.
    pub stack_commands: HashMap<u32, u32>,
    pub samples: Vec<Sample>,
    /// Host and epoch names indexed by [`Sample::host`] and [`Sample::epoch`].
    pub hosts: Vec<String>,
    pub epochs: Vec<String>,
    /// Start of the earliest epoch (Unix ns) and the time sampled from it (see `times`).
    pub time_nanos: i64,
    pub duration_nanos: i64,
    /// The per-image report of the same selection.
    pub image_report: ImageReport,
    /// Weighted events per (epoch, image name), for trend charts.
    pub per_epoch: Vec<HashMap<String, f64>>,
    /// Samples of the first event per time bucket (stored slice length), from the slice logs
    /// (FORMAT.md §14): the HTML report's timeline. Empty where no slices were recorded (and
    /// for the formats that do not draw it).
    pub timeline: Vec<Bucket>,
}

impl Export {
    /// Folded stacks, root first (`image;function`), with raw samples of the first event,
    /// merged by name and sorted.
    pub fn folded(&self) -> Vec<(Vec<String>, u64)> {
        let mut per_stack = vec![0u64; self.stacks.len()];
        for s in self.samples.iter().filter(|s| s.event == 0) {
            per_stack[s.stack as usize] += s.samples;
        }
        // Different addresses have the same names: merge by name.
        let mut m: HashMap<Vec<String>, u64> = HashMap::new();
        for (i, &n) in per_stack.iter().enumerate() {
            if n > 0 {
                *m.entry(self.frames(i as u32)).or_default() += n;
            }
        }
        let mut v: Vec<(Vec<String>, u64)> = m.into_iter().filter(|(_, c)| *c > 0).collect();
        v.sort();
        v
    }

    /// The command of stack `stack` (index into [`Self::stacks`]), if it came from a stack file.
    pub fn command(&self, stack: u32) -> Option<&str> {
        self.stack_commands.get(&stack).map(|&c| self.commands[c as usize].as_str())
    }

    /// Frame names of stack `stack` (index into [`Self::stacks`]), root first: its command
    /// (call stacks) or the image of its outermost location (flat samples), then functions.
    pub fn frames(&self, stack_ix: u32) -> Vec<String> {
        let stack = &self.stacks[stack_ix as usize];
        let mut f = Vec::with_capacity(stack.len() + 1);
        if let Some(c) = self.command(stack_ix) {
            f.push(c.to_owned());
        } else if let Some(&outer) = stack.last() {
            f.push(self.images[self.locations[outer].image].name.clone());
        }
        for &l in stack.iter().rev() {
            f.push(self.functions[self.locations[l].function].name.clone());
        }
        f
    }

    /// Location indices of a sample's stack, leaf first.
    pub fn stack(&self, s: &Sample) -> &[usize] {
        &self.stacks[s.stack as usize]
    }

    /// Name of the first event (what folded stacks and flame graphs count).
    pub fn first_event(&self) -> &str {
        self.events.first().map_or("samples", |e| e.name.as_str())
    }
}

/// Escape text for XML/HTML content and attribute values.
pub fn xml(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}
