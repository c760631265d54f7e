//! The invariant "no two modules import each other" (ARCHITECTURE.md), checked over the
//! sources of every crate: a module may use its parent's items and its parent its children
//! (that is how Rust modules nest), but two modules that are not each other's ancestor may
//! not both refer to the other (`crate::…` or `super::…` paths).

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};

/// A module, as the path of its names from the crate root (empty: the root).
type Module = Vec<String>;

/// The module a source file is, from its path under `src/`.
fn module_of(relative: &Path) -> Module {
    let mut names: Vec<String> = relative
        .iter()
        .map(|s| s.to_string_lossy().into_owned())
        .collect();
    if let Some(last) = names.pop() {
        let stem = last.trim_end_matches(".rs");
        if !matches!(stem, "mod" | "lib" | "main") {
            names.push(stem.to_string());
        }
    }
    names
}

/// The paths after each `crate::` and `super::` in `text` (up to the first `#[cfg(test)]`,
/// whose `super::*` means something else), brace groups expanded one level deep.
fn referenced_paths(text: &str) -> Vec<(bool, Vec<String>)> {
    let text = text.split("#[cfg(test)]").next().unwrap_or("");
    let code: String = text
        .lines()
        .filter(|l| !l.trim_start().starts_with("//"))
        .collect::<Vec<_>>()
        .join("\n");
    let mut found = Vec::new();
    for (from_crate, keyword) in [(true, "crate::"), (false, "super::")] {
        let mut rest = code.as_str();
        while let Some(at) = rest.find(keyword) {
            let before = rest[..at].chars().next_back();
            rest = &rest[at + keyword.len()..];
            if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
                continue; // `$crate::` or part of a longer name
            }
            let mut prefix = Vec::new();
            let mut tail = rest;
            // `super::super::x`
            while let Some(after) = tail.strip_prefix(keyword) {
                prefix.push("super".to_string());
                tail = after;
            }
            for path in expand(tail) {
                let mut full = prefix.clone();
                full.extend(path);
                found.push((from_crate, full));
            }
        }
    }
    found
}

/// `a::b::{c, d::e}` → [a::b::c, a::b::d::e] (first level only); `a::b(` → [a::b].
fn expand(text: &str) -> Vec<Vec<String>> {
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let end = rest
            .find(|c: char| !(c.is_alphanumeric() || c == '_'))
            .unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(rest[..end].to_string());
        rest = &rest[end..];
        match rest.strip_prefix("::") {
            Some(after) => rest = after,
            None => return vec![segments],
        }
    }
    if let Some(group) = rest.strip_prefix('{') {
        let mut depth = 0;
        let mut item = String::new();
        let mut items = Vec::new();
        for c in group.chars() {
            match c {
                '{' => depth += 1,
                '}' if depth == 0 => break,
                '}' => depth -= 1,
                ',' if depth == 0 => {
                    items.push(std::mem::take(&mut item));
                    continue;
                }
                _ => {}
            }
            item.push(c);
        }
        items.push(item);
        return items
            .iter()
            .flat_map(|i| expand(i.trim()))
            .map(|tail| segments.iter().cloned().chain(tail).collect())
            .collect();
    }
    vec![segments]
}

/// The module `path` names, from `from`: the longest prefix that is a known module.
fn resolve(
    from: &Module,
    from_crate: bool,
    path: &[String],
    modules: &BTreeSet<Module>,
) -> Option<Module> {
    let mut base: Module = if from_crate {
        Vec::new()
    } else {
        let mut parent = from.clone();
        parent.pop()?;
        parent
    };
    let mut names = path.iter().peekable();
    while names.peek().is_some_and(|n| n.as_str() == "super") {
        names.next();
        base.pop()?;
    }
    let mut best = None;
    let mut candidate = base;
    for name in names {
        candidate.push(name.clone());
        if modules.contains(&candidate) {
            best = Some(candidate.clone());
        } else {
            break;
        }
    }
    best
}

/// Every `.rs` file under `dir`, into `out`.
pub(crate) fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// Every pair of modules of the crate in `src` that import each other.
pub fn mutual_imports(src: &Path) -> Vec<(String, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Module> = files
        .iter()
        .filter_map(|f| f.strip_prefix(src).ok())
        .map(module_of)
        .collect();
    let mut edges: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
    for file in &files {
        let Ok(relative) = file.strip_prefix(src) else {
            continue;
        };
        let from = module_of(relative);
        let text = fs::read_to_string(file).unwrap_or_default();
        for (from_crate, path) in referenced_paths(&text) {
            if let Some(to) = resolve(&from, from_crate, &path, &modules) {
                if to != from {
                    edges.entry(from.clone()).or_default().insert(to);
                }
            }
        }
    }
    let is_ancestor = |a: &Module, b: &Module| b.starts_with(a);
    let mut pairs = Vec::new();
    for (a, targets) in &edges {
        for b in targets {
            let back = edges.get(b).is_some_and(|t| t.contains(a));
            if back && a < b && !is_ancestor(a, b) && !is_ancestor(b, a) {
                pairs.push((a.join("::"), b.join("::")));
            }
        }
    }
    pairs
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(dir: &Path, file: &str, text: &str) {
        let path = dir.join(file);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(path, text).unwrap();
    }

    #[test]
    fn finds_siblings_that_import_each_other_and_allows_parents() {
        let dir = std::env::temp_dir().join(format!("module-cycles-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        write(&dir, "lib.rs", "mod a;\nmod net;\nuse crate::a::Thing;\n");
        write(
            &dir,
            "a.rs",
            "use crate::net::relay::X;\npub struct Thing;\n",
        );
        write(
            &dir,
            "net/mod.rs",
            "mod relay;\nmod stream;\nuse relay::X;\npub struct Stats;\n",
        );
        write(
            &dir,
            "net/relay.rs",
            "use super::{stream::S, Stats};\npub struct X;\n#[cfg(test)]\nmod t { use super::*; }\n",
        );
        write(
            &dir,
            "net/stream.rs",
            "// use super::relay::X;\npub struct S;\n",
        );
        assert_eq!(mutual_imports(&dir), Vec::<(String, String)>::new());
        // Now stream.rs uses relay.rs back, through a brace group two levels down.
        write(
            &dir,
            "net/stream.rs",
            "fn f() { crate::net::{relay::X}; }\n",
        );
        assert_eq!(
            mutual_imports(&dir),
            vec![("net::relay".to_string(), "net::stream".to_string())]
        );
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn no_two_modules_of_any_crate_import_each_other() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut crates: Vec<PathBuf> = fs::read_dir(root.join("crates"))
            .unwrap()
            .flatten()
            .map(|e| e.path().join("src"))
            .collect();
        crates.extend(["benches/src", "xtask/src", "fuzz/src"].map(|d| root.join(d)));
        let mut found = Vec::new();
        for src in crates.iter().filter(|s| s.is_dir()) {
            for (a, b) in mutual_imports(src) {
                found.push(format!("{}: {a} <-> {b}", src.display()));
            }
        }
        assert!(
            found.is_empty(),
            "modules that import each other:\n{}",
            found.join("\n")
        );
    }
}
