//! Docs that run: every `cargo …` command in README.md, ARCHITECTURE.md, docs/*.md and
//! vendor/README.md names a package, test, example, bench, binary and xtask subcommand that
//! exist (from `cargo metadata` and xtask's usage text). A renamed test or a moved crate
//! fails here instead of in a reader's terminal.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A package's targets by kind (`test`, `example`, `bench`, `bin`, `lib`), and under the
/// kind `dir` its directory.
type Targets = BTreeMap<String, BTreeSet<String>>;

/// The packages of the workspace whose manifest is `manifest`: name → targets, and the
/// default members (what a command without `-p` works on).
fn packages(manifest: &Path) -> (BTreeMap<String, Targets>, BTreeSet<String>) {
    let out = Command::new(env!("CARGO"))
        .args([
            "metadata",
            "--offline",
            "--no-deps",
            "--format-version",
            "1",
        ])
        .arg("--manifest-path")
        .arg(manifest)
        .output()
        .expect("cargo metadata runs");
    assert!(
        out.status.success(),
        "cargo metadata --manifest-path {} failed:\n{}",
        manifest.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).expect("metadata is JSON");
    let mut by_id = BTreeMap::new();
    let mut found = BTreeMap::new();
    for package in meta["packages"].as_array().into_iter().flatten() {
        let name = package["name"].as_str().unwrap_or_default().to_string();
        let mut targets = Targets::new();
        for target in package["targets"].as_array().into_iter().flatten() {
            for kind in target["kind"].as_array().into_iter().flatten() {
                targets
                    .entry(kind.as_str().unwrap_or_default().to_string())
                    .or_default()
                    .insert(target["name"].as_str().unwrap_or_default().to_string());
            }
        }
        if let Some(dir) = package["manifest_path"]
            .as_str()
            .and_then(|m| Path::new(m).parent())
        {
            targets
                .entry("dir".into())
                .or_default()
                .insert(dir.display().to_string());
        }
        by_id.insert(
            package["id"].as_str().unwrap_or_default().to_string(),
            name.clone(),
        );
        found.insert(name, targets);
    }
    let defaults = meta["workspace_default_members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|id| by_id.get(id.as_str()?).cloned())
        .collect();
    (found, defaults)
}

/// xtask's subcommands, from its usage text (each starts a line indented by two spaces).
fn xtask_commands() -> BTreeSet<String> {
    crate::USAGE
        .lines()
        .filter_map(|l| l.strip_prefix("  "))
        .filter(|l| !l.starts_with(' '))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Splits a command line into words as a shell would for these docs: quotes group, a `#`
/// starting a word begins a comment.
fn words(line: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let mut quote: Option<char> = None;
    let mut in_word = false;
    for c in line.chars() {
        match (quote, c) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.push(c),
            (None, '"' | '\'') => {
                quote = Some(c);
                in_word = true;
            }
            (None, '#') if !in_word => break,
            (None, c) if c.is_whitespace() => {
                if in_word {
                    out.push(std::mem::take(&mut word));
                    in_word = false;
                }
            }
            (None, c) => {
                word.push(c);
                in_word = true;
            }
        }
    }
    if in_word {
        out.push(word);
    }
    out
}

/// The command lines of a Markdown text, with their line numbers: every line of a fenced
/// code block, and every inline code span, split at `&&`, `;` and `|`.
fn command_lines(text: &str) -> Vec<(usize, String)> {
    let mut lines = Vec::new();
    let mut fenced = false;
    for (i, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        let pieces: Vec<String> = if fenced {
            vec![line.trim_start().trim_start_matches("$ ").to_string()]
        } else {
            line.split('`')
                .skip(1)
                .step_by(2)
                .map(str::to_string)
                .collect()
        };
        for piece in pieces {
            for part in piece.split(['&', ';', '|']) {
                if !part.trim().is_empty() {
                    lines.push((i + 1, part.trim().to_string()));
                }
            }
        }
    }
    lines
}

/// A name the docs write as a placeholder (`<name>`, `NAME`, `bench*`, `[SCRIPT…]`).
fn placeholder(name: &str) -> bool {
    name.contains(['<', '>', '*', '[', ']', '…'])
        || name.contains("...")
        || (name.chars().any(|c| c.is_ascii_uppercase())
            && !name.chars().any(|c| c.is_ascii_lowercase()))
}

/// Whether a Rust file under `dir` (a package) has a function or module whose name contains
/// `filter`, as `cargo test FILTER` matches tests by their path (`module::name`).
fn has_test_named(dir: &Path, filter: &str) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    entries.filter_map(Result::ok).any(|e| {
        let path = e.path();
        if path.is_dir() {
            path.file_name().is_some_and(|n| n != "target") && has_test_named(&path, filter)
        } else {
            let stem = path.file_stem().map(|s| s.to_string_lossy().into_owned());
            path.extension().is_some_and(|x| x == "rs")
                && (stem.is_some_and(|s| s.contains(filter))
                    || std::fs::read_to_string(&path).is_ok_and(|text| {
                        text.split("fn ")
                            .skip(1)
                            .chain(text.split("mod ").skip(1))
                            .any(|after| {
                                let name: String = after
                                    .chars()
                                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                                    .collect();
                                name.contains(filter)
                            })
                    }))
        }
    })
}

struct Workspaces {
    root: PathBuf,
    /// Packages by the directory of the workspace they belong to (the root, fuzz/, …).
    by_dir: BTreeMap<PathBuf, (BTreeMap<String, Targets>, BTreeSet<String>)>,
    xtask: BTreeSet<String>,
}

impl Workspaces {
    fn of(&mut self, dir: &Path) -> &(BTreeMap<String, Targets>, BTreeSet<String>) {
        self.by_dir
            .entry(dir.to_path_buf())
            .or_insert_with(|| packages(&dir.join("Cargo.toml")))
    }

    /// What is wrong with `cargo ARGS` run in `dir`, if anything.
    fn check(&mut self, dir: &Path, args: &[String]) -> Option<String> {
        let mut args = args.iter().map(String::as_str).peekable();
        if args.peek().is_some_and(|a| a.starts_with('+')) {
            args.next();
        }
        let sub = args.next()?;
        let rest: Vec<&str> = args.collect();
        match sub {
            "xtask" => {
                let name = rest.first()?;
                (!placeholder(name) && !name.starts_with('-') && !self.xtask.contains(*name))
                    .then(|| format!("no xtask subcommand `{name}`"))
            }
            "fuzz" => {
                let target = rest.iter().skip_while(|a| **a != "run").nth(1)?;
                let (fuzz, _) = self.of(&self.root.join("fuzz")).clone();
                let known = fuzz
                    .values()
                    .any(|t| t.get("bin").is_some_and(|b| b.contains(*target)));
                (!placeholder(target) && !known).then(|| format!("no fuzz target `{target}`"))
            }
            "test" | "run" | "bench" | "build" | "check" | "clippy" | "doc" | "package"
            | "publish" | "tree" => {
                let mut dir = dir.to_path_buf();
                let mut packages = Vec::new();
                let mut wanted: Vec<(&str, &str)> = Vec::new();
                // `cargo test`'s name filters, before or after `--`.
                let mut filters: Vec<&str> = Vec::new();
                // The package a `--manifest-path` names, whose workspace may be bigger.
                let mut manifest_dir: Option<PathBuf> = None;
                let mut rest = rest.iter();
                while let Some(arg) = rest.next() {
                    let (flag, inline) = match arg.split_once('=') {
                        Some((f, v)) if f.starts_with("--") => (f, Some(v)),
                        _ => (*arg, None),
                    };
                    if !flag.starts_with('-') {
                        filters.push(flag);
                        continue;
                    }
                    let mut value = || inline.or_else(|| rest.next().copied());
                    match flag {
                        "-p" | "--package" => packages.extend(value()),
                        "--manifest-path" => {
                            let path = dir.join(value()?);
                            if !path.exists() {
                                return Some(format!("no manifest {}", path.display()));
                            }
                            dir = path.parent()?.to_path_buf();
                            manifest_dir = Some(dir.clone());
                        }
                        "--test" => wanted.extend(value().map(|v| ("test", v))),
                        "--example" => wanted.extend(value().map(|v| ("example", v))),
                        "--bench" => wanted.extend(value().map(|v| ("bench", v))),
                        "--bin" => wanted.extend(value().map(|v| ("bin", v))),
                        "--features" | "-F" | "--target-dir" | "--target" | "--profile"
                        | "--exclude" | "-j" | "--jobs" | "--color" | "--message-format"
                        | "--warm-up-time" | "--measurement-time" | "--test-threads" => {
                            value();
                        }
                        _ => {}
                    }
                }
                let (known, defaults) = self.of(&dir).clone();
                for p in &packages {
                    if !placeholder(p) && !known.contains_key(*p) {
                        return Some(format!("no package `{p}` in {}", dir.display()));
                    }
                }
                let searched: Vec<&String> = if let (true, Some(at)) =
                    (packages.is_empty(), &manifest_dir)
                {
                    let at = at.canonicalize().unwrap_or_else(|_| at.clone());
                    known
                        .iter()
                        .filter(|(_, targets)| {
                            targets.get("dir").is_some_and(|d| {
                                d.iter()
                                    .any(|d| Path::new(d).canonicalize().ok() == Some(at.clone()))
                            })
                        })
                        .map(|(name, _)| name)
                        .collect()
                } else if packages.is_empty() {
                    defaults.iter().collect()
                } else {
                    known
                        .keys()
                        .filter(|k| packages.contains(&k.as_str()))
                        .collect()
                };
                for (kind, name) in wanted {
                    let found = searched.iter().any(|p| {
                        known[p.as_str()]
                            .get(kind)
                            .is_some_and(|t| t.contains(name))
                    });
                    if !placeholder(name) && !found {
                        let within: Vec<&str> = searched.iter().map(|s| s.as_str()).collect();
                        return Some(format!(
                            "no {kind} target `{name}` in {}",
                            within.join(", ")
                        ));
                    }
                }
                if sub == "test" {
                    let dirs: Vec<PathBuf> = searched
                        .iter()
                        .flat_map(|p| known[p.as_str()].get("dir").into_iter().flatten())
                        .map(PathBuf::from)
                        .collect();
                    for filter in filters.iter().filter(|f| !placeholder(f)) {
                        if !dirs.iter().any(|d| has_test_named(d, filter)) {
                            return Some(format!("no test whose name contains `{filter}`"));
                        }
                    }
                }
                None
            }
            _ => None,
        }
    }
}

#[test]
fn every_cargo_command_in_the_docs_names_what_exists() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the repository root")
        .to_path_buf();
    let mut docs = vec![
        root.join("README.md"),
        root.join("ARCHITECTURE.md"),
        root.join("vendor/README.md"),
    ];
    let mut listed: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/ exists")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    listed.sort();
    docs.extend(listed);
    let mut ws = Workspaces {
        root: root.clone(),
        by_dir: BTreeMap::new(),
        xtask: xtask_commands(),
    };
    let mut problems = Vec::new();
    let mut commands = 0;
    for doc in docs.iter().filter(|d| d.exists()) {
        let text = std::fs::read_to_string(doc).expect("a readable doc");
        let mut dir = root.clone();
        let mut last_line = 0;
        for (line, command) in command_lines(&text) {
            // `cd DIR && cargo …` in one line moves the next command only.
            if line != last_line {
                dir = root.clone();
                last_line = line;
            }
            let argv = words(&command);
            match argv.first().map(String::as_str) {
                Some("cd") => {
                    if let Some(to) = argv.get(1).filter(|to| root.join(to).is_dir()) {
                        dir = root.join(to);
                    }
                }
                Some("cargo") => {
                    commands += 1;
                    if let Some(problem) = ws.check(&dir, &argv[1..]) {
                        let name = doc.strip_prefix(&root).unwrap_or(doc).display();
                        problems.push(format!("{name}:{line}: `{command}`: {problem}"));
                    }
                }
                _ => {}
            }
        }
    }
    assert!(
        commands > 50,
        "only {commands} cargo commands found in the docs"
    );
    assert!(
        problems.is_empty(),
        "{} of {commands} cargo commands in the docs name what does not exist:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn the_checker_finds_a_missing_test_and_accepts_a_present_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf();
    let mut ws = Workspaces {
        root: root.clone(),
        by_dir: BTreeMap::new(),
        xtask: xtask_commands(),
    };
    let check = |ws: &mut Workspaces, line: &str| ws.check(&root, &words(line)[1..]);
    assert_eq!(
        check(&mut ws, "cargo test -p tunneld-wireguard --test pair"),
        None
    );
    assert!(check(&mut ws, "cargo test -p tunneld --test no_such_test").is_some());
    assert_eq!(
        check(
            &mut ws,
            "cargo test -p tunneld-wireguard --test pair -- --nocapture reordered"
        ),
        None
    );
    assert!(check(
        &mut ws,
        "cargo test -p tunneld-wireguard --test pair no_such_name"
    )
    .is_some());
    assert!(check(&mut ws, "cargo test -p no-such-crate").is_some());
    let fork = "cargo test --manifest-path vendor/smoltcp/Cargo.toml --features _netsim";
    assert_eq!(check(&mut ws, &format!("{fork} netsim")), None);
    assert!(check(&mut ws, &format!("{fork} --test no_such_test")).is_some());
    assert!(check(&mut ws, "cargo xtask no-such-command").is_some());
    assert_eq!(
        check(&mut ws, "cargo xtask bench --rounds 3 --only \"a, b\""),
        None
    );
}
