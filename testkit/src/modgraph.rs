//! The module graph of a crate, read from its sources, to assert it has no cycle (issue 34: "no
//! cycle and no upward import"). A module is a top-level `src/NAME.rs` (with any `src/NAME/`
//! files); it imports module `M` where it names `crate::M` or `super::M` (in a top-level file,
//! where `super` is the crate root), or `crate::X` for an `X` that `lib.rs` re-exports with
//! `pub use M::…`. Comments are skipped, test modules are not: a test that imports upward is an
//! upward import too. Textual on purpose: the graph to police is the one a reader sees.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

/// Edges `module -> {imported module -> first file that imports it}`.
pub type Graph = BTreeMap<String, BTreeMap<String, String>>;

/// The import graph of the crate whose sources are in `src`.
///
/// # Panics
/// When `src` or a file in it cannot be read: a test helper, the test should fail.
#[must_use]
pub fn graph(src: &Path) -> Graph {
    let mut files: Vec<(String, String, bool)> = Vec::new(); // (module, file, top-level)
    for entry in read_dir(src) {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if path.is_dir() {
            for sub in read_dir(&path) {
                let p = sub.path();
                if p.extension().is_some_and(|e| e == "rs") {
                    files.push((name.clone(), p.display().to_string(), false));
                }
            }
        } else if let Some(stem) = name.strip_suffix(".rs") {
            if stem != "lib" && stem != "main" {
                files.push((stem.to_owned(), path.display().to_string(), true));
            }
        }
    }
    let modules: BTreeSet<String> = files.iter().map(|(m, _, _)| m.clone()).collect();
    let lib = src.join("lib.rs");
    let reexports = if lib.exists() { reexports(&code(&read(&lib))) } else { BTreeMap::new() };
    let mut out: Graph = modules.iter().map(|m| (m.clone(), BTreeMap::new())).collect();
    for (module, file, top) in &files {
        let text = code(&read(Path::new(file)));
        let mut roots = vec!["crate::"];
        if *top {
            roots.push("super::");
        }
        for root in roots {
            for name in imported_names(&text, root) {
                let target =
                    if modules.contains(&name) { Some(&name) } else { reexports.get(&name) };
                if let Some(t) = target.filter(|t| *t != module) {
                    out.get_mut(module)
                        .expect("every module has an entry")
                        .entry(t.clone())
                        .or_insert_with(|| file.clone());
                }
            }
        }
    }
    out
}

/// One cycle of `g` (`[a, b, …, a]`), if it has any.
#[must_use]
pub fn find_cycle(g: &Graph) -> Option<Vec<String>> {
    // 0 = unvisited, 1 = on the current path, 2 = done.
    fn visit<'g>(
        g: &'g Graph,
        m: &'g str,
        state: &mut BTreeMap<&'g str, u8>,
        path: &mut Vec<&'g str>,
    ) -> Option<Vec<String>> {
        state.insert(m, 1);
        path.push(m);
        for next in g.get(m).into_iter().flat_map(BTreeMap::keys) {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = path.iter().position(|p| p == next).unwrap_or(0);
                    let mut c: Vec<String> = path[from..].iter().map(|s| (*s).to_owned()).collect();
                    c.push(next.clone());
                    return Some(c);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(g, next, state, path) {
                        return Some(c);
                    }
                }
            }
        }
        path.pop();
        state.insert(m, 2);
        None
    }
    let mut state = BTreeMap::new();
    for m in g.keys() {
        if !state.contains_key(m.as_str()) {
            if let Some(c) = visit(g, m, &mut state, &mut Vec::new()) {
                return Some(c);
            }
        }
    }
    None
}

/// Panics naming a cycle, with the file of each import on it, if the crate in `src` has one.
///
/// # Panics
/// On a cycle, or when a source file cannot be read.
#[track_caller]
pub fn assert_acyclic(src: &Path) {
    let g = graph(src);
    if let Some(c) = find_cycle(&g) {
        let steps: Vec<String> = c
            .windows(2)
            .map(|w| format!("  {} -> {} (in {})", w[0], w[1], g[&w[0]][&w[1]]))
            .collect();
        panic!(
            "module cycle in {}: {}\n{}\nmove what the lower module needs down into it (or a \
             module below both) and re-export it from the old path",
            src.display(),
            c.join(" -> "),
            steps.join("\n")
        );
    }
}

// Reads the crate's own sources, never database files.
#[allow(clippy::disallowed_methods)]
fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

#[allow(clippy::disallowed_methods)]
fn read_dir(p: &Path) -> Vec<std::fs::DirEntry> {
    let mut v: Vec<_> = std::fs::read_dir(p)
        .unwrap_or_else(|e| panic!("listing {}: {e}", p.display()))
        .map(|e| e.unwrap_or_else(|e| panic!("listing {}: {e}", p.display())))
        .collect();
    v.sort_by_key(std::fs::DirEntry::file_name);
    v
}

/// `text` without `//` comments (doc links name modules without importing them).
fn code(text: &str) -> String {
    text.lines().map(|l| l.find("//").map_or(l, |i| &l[..i])).collect::<Vec<_>>().join("\n")
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

fn ident(s: &str) -> &str {
    &s[..s.find(|c: char| !is_ident(c)).unwrap_or(s.len())]
}

/// The first path segment after each `root` (`crate::x`, `crate::{x, y::z}`).
fn imported_names(text: &str, root: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some(i) = text[at..].find(root) {
        let start = at + i;
        at = start + root.len();
        if text[..start].chars().next_back().is_some_and(is_ident) {
            continue; // e.g. `my_crate::`
        }
        out.extend(group_heads(&text[at..]));
    }
    out
}

/// The leading identifier of `s`, or of each item of the `{…}` group `s` starts with.
fn group_heads(s: &str) -> Vec<String> {
    let Some(body) = s.strip_prefix('{') else {
        let id = ident(s);
        return if id.is_empty() { Vec::new() } else { vec![id.to_owned()] };
    };
    let mut heads = Vec::new();
    let mut depth = 0usize;
    let mut item_start = true;
    for (i, c) in body.char_indices() {
        match c {
            '{' => depth += 1,
            '}' if depth == 0 => break,
            '}' => depth -= 1,
            ',' if depth == 0 => item_start = true,
            c if c.is_whitespace() => {}
            _ if item_start && depth == 0 => {
                item_start = false;
                let id = ident(&body[i..]);
                if !id.is_empty() {
                    heads.push(id.to_owned());
                }
            }
            _ => {}
        }
    }
    heads
}

/// `name -> module` for every `pub use module::{name, …};` of `lib`.
fn reexports(lib: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut at = 0;
    while let Some(i) = lib[at..].find("pub use ") {
        let start = at + i + "pub use ".len();
        at = start;
        let module = ident(&lib[start..]);
        let Some(rest) = lib[start + module.len()..].strip_prefix("::") else { continue };
        let end = rest.find(';').unwrap_or(rest.len());
        for word in rest[..end].split(|c: char| !is_ident(c)).filter(|w| !w.is_empty()) {
            out.insert(word.to_owned(), module.to_owned());
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_imports_reexports_and_cycles() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path();
        let w = |name: &str, text: &str| {
            #[allow(clippy::disallowed_methods)]
            std::fs::write(src.join(name), text).unwrap();
        };
        w("lib.rs", "mod a;\nmod b;\nmod c;\npub use c::{Thing, other::Deep};\n");
        w("a.rs", "use crate::{b::X, self_ref};\n// use crate::c::Y; (a comment)\n");
        w("b.rs", "use super::c;\nfn f() -> my_crate::a::Z { todo!() }\n");
        w("c.rs", "fn g(_: crate::Thing) {}\n");
        let g = graph(src);
        assert_eq!(g["a"].keys().collect::<Vec<_>>(), ["b"]);
        assert_eq!(g["b"].keys().collect::<Vec<_>>(), ["c"]);
        assert!(g["c"].is_empty(), "crate::Thing is c's own re-export: {g:?}");
        assert_eq!(find_cycle(&g), None);

        w("c.rs", "fn g(_: crate::Deep) {}\nuse crate::a;\n");
        let g = graph(src);
        assert_eq!(find_cycle(&g).unwrap(), ["a", "b", "c", "a"]);
        let panic = std::panic::catch_unwind(|| assert_acyclic(src)).unwrap_err();
        let msg = panic.downcast_ref::<String>().unwrap();
        assert!(msg.contains("a -> b -> c -> a") && msg.contains("c.rs"), "{msg}");
    }
}
