//! The README's statements about settings are the code's: the keys a reload applies (and the
//! ones it does not), and every default it quotes. A key made reloadable, a new key, or a
//! changed default fails here until the README says so.

use std::collections::BTreeSet;
use std::time::Duration;

use dcpid::config::{PartialSettings, Settings, RELOADABLE};

fn readme() -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The `backticked` words of `text`.
fn ticked(text: &str) -> BTreeSet<String> {
    text.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

#[test]
fn readme_reload_keys_are_the_reloadable_list() {
    let readme = readme();
    let start = readme.find("A reload applies these keys at once:").expect("the reload paragraph");
    let para = &readme[start..];
    let para = &para[..para.find("\n\n").unwrap_or(para.len())];
    let (at_once, rest) =
        para.split_once("Every\nother key").or(para.split_once("Every other key")).expect(para);
    let restart = &rest[..rest.find(')').expect(para)];

    let want_at_once: BTreeSet<String> = RELOADABLE.iter().map(ToString::to_string).collect();
    assert_eq!(ticked(at_once), want_at_once, "README's reloadable keys differ from RELOADABLE");
    let want_restart: BTreeSet<String> = PartialSettings::KEYS
        .iter()
        .filter(|k| !RELOADABLE.contains(k))
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        ticked(restart),
        want_restart,
        "README's restart-only keys differ from the settings"
    );
}

/// A quoted default normalised: a duration, or a number (`16 MiB`, `100 000`), or the text.
#[derive(Debug, PartialEq)]
enum Value {
    Duration(Duration),
    Number(u64),
    Text(String),
}

fn value(text: &str) -> Value {
    let t: String = text.trim().chars().filter(|c| !c.is_whitespace()).collect();
    if let Some(n) = t.strip_suffix("MiB").and_then(|n| n.parse::<u64>().ok()) {
        return Value::Number(n << 20);
    }
    if let Ok(n) = t.parse::<u64>() {
        return Value::Number(n);
    }
    if let Ok(d) = humantime::parse_duration(&t) {
        return Value::Duration(d);
    }
    Value::Text(text.trim().to_owned())
}

#[test]
fn readme_defaults_are_the_code_defaults() {
    let readme = readme().replace('\n', " ");
    let defaults = Settings::defaults();
    let mut checked = Vec::new();
    for key in PartialSettings::KEYS {
        // "`key` (VALUE)" or "`key` (VALUE by default)", and "`key`, default VALUE,".
        let ticked = format!("`{key}`");
        for (i, _) in readme.match_indices(&ticked) {
            let after = &readme[i + ticked.len()..];
            let quoted = if let Some(r) = after.strip_prefix(" (") {
                r.split(')').next().map(|v| v.trim_end_matches(" by default"))
            } else {
                after.strip_prefix(", default ").and_then(|r| r.split([',', ')']).next())
            };
            // Only values: "(the group ...)" and the like are prose.
            let Some(quoted) = quoted.filter(|v| v.starts_with(|c: char| c.is_ascii_digit()))
            else {
                continue;
            };
            assert_eq!(
                value(quoted),
                value(&defaults.show(key)),
                "README says `{key}` is {quoted:?} by default; the code's default is {:?}",
                defaults.show(key)
            );
            checked.push(*key);
        }
    }
    // The ones the README quotes today: the test must not pass by matching nothing.
    for key in
        ["publish_interval", "perf_map_max_bytes", "perf_map_max_entries", "sample_max_stack"]
    {
        assert!(
            checked.contains(&key),
            "README's default of `{key}` was not found; checked {checked:?}"
        );
    }
}
