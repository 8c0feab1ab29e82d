//! Per-symbol rows of a subset of a selection's profiles, and one image across its rebuilds:
//! what `dcpiprof --by`, `dcpidiff` and `dcpistats` share.

use profile_format::ImageKind;

use dcpi_report::debuginfo::Locator;
use dcpi_report::error::ProfError;
use dcpi_report::image;
use dcpi_report::report::{self, ImageFilter, SymbolContext, SymbolMode, SymbolRow, Weights};
use dcpi_report::select::Loaded;
use dcpi_report::symcache::SymbolCache;

/// The profiles of one image in a selection, builds merged.
#[derive(Debug, Clone)]
pub struct ImageProfiles {
    /// Indices into [`Loaded::profiles`].
    pub idx: Vec<usize>,
    /// Display path of the image.
    pub path: String,
    /// Distinct identities (build-id hex, or `f…` image id without one), sorted.
    pub builds: Vec<String>,
}

/// Resolve `spec` like `dcpiprof --image`, except that several builds of the same path (a
/// binary rebuilt within the selection) are merged rather than ambiguous: their symbols are
/// matched by name.
pub fn resolve_image_builds(
    loaded: &Loaded,
    w: &Weights,
    spec: &str,
) -> Result<ImageProfiles, ProfError> {
    let idx = match report::resolve_image(loaded, w, spec) {
        Ok(idx) => idx,
        Err(ProfError::Ambiguous { spec, candidates }) => {
            let same_path = candidates.iter().all(|c| c.path == candidates[0].path);
            if !same_path {
                return Err(ProfError::Ambiguous { spec, candidates });
            }
            let ids: Vec<ImageFilter> =
                candidates.iter().map(|c| ImageFilter::new(&c.image_id)).collect();
            (0..loaded.profiles.len())
                .filter(|&i| {
                    w.per_profile[i].is_some()
                        && ids.iter().any(|f| f.by_header(&loaded.profiles[i].profile.header))
                })
                .collect()
        }
        Err(e) => return Err(e),
    };
    let first = &loaded.profiles[idx[0]];
    let path = image::image_display(&first.profile.header);
    let mut builds: Vec<String> = idx
        .iter()
        .filter_map(|&i| {
            let h = &loaded.profiles[i].profile.header;
            match (&h.image_id, h.kind) {
                (_, ImageKind::Unknown) => None,
                (profile_format::ImageId::BuildId(b), _) => Some(hex::encode(b)),
                (profile_format::ImageId::Fallback(f), _) => Some(format!("f{}", hex::encode(f))),
            }
        })
        .collect();
    builds.sort();
    builds.dedup();
    Ok(ImageProfiles { idx, path, builds })
}

/// Binary lookup and symbol cache, kept across the per-selection reports of one run.
#[derive(Debug)]
pub struct Symbolizer {
    pub locator: Locator,
    pub cache: SymbolCache,
}

/// Per-symbol rows (first event of `w`) of the profiles `idx`, with where symbols came from.
pub fn symbol_rows(
    loaded: &Loaded,
    w: &Weights,
    idx: &[usize],
    sy: &mut Symbolizer,
    mode: SymbolMode,
    warn: &mut dyn FnMut(String),
) -> (Vec<SymbolRow>, report::ImageInfo) {
    let cx = SymbolContext {
        loaded,
        weights: w,
        locator: &mut sy.locator,
        cache: &mut sy.cache,
        mode,
        warn,
    };
    let r = report::symbol_report(cx, idx, "", None);
    (r.rows, r.image)
}
