use super::*;

#[test]
fn coverage_says_how_the_request_was_rounded() {
    let c = TimeCoverage {
        since: Some(1_000_010),
        until: Some(1_000_100),
        covered: Some((1_000_000, 1_000_120)),
        ..Default::default()
    };
    assert_eq!(c.rounded_by(), (10, 20));
    let l = c.lines();
    assert!(l[0].contains("10s earlier start") && l[0].contains("20s later end"), "{l:?}");
    let exact = TimeCoverage { covered: Some((1_000_000, 1_000_120)), ..c.clone() };
    let exact = TimeCoverage { since: Some(1_000_000), until: Some(1_000_120), ..exact };
    assert_eq!(exact.rounded_by(), (0, 0));
    assert!(!exact.lines()[0].contains("rounded"));
    let none = TimeCoverage { covered: None, ..c };
    assert!(none.lines()[0].contains("no time slice"), "{:?}", none.lines());
}

#[test]
fn rescale_keeps_the_mean_period() {
    assert_eq!(rescale(100, 1_000_000, 25), (25, 250_000));
    assert_eq!(rescale(0, 7, 3), (3, 7));
}
