//! Library behind `dcpictl` (daemon control), `dcpiprof` (reports), `dcpilist`
//! (per-instruction listings), `dcpidiff` (what changed between two selections) and `dcpistats`
//! (whether a change is significant, over epochs); `dcpiexport` (in `dcpiexport/`) also reads
//! databases through it.
#![forbid(unsafe_code)]

pub mod args;
pub mod ctl;
pub mod diff;
/// The escaper lives in the report core; this path stays for the tools and tests that use it.
pub use dcpi_report::escape;
pub mod list;
pub mod manpages;
pub mod notes;
pub mod prof;
pub mod term;
pub mod top;

#[cfg(test)]
mod tests {
    /// Every binary of this crate is named in the crate documentation above and installed by
    /// the Makefile (its PROGRAMS list), so neither can forget a tool again.
    #[test]
    fn every_tool_is_documented_and_installed() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
        let lib = std::fs::read_to_string(dir.join("src/lib.rs")).expect("src/lib.rs");
        let doc: String = lib.lines().take_while(|l| l.starts_with("//!")).collect();
        let makefile = std::fs::read_to_string(dir.join("../Makefile")).expect("Makefile");
        let programs = makefile
            .lines()
            .find_map(|l| l.strip_prefix("PROGRAMS"))
            .expect("PROGRAMS in the Makefile");
        let mut tools = Vec::new();
        for e in std::fs::read_dir(dir.join("src/bin")).expect("src/bin") {
            let name = e.expect("entry").file_name().to_string_lossy().into_owned();
            let Some(tool) = name.strip_suffix(".rs") else { continue };
            assert!(
                doc.contains(&format!("`{tool}`")),
                "{tool} is missing from lib.rs's documentation"
            );
            assert!(
                programs.split_whitespace().any(|p| p.split(':').next() == Some(tool)),
                "{tool} is missing from the Makefile's PROGRAMS: {programs}"
            );
            tools.push(tool.to_owned());
        }
        assert!(tools.len() >= 5, "{tools:?}");
    }

    /// The crate's module graph (`mod` declarations and every `crate::`, `super::` and
    /// `self::` path outside comments and `#[cfg(test)]` code) has no cycle, so no module
    /// imports from a module above it, and report-core types come from `dcpi_report` directly
    /// rather than through a re-export in a parent (issue 34). Prints the cycle if there is one.
    #[test]
    fn module_graph_is_acyclic() {
        use std::collections::{BTreeMap, BTreeSet};
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut files: BTreeMap<Vec<String>, String> = BTreeMap::new();
        let mut stack = vec![src.clone()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).expect("src dir") {
                let p = e.expect("entry").path();
                let rel = p.strip_prefix(&src).expect("under src").to_path_buf();
                if rel.starts_with("bin") {
                    continue; // each binary is its own crate
                }
                if p.is_dir() {
                    stack.push(p);
                    continue;
                }
                let Some(rel) = rel.to_str().and_then(|r| r.strip_suffix(".rs")) else {
                    continue;
                };
                let mut m: Vec<String> = rel.split('/').map(str::to_owned).collect();
                if matches!(m.last().map(String::as_str), Some("mod" | "lib")) {
                    m.pop();
                }
                let text = std::fs::read_to_string(&p).expect("source");
                // Production code only: the tests of a module may use anything.
                let code = text.split("#[cfg(test)]").next().unwrap_or_default();
                let code: String = code
                    .lines()
                    .map(|l| l.split("//").next().unwrap_or_default())
                    .collect::<Vec<_>>()
                    .join("\n");
                files.insert(m, code);
            }
        }
        let modules: BTreeSet<Vec<String>> = files.keys().cloned().collect();
        let is_ident = |c: char| c.is_alphanumeric() || c == '_';
        // The items of a use group (`{a, b::c, d as e}`): the first name of each.
        let group = |r: &str| -> Vec<String> {
            let body = r.strip_prefix('{').and_then(|b| b.split('}').next()).unwrap_or_default();
            body.split(',')
                .filter_map(|i| i.trim().split(|c: char| !is_ident(c)).next())
                .filter(|n| !n.is_empty())
                .map(str::to_owned)
                .collect()
        };
        // What each module re-exports from other crates (`pub use dcpi_report::report;`).
        let mut reexports: BTreeMap<Vec<String>, BTreeSet<String>> = BTreeMap::new();
        for (m, code) in &files {
            for stmt in code.split(';') {
                let Some(p) = stmt.split("\npub use ").nth(1).or(stmt.strip_prefix("pub use "))
                else {
                    continue;
                };
                // Only other crates' items: not the crate's own (`crate::`, `super::`,
                // `self::`, a child module).
                let first = p.split("::").next().unwrap_or_default();
                let mut child = m.clone();
                child.push(first.to_owned());
                if ["crate", "super", "self"].contains(&first) || modules.contains(&child) {
                    continue;
                }
                let names = match p.find('{') {
                    Some(b) => group(&p[b..]),
                    None => {
                        let last = p.rsplit(" as ").next().unwrap_or(p);
                        vec![last.rsplit("::").next().unwrap_or(last).trim().to_owned()]
                    }
                };
                reexports.entry(m.clone()).or_default().extend(names);
            }
        }
        let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
        let mut through_reexport = Vec::new();
        for (m, code) in &files {
            let out = edges.entry(m.clone()).or_default();
            let mut add = |out: &mut BTreeSet<Vec<String>>, path: Vec<String>| {
                let mut target = path.clone();
                while !target.is_empty() && !modules.contains(&target) {
                    target.pop();
                }
                if let Some(name) = path.get(target.len()) {
                    if reexports.get(&target).is_some_and(|r| r.contains(name)) {
                        through_reexport.push(format!("{}: {}", m.join("::"), path.join("::")));
                    }
                }
                if &target != m {
                    out.insert(target);
                }
            };
            // `mod x;`: the parent depends on its child.
            for l in code.lines() {
                let l = l.trim_start().trim_start_matches("pub ");
                if let Some(name) = l.strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) {
                    let mut c = m.clone();
                    c.push(name.trim().to_owned());
                    add(out, c);
                }
            }
            // Every path from crate::, super:: or self::, each item of a use group after it.
            let chars: Vec<char> = code.chars().collect();
            for i in 0..chars.len() {
                if i > 0 && (is_ident(chars[i - 1]) || chars[i - 1] == ':') {
                    continue;
                }
                let rest: String = chars[i..chars.len().min(i + 300)].iter().collect();
                let mut segs: Vec<String> = Vec::new();
                let mut r = rest.as_str();
                loop {
                    let end = r.find(|c: char| !is_ident(c)).unwrap_or(r.len());
                    if end == 0 {
                        break;
                    }
                    segs.push(r[..end].to_owned());
                    match r[end..].strip_prefix("::") {
                        Some(next) => r = next,
                        None => break,
                    }
                }
                let items = group(r);
                let mut base = match segs.first().map(String::as_str) {
                    // `pub(crate)`, `pub(super)` and `self` alone name no module.
                    _ if segs.len() < 2 && items.is_empty() => continue,
                    Some("crate") => Vec::new(),
                    Some("super" | "self") => m.clone(),
                    _ => continue,
                };
                let mut segs = segs.into_iter().skip(1).peekable();
                if rest.starts_with("super") {
                    base.pop();
                    while segs.peek().map(String::as_str) == Some("super") {
                        base.pop();
                        segs.next();
                    }
                }
                base.extend(segs);
                if items.is_empty() {
                    add(out, base.clone());
                }
                for item in items {
                    let mut p = base.clone();
                    if item != "self" {
                        p.push(item);
                    }
                    add(out, p);
                }
            }
        }
        assert!(
            through_reexport.is_empty(),
            "crate-internal paths through a re-export of another crate (import from that crate \
             directly):\n{}",
            through_reexport.join("\n")
        );
        // Depth-first search for a back edge.
        fn visit(
            n: &Vec<String>,
            edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
            state: &mut BTreeMap<Vec<String>, u8>,
            path: &mut Vec<Vec<String>>,
        ) -> Option<Vec<Vec<String>>> {
            match state.get(n) {
                Some(2) => return None,
                Some(_) => {
                    let from = path.iter().position(|p| p == n).unwrap_or_default();
                    let mut cycle = path[from..].to_vec();
                    cycle.push(n.clone());
                    return Some(cycle);
                }
                None => {}
            }
            state.insert(n.clone(), 1);
            path.push(n.clone());
            for t in edges.get(n).into_iter().flatten() {
                if let Some(c) = visit(t, edges, state, path) {
                    return Some(c);
                }
            }
            path.pop();
            state.insert(n.clone(), 2);
            None
        }
        let mut state = BTreeMap::new();
        for n in edges.keys() {
            let cycle = visit(n, &edges, &mut state, &mut Vec::new());
            let names: Vec<String> = cycle
                .unwrap_or_default()
                .iter()
                .map(|m| if m.is_empty() { "crate".to_owned() } else { m.join("::") })
                .collect();
            assert!(names.is_empty(), "module cycle: {}", names.join(" -> "));
        }
        assert!(edges.len() > 20, "{:?}", edges.keys());
    }
}
