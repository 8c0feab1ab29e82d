//! `dcpiprof --symbols` without `--image`: the hottest symbols of every image in one table,
//! each row's share of the machine's total (every image, `[unknown]` included).

use std::collections::BTreeMap;

use profile_format::{ImageId, ImageKind};
use serde::Serialize;

use dcpi_report::debuginfo::Locator;
use dcpi_report::image::{build_id_hex, image_display, kind_name};
use dcpi_report::report::{
    self, pct, truncate, Counts, EventCount, Head, SymbolContext, SymbolMode, Weights,
};
use dcpi_report::select::Loaded;
use dcpi_report::symcache::SymbolCache;

/// A row: one symbol of one image. Its `percent`s (top level and per event) are of the
/// machine's total of that event.
#[derive(Clone, Debug, Serialize)]
pub struct GlobalRow {
    pub image: String,
    pub kind: &'static str,
    pub build_id: Option<String>,
    pub symbol: String,
    #[serde(flatten)]
    pub counts: Counts,
}

dcpi_report::counts_deref!(GlobalRow);

/// The report.
#[derive(Clone, Debug, Serialize)]
pub struct GlobalReport {
    #[serde(flatten)]
    pub head: Head,
    pub rows: Vec<GlobalRow>,
}

/// Symbolize every image of `loaded` (loaded with its counts) and rank all symbols together.
pub fn global_symbol_report(
    loaded: &Loaded,
    w: &Weights,
    locator: &mut Locator,
    cache: &mut SymbolCache,
    warn: &mut dyn FnMut(String),
    db: &str,
    limit: Option<usize>,
) -> GlobalReport {
    // One group per image identity, as the per-image report has one row per image.
    let mut groups: BTreeMap<(ImageKind, Option<ImageId>), Vec<usize>> = BTreeMap::new();
    for (i, p) in loaded.profiles.iter().enumerate() {
        if w.per_profile[i].is_none() {
            continue;
        }
        let h = &p.profile.header;
        let id = (h.kind != ImageKind::Unknown).then(|| h.image_id.clone());
        groups.entry((h.kind, id)).or_default().push(i);
    }
    let totals: Vec<f64> = w.infos.iter().map(|i| i.events as f64).collect();
    let mut rows: Vec<(Vec<f64>, GlobalRow)> = Vec::new();
    for ((kind, id), idx) in groups {
        let cx = SymbolContext {
            loaded,
            weights: w,
            locator: &mut *locator,
            cache: &mut *cache,
            mode: SymbolMode::default(),
            warn: &mut *warn,
        };
        let r = report::symbol_report(cx, &idx, db, None);
        let image = image_display(&loaded.profiles[idx[0]].profile.header);
        for s in r.rows {
            let ev: Vec<f64> = s.counts.per_event.iter().map(|c| c.events as f64).collect();
            let counts: Vec<EventCount> = s
                .counts
                .per_event
                .into_iter()
                .zip(&totals)
                .map(|(c, &t)| EventCount { percent: pct(c.events as f64, t), ..c })
                .collect();
            rows.push((
                ev,
                GlobalRow {
                    image: image.clone(),
                    kind: kind_name(kind),
                    build_id: id.as_ref().and_then(build_id_hex),
                    symbol: s.symbol,
                    // The cumulative percent is set once every row is ranked.
                    counts: Counts::new(counts, 0.0),
                },
            ));
        }
    }
    rows.sort_by(|a, b| {
        let (x, y) = (a.0.first().copied().unwrap_or(0.0), b.0.first().copied().unwrap_or(0.0));
        y.total_cmp(&x)
            .then(b.1.counts.samples.cmp(&a.1.counts.samples))
            .then_with(|| (&a.1.image, &a.1.symbol).cmp(&(&b.1.image, &b.1.symbol)))
    });
    let mut cum = 0.0;
    let total0 = totals.first().copied().unwrap_or(0.0);
    let mut out: Vec<GlobalRow> = rows
        .into_iter()
        .map(|(ev, mut r)| {
            cum += ev.first().copied().unwrap_or(0.0);
            r.counts.cumulative_percent = pct(cum, total0);
            r
        })
        .collect();
    let omitted = truncate(&mut out, limit);
    GlobalReport {
        head: Head::new("global-symbols", report::scope(loaded, db), w, omitted),
        rows: out,
    }
}
