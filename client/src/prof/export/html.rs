//! `--format html`: one self-contained page (inline CSS, script and SVG; nothing fetched when
//! it is opened): the per-image table, the per-symbol tables of the top images, the flame
//! graph, the timeline (samples per second over time, from the slice logs) and, when the
//! selection spans several epochs, the top images' share per epoch.
//! Tables sort by any column on a click.

use dcpi_report::timeline::{self, Bucket};
use std::collections::HashMap;
use std::fmt::Write as _;

use super::flame::{self, epochs_text};
use super::model::{xml, Export};

/// Per-symbol tables are drawn for this many images (largest first, `[unknown]` included).
const TOP_IMAGES: usize = 5;
/// Rows per per-symbol table unless `--limit` says otherwise.
const DEFAULT_SYMBOL_ROWS: usize = 100;
/// Images drawn in the trend chart.
const TREND_IMAGES: usize = 6;
const PALETTE: [&str; TREND_IMAGES] =
    ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];

const STYLE: &str = "
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #222; }
h1 { font-size: 1.5em; margin: 0 0 .3em; } h2 { margin-top: 1.6em; font-size: 1.2em; }
h3 { font-size: 1em; margin: 1.2em 0 .3em; font-family: monospace; }
.meta { color: #555; margin: 0; } nav a { margin-right: 1em; }
table { border-collapse: collapse; font-size: 13px; }
th, td { padding: 2px 8px; border-bottom: 1px solid #e4e4e4; }
td.s:first-child, td.n + td.s { min-width: 4em; }
th { background: #f0f0f0; cursor: pointer; user-select: none; position: sticky; top: 0; }
th[data-dir=asc]::after { content: ' \\25B2'; } th[data-dir=desc]::after { content: ' \\25BC'; }
td.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.s { font-family: monospace; word-break: break-all; }
.bar { display: inline-block; height: 9px; background: #e8743b; vertical-align: middle; }
.note { color: #666; font-size: 12px; }
svg { max-width: 100%; height: auto; }
";

const SORT_SCRIPT: &str = "
function dcpiSortable(table) {
  var heads = table.querySelectorAll('th');
  Array.prototype.forEach.call(heads, function (th, col) {
    th.addEventListener('click', function () {
      var dir = th.getAttribute('data-dir') === 'desc' ? 'asc' : 'desc';
      Array.prototype.forEach.call(heads, function (h) { h.removeAttribute('data-dir'); });
      th.setAttribute('data-dir', dir);
      var num = th.getAttribute('data-type') === 'num';
      var body = table.tBodies[0];
      var rows = Array.prototype.slice.call(body.rows);
      rows.sort(function (a, b) {
        var x = a.cells[col].getAttribute('data-v'), y = b.cells[col].getAttribute('data-v');
        var c = num ? (+x) - (+y) : (x < y ? -1 : x > y ? 1 : 0);
        return dir === 'asc' ? c : -c;
      });
      rows.forEach(function (r) { body.appendChild(r); });
    });
  });
}
";

fn pct(part: f64, total: f64) -> f64 {
    if total > 0.0 {
        100.0 * part / total
    } else {
        0.0
    }
}

/// A sortable table: `heads` are (title, numeric); cells are (sort value, shown html).
fn table(out: &mut String, heads: &[(&str, bool)], rows: &[Vec<(String, String)>]) {
    out.push_str("<table class=\"sortable\"><thead><tr>");
    for (h, num) in heads {
        let _ =
            write!(out, "<th data-type=\"{}\">{}</th>", if *num { "num" } else { "str" }, xml(h));
    }
    out.push_str("</tr></thead><tbody>\n");
    for r in rows {
        out.push_str("<tr>");
        for ((v, shown), (_, num)) in r.iter().zip(heads) {
            let _ = write!(
                out,
                "<td class=\"{}\" data-v=\"{}\">{shown}</td>",
                if *num { "n" } else { "s" },
                xml(v)
            );
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody></table>\n");
}

fn num(v: u64) -> (String, String) {
    (v.to_string(), v.to_string())
}

fn percent_cell(p: f64) -> (String, String) {
    (
        format!("{p:.4}"),
        format!(
            "{p:.2}<span class=\"bar\" style=\"width:{:.0}px;margin-left:6px\"></span>",
            p.clamp(0.0, 100.0)
        ),
    )
}

/// Build-ids are long: the first 12 digits, the whole id on hover.
fn short_id(id: &str) -> (String, String) {
    let short: String = id.chars().take(12).collect();
    (id.to_owned(), format!("<span title=\"{}\">{}</span>", xml(id), xml(&short)))
}

fn text(s: &str) -> (String, String) {
    (s.to_owned(), xml(s))
}

/// Bar chart of the timeline: one bar per bucket, as wide as its time and as high as its
/// samples per second (a gap where nothing was recorded), each with its numbers in a tooltip.
/// The `<svg>` carries the bucket count and the samples drawn (`data-buckets`,
/// `data-samples`) for tools and tests.
fn timeline_chart(x: &Export) -> String {
    use dcpi_report::timeline::utc;
    let b = &x.timeline;
    let (Some(t0), Some(t1)) = (b.first().map(|b| b.start), b.iter().map(|b| b.end).max()) else {
        return String::new();
    };
    let (w, h, left, top, bottom) = (1000.0, 140.0, 60.0, 10.0, 30.0);
    let span = (t1 - t0).max(1) as f64;
    let rate = |b: &Bucket| b.samples as f64 / b.seconds().max(1) as f64;
    let max = b.iter().map(rate).fold(0.0, f64::max).max(f64::MIN_POSITIVE);
    let total: u64 = b.iter().map(|b| b.samples).sum();
    let mut s = String::new();
    let _ = write!(
        s,
        "<svg class=\"timeline\" data-buckets=\"{}\" data-samples=\"{total}\" \
         xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" \
         font-size=\"11\" font-family=\"sans-serif\">",
        b.len(),
        w + left + 10.0,
        h + top + bottom,
        w + left + 10.0,
        h + top + bottom
    );
    let _ = write!(
        s,
        "<line x1=\"{left}\" y1=\"{y}\" x2=\"{x2}\" y2=\"{y}\" stroke=\"#999\"/>\
         <text x=\"{tx}\" y=\"{ty}\" text-anchor=\"end\">{max:.0}/s</text>\
         <text x=\"{tx}\" y=\"{y}\" text-anchor=\"end\">0</text>\
         <text x=\"{left}\" y=\"{by}\">{}</text>\
         <text x=\"{x2}\" y=\"{by}\" text-anchor=\"end\">{}</text>",
        xml(&utc(t0)),
        xml(&utc(t1)),
        y = top + h,
        x2 = left + w,
        tx = left - 4.0,
        ty = top + 10.0,
        by = top + h + 18.0,
    );
    for k in b {
        let bx = left + (k.start - t0) as f64 / span * w;
        let bw = (k.seconds() as f64 / span * w).max(0.5);
        let bh = rate(k) / max * h;
        let _ = write!(
            s,
            "<rect class=\"bucket\" x=\"{bx:.2}\" y=\"{:.2}\" width=\"{bw:.2}\" height=\"{bh:.2}\" \
             fill=\"#e8743b\" data-start=\"{}\" data-samples=\"{}\"><title>{} UTC, {} s: {} \
             samples ({:.1}/s)</title></rect>",
            top + h - bh,
            k.start,
            k.samples,
            xml(&utc(k.start)),
            k.seconds(),
            k.samples,
            rate(k)
        );
    }
    s.push_str("</svg>\n");
    s
}

/// Line chart of the top images' share of each epoch's events.
fn trend(x: &Export) -> String {
    let n = x.epochs.len();
    let mut totals: HashMap<&str, f64> = HashMap::new();
    for m in &x.per_epoch {
        for (k, v) in m {
            *totals.entry(k.as_str()).or_default() += v;
        }
    }
    let mut top: Vec<(&str, f64)> = totals.into_iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(b.0)));
    top.truncate(TREND_IMAGES);
    // Epoch ids hang down-left from their tick, so the left and bottom margins hold them.
    let (w, h, left, right, top_m, bottom) = (900.0, 340.0, 110.0, 20.0, 20.0, 90.0);
    let pw = w - left - right;
    let ph = h - top_m - bottom;
    let xpos = |i: usize| left + if n > 1 { pw * i as f64 / (n - 1) as f64 } else { pw / 2.0 };
    let ypos = |p: f64| top_m + ph * (1.0 - p / 100.0);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "<svg class=\"trend\" width=\"{w}\" height=\"{}\" viewBox=\"0 0 {w} {}\" xmlns=\"http://www.w3.org/2000/svg\" font-size=\"11\">",
        h + 20.0 + 20.0 * top.len() as f64,
        h + 20.0 + 20.0 * top.len() as f64
    );
    for p in [0.0, 25.0, 50.0, 75.0, 100.0] {
        let y = ypos(p);
        let _ = writeln!(s, "<line x1=\"{left}\" x2=\"{}\" y1=\"{y}\" y2=\"{y}\" stroke=\"#ddd\"/><text x=\"{}\" y=\"{}\" text-anchor=\"end\">{p}%</text>", w - right, left - 6.0, y + 4.0);
    }
    let step = (n / 12).max(1);
    for (i, e) in x.epochs.iter().enumerate() {
        if i % step == 0 || i + 1 == n {
            let _ = writeln!(
                s,
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"end\" transform=\"rotate(-30 {:.1} {})\">{}</text>",
                xpos(i),
                h - bottom + 14.0,
                xpos(i),
                h - bottom + 14.0,
                xml(e)
            );
        }
    }
    for (k, (name, _)) in top.iter().enumerate() {
        let colour = PALETTE[k % PALETTE.len()];
        let mut pts = String::new();
        let mut dots = String::new();
        for (i, m) in x.per_epoch.iter().enumerate() {
            let all: f64 = m.values().sum();
            let p = pct(m.get(*name).copied().unwrap_or(0.0), all);
            let _ = write!(pts, "{:.1},{:.1} ", xpos(i), ypos(p));
            let _ = write!(dots, "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"><title>{} {}: {p:.2}%</title></circle>", xpos(i), ypos(p), xml(name), xml(&x.epochs[i]));
        }
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" points=\"{}\"/>{dots}",
            pts.trim_end()
        );
        let ly = h + 10.0 + 20.0 * k as f64;
        let _ = writeln!(s, "<rect x=\"{left}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{colour}\"/><text x=\"{}\" y=\"{}\">{}</text>", ly - 10.0, left + 18.0, ly, xml(name));
    }
    s.push_str("</svg>\n");
    s
}

/// The page.
pub fn page(x: &Export, limit: Option<usize>) -> String {
    let r = &x.image_report;
    let mut s = String::new();
    let title =
        format!("dcpi profile: {} ({})", x.scope.hosts.join(", "), epochs_text(&x.scope.epochs));
    let _ = write!(
        s,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{}</title><style>{STYLE}</style></head><body>\n<h1>{}</h1>\n",
        xml(&title),
        xml(&title)
    );
    let _ = writeln!(s, "<p class=\"meta\">database {}</p>", xml(&x.scope.database));
    for e in &x.events {
        let _ = writeln!(
            s,
            "<p class=\"meta\">event {}: {} samples, mean period {:.0} (nominal {}), ~{} events</p>",
            xml(&e.name),
            e.samples,
            e.mean_period,
            e.nominal_period,
            e.events
        );
    }
    let several = x.epochs.len() > 1;
    let timeline = !x.timeline.is_empty();
    s.push_str("<nav>");
    if timeline {
        s.push_str("<a href=\"#timeline\">Timeline</a>");
    }
    if several {
        s.push_str("<a href=\"#trend\">Trend</a>");
    }
    s.push_str("<a href=\"#flame\">Flame graph</a><a href=\"#images\">Images</a><a href=\"#symbols\">Symbols</a></nav>\n");
    if timeline {
        let per = x.timeline.iter().map(Bucket::seconds).min().unwrap_or(1);
        let _ = writeln!(
            s,
            "<h2 id=\"timeline\">Timeline ({} samples per second, {} buckets; hover for counts)</h2>",
            xml(x.first_event()),
            timeline::duration(per)
        );
        s.push_str(&timeline_chart(x));
    }
    if several {
        s.push_str("<h2 id=\"trend\">Top images over epochs (share of each epoch's events)</h2>\n");
        s.push_str(&trend(x));
    }
    s.push_str("<h2 id=\"flame\">Flame graph</h2>\n<p class=\"note\">Click a frame to zoom, Search (or Ctrl-F) for a regular expression.</p>\n");
    s.push_str(&flame::svg(&x.folded(), &flame::title(x), flame::unit(x), false));

    // Per-image table (first event's columns, like the report's first column group).
    s.push_str("<h2 id=\"images\">Images</h2>\n");
    let ev = x.first_event();
    let rows: Vec<Vec<(String, String)>> = r
        .rows
        .iter()
        .take(limit.unwrap_or(usize::MAX))
        .map(|row| {
            vec![
                num(row.samples),
                num(row.events),
                percent_cell(row.percent),
                (
                    format!("{:.4}", row.cumulative_percent),
                    format!("{:.2}", row.cumulative_percent),
                ),
                text(row.kind),
                text(&row.image),
                short_id(row.build_id.as_deref().unwrap_or("")),
            ]
        })
        .collect();
    table(
        &mut s,
        &[
            (&format!("{ev} samples"), true),
            ("events", true),
            ("%", true),
            ("cum%", true),
            ("kind", false),
            ("image", false),
            ("build-id", false),
        ],
        &rows,
    );
    if let Some(l) = limit.filter(|&l| r.rows.len() > l) {
        let _ = writeln!(
            s,
            "<p class=\"note\">{} more image(s) not shown (--limit {l}).</p>",
            r.rows.len() - l
        );
    }

    // Per-symbol tables of the top images.
    s.push_str("<h2 id=\"symbols\">Symbols of the top images</h2>\n");
    let total_events: f64 = x.samples.iter().filter(|p| p.event == 0).map(|p| p.events).sum();
    let mut per_image: Vec<HashMap<usize, (u64, f64)>> = vec![HashMap::new(); x.images.len()];
    for p in x.samples.iter().filter(|p| p.event == 0) {
        let Some(&leaf) = x.stack(p).first() else { continue };
        let l = &x.locations[leaf];
        let e = per_image[l.image].entry(l.function).or_default();
        e.0 += p.samples;
        e.1 += p.events;
    }
    let mut order: Vec<(usize, f64)> =
        per_image.iter().enumerate().map(|(i, m)| (i, m.values().map(|v| v.1).sum())).collect();
    order.sort_by(|a, b| b.1.total_cmp(&a.1));
    let max_rows = limit.unwrap_or(DEFAULT_SYMBOL_ROWS);
    for &(img, img_events) in order.iter().filter(|o| o.1 > 0.0).take(TOP_IMAGES) {
        let mut syms: Vec<(&str, u64, f64)> = per_image[img]
            .iter()
            .map(|(&f, &(n, e))| (x.functions[f].name.as_str(), n, e))
            .collect();
        syms.sort_by(|a, b| b.2.total_cmp(&a.2).then(a.0.cmp(b.0)));
        let _ = writeln!(
            s,
            "<h3>{} <span class=\"note\">({:.2}% of all events, {} symbols)</span></h3>",
            xml(&x.images[img].name),
            pct(img_events, total_events),
            syms.len()
        );
        let rows: Vec<Vec<(String, String)>> = syms
            .iter()
            .take(max_rows)
            .map(|&(name, n, e)| {
                vec![
                    num(n),
                    num(e.round() as u64),
                    percent_cell(pct(e, img_events)),
                    (
                        format!("{:.4}", pct(e, total_events)),
                        format!("{:.2}", pct(e, total_events)),
                    ),
                    text(name),
                ]
            })
            .collect();
        table(
            &mut s,
            &[
                (&format!("{ev} samples"), true),
                ("events", true),
                ("% of image", true),
                ("% of all", true),
                ("symbol", false),
            ],
            &rows,
        );
        if syms.len() > max_rows {
            let _ = writeln!(
                s,
                "<p class=\"note\">{} more symbol(s) not shown.</p>",
                syms.len() - max_rows
            );
        }
    }
    let _ = write!(
        s,
        "<p class=\"note\">Generated by dcpiprof {}.</p>\n<script>\n{}\n{SORT_SCRIPT}\n\
         dcpiFlame(document.querySelector('svg.dcpi-flame'));\n\
         Array.prototype.forEach.call(document.querySelectorAll('table.sortable'), dcpiSortable);\n\
         document.body.setAttribute('data-ready', '1');\n</script>\n</body></html>\n",
        env!("CARGO_PKG_VERSION"),
        flame::SCRIPT
    );
    s
}
