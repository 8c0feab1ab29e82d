//! `--stack-health`: per image, the share of the call stacks through it that ended early, and
//! why where the stack says so, so that a user knows which `--callers`/`--callees` answers and
//! flame-graph towers to trust and which images to rebuild with frame pointers (or give CFI
//! and record with `callchains = "dwarf"`).
//!
//! A stack *ended early* when dcpid flagged it truncated or when its outermost frame is no
//! entry point ([`SymStack::broken`]). It is charged to the image of its outermost frame that
//! names one (an `[unknown]` frame after it is what a frame-pointer walk read from a register
//! the image used for something else): that is where unwinding could not go on. Why, as far as
//! the stack tells:
//!
//! * `no_caller`: flagged truncated with a single user frame: the unwinder found no caller of
//!   the sampled function at all (a frame-pointer walk in code built without frame pointers,
//!   or no unwind information for the pc);
//! * `lost`: not flagged, but it ends in a frame that is no entry point: the chain of saved
//!   frame pointers led elsewhere (code without frame pointers that used `rbp` as a register);
//! * `cut`: flagged truncated deeper in the stack: dcpid's depth bound (`sample_max_stack`),
//!   the end of the copied user stack (`sample_user_stack`), or a frame the unwinder could not
//!   step past.

use std::collections::HashMap;
use std::io::Write;

use profile_format::{ImageId, ImageKind};
use serde::Serialize;

use super::output::TableFormat;
use super::stacks::SymStack;
use crate::args::{Selection, SymbolSearch};
use dcpi_report::image::kind_name;
use dcpi_report::render::{Column, Kind, Output, Style, Table, Value};
use dcpi_report::report::SymbolMode;

/// An image whose stacks end early this often (percent of the stacks through it) or more is
/// not sound. A sound image still shows a few: a sample taken in a function's prologue or
/// epilogue before its frame is set up loses its caller under frame pointers.
pub const THRESHOLD_PERCENT: f64 = 5.0;
/// Fewer stack samples through an image than this give no verdict (`few-samples`).
pub const MIN_SAMPLES: u64 = 20;

/// `--stack-health`.
#[derive(Clone, Debug)]
pub struct StackHealth {
    pub sel: Selection,
    pub symbols: SymbolSearch,
    pub mode: SymbolMode,
    pub limit: Option<usize>,
    pub format: TableFormat,
}

/// Why a stack ended early (module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cause {
    NoCaller,
    Lost,
    Cut,
}

/// What the report says of an image.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Verdict {
    /// Its stacks reach a root (fewer than [`THRESHOLD_PERCENT`] end early in it).
    Sound,
    /// Unwinding stops at its frames: no caller found, or a frame-pointer chain lost. Rebuild
    /// it with `-fno-omit-frame-pointer`, or give it CFI (`.eh_frame`) and record with
    /// `callchains = "dwarf"`.
    NoFramePointers,
    /// Its stacks are cut deeper: the depth bound, the user stack copy's end, or a frame
    /// without unwind information.
    CutShort,
    /// Fewer than [`MIN_SAMPLES`] stack samples through it: no verdict.
    FewSamples,
}

impl Verdict {
    pub fn name(self) -> &'static str {
        match self {
            Self::Sound => "sound",
            Self::NoFramePointers => "no-frame-pointers",
            Self::CutShort => "cut-short",
            Self::FewSamples => "few-samples",
        }
    }

    /// What to do about it.
    pub fn advice(self) -> &'static str {
        match self {
            Self::Sound => "",
            Self::NoFramePointers => {
                "rebuild with -fno-omit-frame-pointer, or give it CFI (.eh_frame) and record \
                 with callchains = \"dwarf\""
            }
            Self::CutShort => {
                "deep stacks or a frame without unwind information: raise sample_max_stack \
                 (and sample_user_stack with callchains = \"dwarf\")"
            }
            Self::FewSamples => "",
        }
    }
}

/// One image's row.
#[derive(Clone, Debug, Serialize)]
pub struct HealthRow {
    pub image: String,
    pub kind: &'static str,
    pub build_id: Option<String>,
    /// Samples (first event) of the stacks with a frame in the image.
    pub stack_samples: u64,
    /// Of those, samples of the stacks that ended early (here or in another image).
    pub ended_early: u64,
    /// Of all stacks, samples of those that ended early in this image.
    pub ended_here: u64,
    /// `ended_here` as a share of `stack_samples`: what the verdict is made of.
    pub percent: f64,
    pub no_caller: u64,
    pub lost: u64,
    pub cut: u64,
    pub verdict: Verdict,
    pub advice: &'static str,
}

/// The `--stack-health` report.
#[derive(Clone, Debug, Serialize)]
pub struct HealthReport {
    pub report: &'static str,
    pub database: String,
    pub event: String,
    /// Samples of the first event that have a stack.
    pub stack_samples: u64,
    /// Of those, samples of stacks that ended early.
    pub ended_early: u64,
    pub ended_early_percent: f64,
    pub threshold_percent: f64,
    pub rows_omitted: usize,
    pub rows: Vec<HealthRow>,
}

fn user(kind: ImageKind) -> bool {
    match kind {
        ImageKind::Kernel | ImageKind::KernelModule => false,
        ImageKind::Elf | ImageKind::Vdso | ImageKind::Anon | ImageKind::Unknown => true,
    }
}

/// Why `s` ended early, or `None` if it did not.
pub fn cause(s: &SymStack) -> Option<Cause> {
    if s.truncated {
        let users = s.frames.iter().filter(|f| user(f.kind)).count();
        return Some(if users == 1 { Cause::NoCaller } else { Cause::Cut });
    }
    s.broken().then_some(Cause::Lost)
}

/// Index of the frame a stack that ended early is charged to (module docs).
fn blamed(s: &SymStack) -> Option<usize> {
    let last = s.frames.len().checked_sub(1)?;
    Some(s.frames.iter().rposition(|f| f.kind != ImageKind::Unknown).unwrap_or(last))
}

/// The report over the first event's stacks.
pub fn health_report(
    stacks: &[SymStack],
    event: &str,
    database: &str,
    limit: Option<usize>,
) -> HealthReport {
    #[derive(Default)]
    struct Acc {
        kind: Option<ImageKind>,
        build_id: Option<String>,
        through: u64,
        early: u64,
        no_caller: u64,
        lost: u64,
        cut: u64,
    }
    let mut per: HashMap<(String, Option<ImageId>), Acc> = HashMap::new();
    let (mut total, mut early) = (0u64, 0u64);
    let mut seen: Vec<(&str, Option<&ImageId>)> = Vec::new();
    for s in stacks.iter().filter(|s| s.event == 0) {
        total += s.samples;
        let ended = cause(s);
        seen.clear();
        for f in &s.frames {
            let key = (f.image.as_str(), f.image_id.as_ref());
            if seen.contains(&key) {
                continue;
            }
            seen.push(key);
            let a = per.entry((f.image.clone(), f.image_id.clone())).or_default();
            a.kind = Some(f.kind);
            a.build_id = match &f.image_id {
                Some(ImageId::BuildId(b)) => Some(hex::encode(b)),
                _ => None,
            };
            a.through += s.samples;
            if ended.is_some() {
                a.early += s.samples;
            }
        }
        let (Some(c), Some(i)) = (ended, blamed(s)) else { continue };
        early += s.samples;
        let f = &s.frames[i];
        let a = per.entry((f.image.clone(), f.image_id.clone())).or_default();
        match c {
            Cause::NoCaller => a.no_caller += s.samples,
            Cause::Lost => a.lost += s.samples,
            Cause::Cut => a.cut += s.samples,
        }
    }
    let pct = |n: u64, d: u64| if d == 0 { 0.0 } else { 100.0 * n as f64 / d as f64 };
    let mut rows: Vec<HealthRow> = per
        .into_iter()
        .map(|((image, _), a)| {
            let here = a.no_caller + a.lost + a.cut;
            let percent = pct(here, a.through);
            let verdict = if a.through < MIN_SAMPLES {
                Verdict::FewSamples
            } else if percent < THRESHOLD_PERCENT {
                Verdict::Sound
            } else if a.no_caller + a.lost >= a.cut {
                Verdict::NoFramePointers
            } else {
                Verdict::CutShort
            };
            HealthRow {
                image,
                kind: kind_name(a.kind.unwrap_or(ImageKind::Unknown)),
                build_id: a.build_id,
                stack_samples: a.through,
                ended_early: a.early,
                ended_here: here,
                percent,
                no_caller: a.no_caller,
                lost: a.lost,
                cut: a.cut,
                verdict,
                advice: verdict.advice(),
            }
        })
        .collect();
    // Worst first: the images that lose the most samples' callers.
    rows.sort_by(|a, b| {
        b.ended_here
            .cmp(&a.ended_here)
            .then(b.stack_samples.cmp(&a.stack_samples))
            .then_with(|| a.image.cmp(&b.image))
    });
    let keep = limit.unwrap_or(usize::MAX).min(rows.len());
    let rows_omitted = rows.len() - keep;
    rows.truncate(keep);
    HealthReport {
        report: "stack-health",
        database: database.to_owned(),
        event: event.to_owned(),
        stack_samples: total,
        ended_early: early,
        ended_early_percent: pct(early, total),
        threshold_percent: THRESHOLD_PERCENT,
        rows_omitted,
        rows,
    }
}

/// Write the report through the one renderer: text (image last), CSV (image first) or JSON.
pub fn write(out: &mut dyn Write, r: &HealthReport, format: TableFormat) -> std::io::Result<()> {
    let mut t = Table::new();
    t.columns([
        Column::new("image", Kind::Text),
        Column::new("kind", Kind::Text),
        Column::new("stacks", Kind::Count).csv("stack_samples"),
        Column::new("ended early", Kind::Count).csv("ended_early"),
        Column::new("here", Kind::Count).csv("ended_here"),
        Column::new("%", Kind::Decimal(1)).csv("percent"),
        Column::new("no caller", Kind::Count).csv("no_caller"),
        Column::new("lost", Kind::Count),
        Column::new("cut", Kind::Count),
        Column::new("verdict", Kind::Text),
        Column::new("advice", Kind::Text),
    ]);
    // Text: the numbers, the verdict, the image (free width); advice under the table.
    t.text_columns(vec![2, 3, 4, 5, 6, 7, 8, 9, 0]);
    t.head(format!("# database: {}", r.database));
    t.head(format!(
        "# event {}: {} stack samples, {} ({:.1}%) ended early (truncated, or not at an entry \
         point); an image is sound below {}%",
        r.event, r.stack_samples, r.ended_early, r.ended_early_percent, r.threshold_percent
    ));
    for row in &r.rows {
        t.row(vec![
            Value::image(row.image.as_str(), row.build_id.as_deref()).into(),
            row.kind.into(),
            row.stack_samples.into(),
            row.ended_early.into(),
            row.ended_here.into(),
            row.percent.into(),
            row.no_caller.into(),
            row.lost.into(),
            row.cut.into(),
            row.verdict.name().into(),
            row.advice.into(),
        ]);
    }
    if r.rows_omitted > 0 {
        t.foot(format!("# {} more images (--limit)", r.rows_omitted));
    }
    for v in [Verdict::NoFramePointers, Verdict::CutShort] {
        if r.rows.iter().any(|row| row.verdict == v) {
            t.foot(format!("# {}: {}", v.name(), v.advice()));
        }
    }
    t.write(out, Output::from(format), Style::default(), r)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::prof::stacks::Frame;

    fn fr(image: &str, kind: ImageKind, function: &str) -> Frame {
        Frame {
            image: image.into(),
            kind,
            image_id: (kind != ImageKind::Unknown)
                .then(|| ImageId::BuildId(image.as_bytes().to_vec())),
            offset: 0,
            function: function.into(),
        }
    }

    fn st(frames: Vec<Frame>, truncated: bool, samples: u64) -> SymStack {
        SymStack { dir: 0, event: 0, command: "t".into(), frames, truncated, samples }
    }

    /// A program built without frame pointers (`nofp`): its stacks stop at its own frames,
    /// flagged (no caller) or not (a chain lost into `[unknown]`); one built with them (`fp`)
    /// reaches `_start` through libc; a deep stack cut by the depth bound in `deep`.
    #[test]
    fn names_the_image_that_ends_stacks() {
        use ImageKind::{Elf, Kernel, Unknown};
        let libc = "/usr/lib/x86_64-linux-gnu/libc.so.6";
        let k = "[kernel.kallsyms]";
        let mut stacks = vec![
            st(vec![fr("nofp", Elf, "hot")], true, 70),
            st(
                vec![
                    fr("nofp", Elf, "hot"),
                    fr("nofp", Elf, "main"),
                    fr("[unknown]", Unknown, "[unknown]"),
                ],
                false,
                25,
            ),
            st(
                vec![fr(k, Kernel, "read"), fr("nofp", Elf, "main"), fr(libc, Elf, "_start")],
                false,
                5,
            ),
            st(
                vec![fr("fp", Elf, "hot"), fr("fp", Elf, "main"), fr(libc, Elf, "_start")],
                false,
                97,
            ),
            st(vec![fr("fp", Elf, "hot"), fr("fp", Elf, "main")], false, 3),
        ];
        let mut deep: Vec<Frame> = (0..64).map(|_| fr("deep", Elf, "rec")).collect();
        deep.insert(0, fr(k, Kernel, "page_fault"));
        stacks.push(st(deep, true, 40));
        let r = health_report(&stacks, "cpu-clock", "/db", None);
        let row = |name: &str| r.rows.iter().find(|x| x.image == name).expect(name);
        let n = row("nofp");
        assert_eq!((n.stack_samples, n.ended_here, n.no_caller, n.lost), (100, 95, 70, 25));
        assert_eq!(n.ended_early, 95);
        assert_eq!(n.verdict, Verdict::NoFramePointers);
        let f = row("fp");
        assert_eq!((f.stack_samples, f.ended_here, f.lost), (100, 3, 3));
        assert_eq!(f.verdict, Verdict::Sound);
        assert_eq!(row("deep").verdict, Verdict::CutShort);
        assert_eq!(row("deep").cut, 40);
        // libc is passed through by 102 samples and ends none; the kernel by 45, of which
        // 40 ended early (cut, in `deep`).
        assert_eq!((row(libc).stack_samples, row(libc).ended_here), (102, 0));
        assert_eq!((row(k).stack_samples, row(k).ended_early, row(k).ended_here), (45, 40, 0));
        assert_eq!(row(k).verdict, Verdict::Sound);
        // The unknown frame is not blamed: it only has the chain that was lost before it.
        assert_eq!((row("[unknown]").ended_early, row("[unknown]").ended_here), (25, 0));
        assert_eq!(row("[unknown]").verdict, Verdict::Sound);
        let few = health_report(&stacks[..1], "cpu-clock", "/db", None);
        assert_eq!(few.rows[0].verdict, Verdict::NoFramePointers, "70 samples");
        let few = health_report(&[st(vec![fr("x", Elf, "hot")], true, 19)], "e", "/db", None);
        assert_eq!(few.rows[0].verdict, Verdict::FewSamples);
        assert_eq!((r.stack_samples, r.ended_early), (240, 138));
        assert_eq!(r.rows[0].image, "nofp", "worst first");

        let mut csv = Vec::new();
        write(&mut csv, &r, TableFormat::Csv).expect("csv");
        let csv = String::from_utf8(csv).expect("utf-8");
        assert!(csv.starts_with(
            "image,kind,stack_samples,ended_early,ended_here,percent,no_caller,lost,cut,verdict,\
             advice\n"
        ));
        assert!(csv.contains("\nnofp,elf,100,95,95,95,70,25,0,no-frame-pointers,"), "{csv}");
        let mut text = Vec::new();
        write(&mut text, &r, TableFormat::Table).expect("text");
        let text = String::from_utf8(text).expect("utf-8");
        assert!(text.contains("no-frame-pointers  nofp"), "{text}");
        assert!(text.contains("# no-frame-pointers: rebuild with -fno-omit-frame-pointer"));
        let mut json = Vec::new();
        write(&mut json, &r, TableFormat::Json).expect("json");
        let v: serde_json::Value = serde_json::from_slice(&json).expect("json");
        assert_eq!(v["rows"][0]["verdict"], "no-frame-pointers");
        assert_eq!(v["report"], "stack-health");
        let limited = health_report(&stacks, "cpu-clock", "/db", Some(2));
        assert_eq!((limited.rows.len(), limited.rows_omitted), (2, r.rows.len() - 2));
    }
}
