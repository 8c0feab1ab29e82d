//! The profiles a per-instruction report (a listing, `--top`) reads, in one place.

use super::cli::{Args, ListError};
use crate::prof;
use dcpi_report::report::ImageFilter;
use dcpi_report::select::Loaded;

/// The profiles a per-instruction report reads: `--command`'s or `--cgroup`'s profiles, else
/// the published profiles (of `filter`'s image, or of every image with all their offsets for
/// `--top`). The current epoch's newest samples sit in time slices at a coarser offset
/// resolution (FORMAT.md §7.3), so they are left out here, with a warning saying how many.
pub fn load_for(
    args: &Args,
    filter: Option<&ImageFilter>,
    warnings: &mut Vec<String>,
) -> Result<Loaded, ListError> {
    if let Some(who) = args.who() {
        return Ok(prof::whoprof::load(&args.sel, &who, &mut |w| warnings.push(w))?);
    }
    let (loaded, fresh) = match filter {
        Some(f) => args.sel.load_published(Some(f), &mut |w| warnings.push(w))?,
        None => args.sel.load_all_counts_published(&mut |w| warnings.push(w))?,
    };
    if fresh.samples > 0 {
        warnings.push(format!(
            "{} sample(s){} from the current epoch's newest time slices are left out (their \
             offsets are kept at {} bytes there, not per instruction); dcpiprof includes \
             them; `dcpictl flush` publishes them into the profiles",
            fresh.samples,
            if filter.is_some() { " of this image" } else { "" },
            fresh.resolution
        ));
    }
    Ok(loaded)
}
