//! Folded stacks and dcpi's own flame graph SVG.
//!
//! dcpi draws its flame graphs itself rather than linking `inferno` (CDDL-1.0; see README.md
//! for the reasoning). The picture follows flamegraph.pl and inferno: frames ordered by name
//! per parent, the root at the bottom, hover for details, click to zoom, Ctrl-F or "Search"
//! for a regular expression (matches turn magenta and their share of the total is shown),
//! `?s=REGEX` in the URL searches at load.

use dcpi_report::escape;
use dcpi_report::report;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write};

use super::model::{xml, Export};

/// The script of the SVG (and of the HTML report, which shares it).
pub const SCRIPT: &str = include_str!("flame.js");

const WIDTH: f64 = 1200.0;
const PAD: f64 = 10.0;
const FRAME_H: f64 = 16.0;
const TOP: f64 = 36.0;
const BOTTOM: f64 = 30.0;
/// Frames narrower than this (px at full width) are left out, as inferno does.
const MIN_WIDTH: f64 = 0.1;
/// Approximate advance of one character of the 11px monospace labels.
const CHAR_W: f64 = 6.7;

/// `image;function count` lines (root first), counts summing to the first event's samples.
/// `;` inside a name would split the frame, so it is written as `:`.
pub fn write_folded(out: &mut dyn Write, x: &Export) -> io::Result<()> {
    for (stack, count) in x.folded() {
        // A text format read on terminals too: format characters escaped as in tables.
        let names: Vec<String> =
            stack.iter().map(|f| escape::terminal(f).replace(';', ":")).collect();
        writeln!(out, "{} {count}", names.join(";"))?;
    }
    Ok(())
}

#[derive(Default)]
struct Node {
    value: u64,
    children: BTreeMap<String, Self>,
}

impl Node {
    fn depth(&self) -> usize {
        self.children.values().map(|c| c.depth() + 1).max().unwrap_or(0)
    }
}

fn tree(stacks: &[(Vec<String>, u64)]) -> Node {
    let mut root = Node::default();
    for (stack, v) in stacks {
        root.value += v;
        let mut n = &mut root;
        for f in stack {
            n = n.children.entry(f.clone()).or_default();
            n.value += v;
        }
    }
    root
}

/// Deterministic warm colour per name (flamegraph.pl's "hot" palette); images (depth 1) blue.
fn colour(name: &str, depth: usize) -> String {
    let h = name
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let r1 = (h & 0xff) as f64 / 255.0;
    let r2 = ((h >> 8) & 0xff) as f64 / 255.0;
    let r3 = ((h >> 16) & 0xff) as f64 / 255.0;
    if depth == 1 {
        return format!(
            "rgb({},{},{})",
            80 + (r1 * 55.0) as u32,
            150 + (r2 * 60.0) as u32,
            200 + (r3 * 55.0) as u32
        );
    }
    if depth == 0 {
        return "rgb(200,200,200)".to_owned();
    }
    format!("rgb({},{},{})", 205 + (r1 * 50.0) as u32, (r2 * 230.0) as u32, (r3 * 55.0) as u32)
}

/// The text that fits in a frame `width` px wide (flame.js's `fit` does the same on zoom).
fn label(name: &str, width: f64, depth: usize) -> String {
    let fit = ((width - 6.0) / CHAR_W).floor();
    if fit < 3.0 {
        return String::new();
    }
    let fit = fit as usize;
    // An image frame too narrow for its path shows the file name first.
    let name = match name.rfind('/') {
        Some(i) if depth == 1 && name.chars().count() > fit => &name[i + 1..],
        _ => name,
    };
    if name.chars().count() <= fit {
        name.to_owned()
    } else {
        let mut s: String = name.chars().take(fit - 2).collect();
        s.push_str("..");
        s
    }
}

struct Draw<'a> {
    out: &'a mut String,
    total: u64,
    scale: f64,
    height: f64,
    unit: &'a str,
}

impl Draw<'_> {
    fn frame(&mut self, name: &str, node: &Node, x0: u64, depth: usize) {
        let w = node.value as f64 * self.scale;
        if w < MIN_WIDTH {
            return;
        }
        let x = PAD + x0 as f64 * self.scale;
        let y = self.height - BOTTOM - (depth as f64 + 1.0) * FRAME_H;
        let pct = 100.0 * node.value as f64 / self.total.max(1) as f64;
        let n = xml(name);
        let _ = writeln!(
            self.out,
            "<g class=\"f\" data-n=\"{n}\" data-x=\"{x0}\" data-w=\"{}\" data-d=\"{depth}\"><title>{n} ({} {}, {pct:.2}%)</title>\
             <rect x=\"{x:.2}\" y=\"{y:.1}\" width=\"{w:.2}\" height=\"{:.1}\" rx=\"2\" fill=\"{}\"/>\
             <text x=\"{:.2}\" y=\"{:.1}\">{}</text></g>",
            node.value,
            node.value,
            self.unit,
            FRAME_H - 1.0,
            colour(name, depth),
            x + 3.0,
            y + FRAME_H - 4.5,
            xml(&label(name, w, depth)),
        );
        let mut cx = x0;
        for (child, c) in &node.children {
            self.frame(child, c, cx, depth + 1);
            cx += c.value;
        }
    }
}

/// The `<svg>` element of a flame graph of `stacks` (root first). `standalone` adds the XML
/// declaration and the script; the HTML report includes the script once itself.
pub fn svg(stacks: &[(Vec<String>, u64)], title: &str, unit: &str, standalone: bool) -> String {
    let root = tree(stacks);
    let depth = root.depth() + 1;
    let height = TOP + depth as f64 * FRAME_H + BOTTOM;
    let mut out = String::new();
    if standalone {
        out.push_str("<?xml version=\"1.0\" standalone=\"no\"?>\n");
    }
    let _ = write!(
        out,
        "<svg version=\"1.1\" class=\"dcpi-flame\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" xmlns=\"http://www.w3.org/2000/svg\" \
         data-total=\"{}\" data-unit=\"{}\" data-width=\"{WIDTH}\" data-pad=\"{PAD}\" data-charw=\"{CHAR_W}\">\n\
         <style>.dcpi-flame text {{ font: 11px monospace; fill: #000; }} \
         .dcpi-flame .f {{ cursor: pointer; }} .dcpi-flame .f:hover rect {{ stroke: #000; stroke-width: 0.5; }} \
         .dcpi-flame .anc rect {{ opacity: 0.5; }} .dcpi-flame .ctl {{ cursor: pointer; fill: #336; }} \
         .dcpi-flame .title {{ font: 15px sans-serif; }}</style>\n\
         <rect x=\"0\" y=\"0\" width=\"{WIDTH}\" height=\"{height}\" fill=\"#f8f8f0\"/>\n\
         <text class=\"title\" x=\"{}\" y=\"22\" text-anchor=\"middle\">{}</text>\n\
         <text class=\"ctl reset\" x=\"{PAD}\" y=\"22\" opacity=\"0.3\">Reset Zoom</text>\n\
         <text class=\"ctl search\" x=\"{}\" y=\"22\">Search</text>\n\
         <text class=\"details\" x=\"{PAD}\" y=\"{}\"> </text>\n\
         <text class=\"matched\" x=\"{}\" y=\"{}\" text-anchor=\"end\"></text>\n<g class=\"frames\">\n",
        root.value,
        xml(unit),
        WIDTH / 2.0,
        xml(title),
        WIDTH - PAD - 50.0,
        height - 10.0,
        WIDTH - PAD,
        height - 10.0,
    );
    let scale = if root.value > 0 { (WIDTH - 2.0 * PAD) / root.value as f64 } else { 0.0 };
    let mut d = Draw { out: &mut out, total: root.value, scale, height, unit };
    d.frame("all", &root, 0, 0);
    out.push_str("</g>\n");
    if standalone {
        let _ = write!(
            out,
            "<script type=\"text/ecmascript\"><![CDATA[\n{SCRIPT}\n\
             // The enclosing svg, also when this file is pasted into an HTML page.\n\
             dcpiFlame((document.currentScript && document.currentScript.closest('svg')) \
             || document.documentElement);\n]]></script>\n"
        );
    }
    out.push_str("</svg>\n");
    out
}

/// What the flame graph's widths count: `ns` for a time-weighted event (off-CPU time), else
/// `samples`.
pub fn unit(x: &Export) -> &'static str {
    if report::time_weighted(x.first_event()) {
        "ns"
    } else {
        "samples"
    }
}

/// Title of the flame graph of an export.
pub fn title(x: &Export) -> String {
    let what = if unit(x) == "ns" { "time (ns)" } else { "samples" };
    format!(
        "{} {what}, {} ({})",
        x.first_event(),
        x.scope.hosts.join(", "),
        epochs_text(&x.scope.epochs)
    )
}

pub fn epochs_text(e: &[String]) -> String {
    match e {
        [] => "no epoch".to_owned(),
        [one] => one.clone(),
        [first, .., last] => format!("{first} .. {last}, {} epochs", e.len()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_nested_and_sized_by_their_counts() {
        let stacks = vec![
            (vec!["img".to_owned(), "a<b>".to_owned()], 30),
            (vec!["img".to_owned(), "c".to_owned()], 10),
        ];
        let s = svg(&stacks, "t", "samples", true);
        assert!(s.contains("data-total=\"40\""), "{s}");
        assert!(s.contains("data-n=\"a&lt;b&gt;\" data-x=\"0\" data-w=\"30\" data-d=\"2\""), "{s}");
        assert!(s.contains("data-n=\"c\" data-x=\"30\" data-w=\"10\" data-d=\"2\""), "{s}");
        assert!(s.contains("data-n=\"img\" data-x=\"0\" data-w=\"40\" data-d=\"1\""), "{s}");
        assert!(s.contains("dcpiFlame((document.currentScript"));
    }

    #[test]
    fn labels_are_cut_to_the_frame() {
        assert_eq!(label("abcdef", 1000.0, 2), "abcdef");
        assert_eq!(label("abcdefghijklmnop", 6.0 + 6.0 * CHAR_W, 2), "abcd..");
        assert_eq!(label("abc", 10.0, 2), "");
        assert_eq!(label("/usr/lib/libc.so.6", 6.0 + 10.0 * CHAR_W, 1), "libc.so.6");
        assert_eq!(label("/usr/lib/libc.so.6", 6.0 + 10.0 * CHAR_W, 2), "/usr/lib..");
    }
}
