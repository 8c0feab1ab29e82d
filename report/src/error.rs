//! Errors of the report tools, and the "did you mean" hints their messages carry.

use std::path::PathBuf;

use serde::Serialize;

use super::debuginfo;

/// Errors of a report run.
#[derive(Debug, thiserror::Error)]
pub enum ProfError {
    #[error("no profile database at {}: directory does not exist (use --db DIR)", .0.display())]
    NoDatabase(PathBuf),
    #[error(transparent)]
    Format(#[from] profile_format::Error),
    #[error("{0}")]
    Empty(String),
    #[error(
        "no samples of event {event:?} in {scope}{}; events there: {available} (choose with \
         --event)",
        did_you_mean_hint(event, available)
    )]
    UnknownEvent { event: String, available: String, scope: String },
    #[error(
        "no image with samples of the selected event(s) matches --image {spec:?}; images with \
         samples: {known} (try another --event, --epoch all or --host all)"
    )]
    NoSuchImage { spec: String, known: String },
    #[error("--image {spec:?} is ambiguous: {} images match", candidates.len())]
    Ambiguous { spec: String, candidates: Vec<Candidate> },
    #[error("{0}")]
    Cache(#[from] debuginfo::CacheError),
    #[error("writing output: {0}")]
    Output(#[from] std::io::Error),
    #[error("cannot write --output {}: {source}", path.display())]
    OutputFile { path: PathBuf, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
    #[error("{first}{}; pass --keep-going to skip corrupt files", more_files(*.more))]
    Corrupt { first: String, more: usize },
}

fn more_files(n: usize) -> String {
    if n > 0 {
        format!(" (and {n} more corrupt file(s))")
    } else {
        String::new()
    }
}

impl ProfError {
    /// Process exit status for this error: 2 for usage and data errors, 1 otherwise.
    pub fn exit_code(&self) -> u8 {
        match self {
            Self::Output(_) => 1,
            _ => 2,
        }
    }
}

/// One candidate when `--image` is ambiguous.
#[derive(Clone, Debug, Serialize)]
pub struct Candidate {
    pub path: String,
    pub image_id: String,
    pub build_id: Option<String>,
    pub samples: u64,
    pub hosts: Vec<String>,
    pub epochs: Vec<String>,
}

/// The candidate a mistyped `word` most likely meant (`cpu-clok` → `cpu-clock`): the closest by
/// edit distance, if it is close enough to be a typo rather than another word.
pub fn did_you_mean<'a>(
    word: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    let w = word.to_ascii_lowercase();
    candidates
        .into_iter()
        .map(|c| (strsim::levenshtein(&w, &c.to_ascii_lowercase()), c))
        .filter(|&(d, c)| d > 0 && d <= (c.len() / 3).max(2))
        .min_by_key(|&(d, _)| d)
        .map(|(_, c)| c)
}

/// ` (did you mean `X`?)` for the error messages, or nothing.
pub fn did_you_mean_hint(word: &str, candidates_list: &str) -> String {
    did_you_mean(word, candidates_list.split(", "))
        .map(|c| format!(" (did you mean `{c}`?)"))
        .unwrap_or_default()
}
