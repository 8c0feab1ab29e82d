//! `--events` parsing (`cycles:2000000`, `raw:0x1a2`, `auto`), perf type/config tables, default
//! periods.

use crate::sys::perf as sp;

/// What kind of counter an event is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventKind {
    /// `PERF_TYPE_HARDWARE` with a `PERF_COUNT_HW_*` config.
    Hardware(u64),
    /// `PERF_TYPE_SOFTWARE` with a `PERF_COUNT_SW_*` config.
    Software(u64),
    /// `PERF_TYPE_RAW` with a model-specific config.
    Raw(u64),
    /// cycles, or cpu-clock where the machine has no PMU.
    Auto,
}

/// One requested event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    /// User-facing name: `cycles`, `cpu-clock`, `raw:0x1a2`, `auto`.
    pub name: String,
    pub kind: EventKind,
    /// Nominal overflow period; `None` = [`default_period`].
    pub period: Option<u64>,
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum EventError {
    #[error("empty event list")]
    Empty,
    #[error("event list item {index} is empty (stray comma?)")]
    EmptyItem { index: usize },
    #[error("unknown event `{item}`{hint} (known: {known}, raw:0xCONFIG, auto)")]
    Unknown {
        item: String,
        known: String,
        /// ` (did you mean `cpu-clock`?)` when a known name is one typo away, else empty.
        hint: String,
    },
    #[error("bad raw event config in `{item}`: expected raw:0xHEX or raw:DECIMAL")]
    BadRaw { item: String },
    #[error("bad period in `{item}`: expected a positive integer")]
    BadPeriod { item: String },
    #[error("period {period} in `{item}` is out of range: {detail}")]
    PeriodRange { item: String, period: u64, detail: String },
    #[error("event `{name}` is listed twice")]
    Duplicate { name: String },
}

/// Named events: name, kind.
const NAMED: &[(&str, EventKind)] = &[
    ("cycles", EventKind::Hardware(sp::PERF_COUNT_HW_CPU_CYCLES as u64)),
    ("instructions", EventKind::Hardware(sp::PERF_COUNT_HW_INSTRUCTIONS as u64)),
    ("cache-misses", EventKind::Hardware(sp::PERF_COUNT_HW_CACHE_MISSES as u64)),
    ("branch-misses", EventKind::Hardware(sp::PERF_COUNT_HW_BRANCH_MISSES as u64)),
    ("cpu-clock", EventKind::Software(sp::PERF_COUNT_SW_CPU_CLOCK as u64)),
    ("task-clock", EventKind::Software(sp::PERF_COUNT_SW_TASK_CLOCK as u64)),
    ("page-faults", EventKind::Software(sp::PERF_COUNT_SW_PAGE_FAULTS as u64)),
];

/// The named events (`cycles`, `cpu-clock`, ...), for listing what opens on this machine.
pub fn named() -> impl Iterator<Item = (&'static str, EventKind)> {
    NAMED.iter().copied()
}

/// The user-facing name of a kind (for `auto`'s resolution and fallbacks).
pub fn kind_name(kind: &EventKind) -> String {
    if let Some((n, _)) = NAMED.iter().find(|(_, k)| k == kind) {
        return (*n).to_string();
    }
    match kind {
        EventKind::Hardware(c) => format!("hw:{c:#x}"),
        EventKind::Software(c) => format!("sw:{c:#x}"),
        EventKind::Raw(c) => format!("raw:{c:#x}"),
        EventKind::Auto => "auto".to_string(),
    }
}

/// `perf_event_attr.type` and `.config` (Auto is resolved by the sampler first; here it means
/// cycles).
pub fn perf_type_config(kind: &EventKind) -> (u32, u64) {
    match *kind {
        EventKind::Hardware(c) => (sp::PERF_TYPE_HARDWARE, c),
        EventKind::Software(c) => (sp::PERF_TYPE_SOFTWARE, c),
        EventKind::Raw(c) => (sp::PERF_TYPE_RAW, c),
        EventKind::Auto => (sp::PERF_TYPE_HARDWARE, sp::PERF_COUNT_HW_CPU_CYCLES as u64),
    }
}

/// Whether the period of this event is in nanoseconds (timer-driven software clocks). Their
/// timer restarts when the period is changed, so it must not be changed more often than once
/// per period.
pub fn period_is_time(kind: &EventKind) -> bool {
    matches!(*kind, EventKind::Software(c)
        if c == sp::PERF_COUNT_SW_CPU_CLOCK as u64 || c == sp::PERF_COUNT_SW_TASK_CLOCK as u64)
}

/// Default nominal period: ~1 kHz for clocks and for cycles on a ~2 GHz CPU, rarer events
/// sampled more densely.
pub fn default_period(kind: &EventKind) -> u64 {
    const CYCLES: u64 = sp::PERF_COUNT_HW_CPU_CYCLES as u64;
    const INSTR: u64 = sp::PERF_COUNT_HW_INSTRUCTIONS as u64;
    const CMISS: u64 = sp::PERF_COUNT_HW_CACHE_MISSES as u64;
    const BMISS: u64 = sp::PERF_COUNT_HW_BRANCH_MISSES as u64;
    const PF: u64 = sp::PERF_COUNT_SW_PAGE_FAULTS as u64;
    match *kind {
        EventKind::Hardware(CYCLES | INSTR) | EventKind::Auto => 2_000_000,
        EventKind::Hardware(CMISS | BMISS) => 20_000,
        EventKind::Hardware(_) => 2_000_000,
        EventKind::Software(PF) => 100,
        EventKind::Software(_) => 1_000_000,
        EventKind::Raw(_) => 2_000_000,
    }
}

fn parse_u64(s: &str) -> Option<u64> {
    let s = s.trim();
    if let Some(hex) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u64::from_str_radix(hex, 16).ok()
    } else {
        s.parse().ok()
    }
}

fn parse_period(item: &str, s: &str) -> Result<u64, EventError> {
    match s.trim().parse::<u64>() {
        Ok(p) if p > 0 => Ok(p),
        _ => Err(EventError::BadPeriod { item: item.to_string() }),
    }
}

/// Largest period accepted: beyond it an event would sample so rarely (minutes apart even at
/// GHz rates, or over 18 minutes for clocks in ns) that it is certainly a typo.
pub const MAX_PERIOD: u64 = 1 << 40;
/// Smallest period of a clock event (ns): 10 µs = 100 kHz per CPU, the kernel's default
/// `perf_event_max_sample_rate`; shorter timers are throttled and cost more than they measure.
pub const MIN_CLOCK_PERIOD_NS: u64 = 10_000;

fn check_period(item: &str, kind: &EventKind, period: Option<u64>) -> Result<(), EventError> {
    let Some(p) = period else { return Ok(()) };
    let range =
        |detail: String| EventError::PeriodRange { item: item.to_string(), period: p, detail };
    if p > MAX_PERIOD {
        return Err(range(format!("at most {MAX_PERIOD} (2^40)")));
    }
    if period_is_time(kind) && p < MIN_CLOCK_PERIOD_NS {
        return Err(range(format!(
            "a clock period is in nanoseconds and must be at least {MIN_CLOCK_PERIOD_NS} (10 µs, \
             100 kHz per CPU)"
        )));
    }
    Ok(())
}

fn parse_item(item: &str) -> Result<EventSpec, EventError> {
    let spec = parse_item_unchecked(item)?;
    check_period(item, &spec.kind, spec.period)?;
    Ok(spec)
}

fn parse_item_unchecked(item: &str) -> Result<EventSpec, EventError> {
    let lower = item.to_ascii_lowercase();
    let mut parts = lower.splitn(3, ':');
    let head = parts.next().unwrap_or("");
    if head == "raw" || head == "r" {
        let cfg = parts
            .next()
            .and_then(parse_u64)
            .ok_or_else(|| EventError::BadRaw { item: item.to_string() })?;
        let period = parts.next().map(|p| parse_period(item, p)).transpose()?;
        return Ok(EventSpec { name: format!("raw:{cfg:#x}"), kind: EventKind::Raw(cfg), period });
    }
    let rest: Vec<&str> = parts.collect();
    if rest.len() > 1 {
        return Err(EventError::BadPeriod { item: item.to_string() });
    }
    let period = rest.first().map(|p| parse_period(item, p)).transpose()?;
    let kind = if head == "auto" {
        EventKind::Auto
    } else if let Some((_, k)) = NAMED.iter().find(|(n, _)| *n == head) {
        *k
    } else {
        let known: Vec<&str> = NAMED.iter().map(|(n, _)| *n).chain(["auto"]).collect();
        let hint = known
            .iter()
            .map(|k| (strsim::levenshtein(head, k), *k))
            .filter(|&(d, k)| d <= (k.len() / 3).max(2))
            .min_by_key(|&(d, _)| d)
            .map(|(_, k)| format!(" (did you mean `{k}`?)"))
            .unwrap_or_default();
        let known = known[..NAMED.len()].join(", ");
        return Err(EventError::Unknown { item: item.to_string(), known, hint });
    };
    Ok(EventSpec { name: head.to_string(), kind, period })
}

/// Parse `"cycles,cpu-clock:500000,raw:0x1a2:100000,auto"`. Errors name the bad item.
pub fn parse_event_list(s: &str) -> Result<Vec<EventSpec>, EventError> {
    if s.trim().is_empty() {
        return Err(EventError::Empty);
    }
    let mut out: Vec<EventSpec> = Vec::new();
    for (index, item) in s.split(',').enumerate() {
        let item = item.trim();
        if item.is_empty() {
            return Err(EventError::EmptyItem { index });
        }
        let spec = parse_item(item)?;
        if out.iter().any(|e| e.name == spec.name) {
            return Err(EventError::Duplicate { name: spec.name });
        }
        out.push(spec);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let v = parse_event_list("cycles,cpu-clock:500000,raw:0x1a2:100000,auto").unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(
            v[0],
            EventSpec { name: "cycles".into(), kind: EventKind::Hardware(0), period: None }
        );
        assert_eq!(v[1].kind, EventKind::Software(0));
        assert_eq!(v[1].period, Some(500_000));
        assert_eq!(
            v[2],
            EventSpec {
                name: "raw:0x1a2".into(),
                kind: EventKind::Raw(0x1a2),
                period: Some(100_000)
            }
        );
        assert_eq!(v[3].kind, EventKind::Auto);
    }

    #[test]
    fn errors_name_the_item() {
        let e = parse_event_list("cycles,cyclez").unwrap_err();
        assert!(e.to_string().contains("cyclez"), "{e}");
        let e = parse_event_list("cpu-clock:0").unwrap_err();
        assert!(matches!(e, EventError::BadPeriod { ref item } if item == "cpu-clock:0"), "{e}");
        let e = parse_event_list("cpu-clock:abc").unwrap_err();
        assert!(e.to_string().contains("cpu-clock:abc"), "{e}");
        let e = parse_event_list("raw:0xzz").unwrap_err();
        assert!(e.to_string().contains("raw:0xzz"), "{e}");
        let e = parse_event_list("raw").unwrap_err();
        assert!(matches!(e, EventError::BadRaw { .. }), "{e}");
        assert_eq!(parse_event_list(" "), Err(EventError::Empty));
        assert_eq!(parse_event_list("cycles,,auto"), Err(EventError::EmptyItem { index: 1 }));
        assert!(matches!(parse_event_list("cycles,cycles:5"), Err(EventError::Duplicate { .. })));
        assert!(parse_event_list("cycles:1:2").is_err());
    }

    #[test]
    fn absurd_periods_are_rejected_naming_the_item() {
        let e = parse_event_list("cpu-clock:1000").unwrap_err();
        assert!(
            matches!(e, EventError::PeriodRange { ref item, period: 1000, .. } if item == "cpu-clock:1000"),
            "{e}"
        );
        assert!(e.to_string().contains("10 µs"), "{e}");
        let e = parse_event_list("cycles,cycles:2000000000000").unwrap_err();
        assert!(e.to_string().contains("cycles:2000000000000"), "{e}");
        let e = parse_event_list("raw:0x1a2:99999999999999").unwrap_err();
        assert!(matches!(e, EventError::PeriodRange { .. }), "{e}");
        // Limits themselves are fine; a counting event may use a small period.
        assert!(parse_event_list("cpu-clock:10000").is_ok());
        assert!(parse_event_list(&format!("cycles:{MAX_PERIOD}")).is_ok());
        assert!(parse_event_list("page-faults:1").is_ok());
        assert!(parse_event_list("task-clock:9999").is_err());
    }

    #[test]
    fn defaults() {
        assert_eq!(
            default_period(&EventKind::Software(sp::PERF_COUNT_SW_CPU_CLOCK as u64)),
            1_000_000
        );
        assert_eq!(
            default_period(&EventKind::Hardware(sp::PERF_COUNT_HW_CACHE_MISSES as u64)),
            20_000
        );
        assert_eq!(default_period(&EventKind::Software(sp::PERF_COUNT_SW_PAGE_FAULTS as u64)), 100);
        assert_eq!(default_period(&EventKind::Raw(0x1a2)), 2_000_000);
        assert!(period_is_time(&EventKind::Software(sp::PERF_COUNT_SW_TASK_CLOCK as u64)));
        assert!(!period_is_time(&EventKind::Hardware(0)));
        assert_eq!(kind_name(&EventKind::Software(0)), "cpu-clock");
    }
}
