//! `cargo xtask smoltcp-series`: the smoltcp fork (`vendor/smoltcp`, published as
//! `tunneld-smoltcp`) is upstream's package plus the patch series in
//! `vendor/smoltcp-patches/`. `--check` applies the series to the pristine upstream release
//! and fails unless the result is `vendor/smoltcp` byte for byte; `--onto VERSION` applies it
//! to another upstream release in a scratch directory and reports, patch by patch, whether
//! it applied cleanly, with an offset or fuzz, or conflicted, and where.
//!
//! The upstream source comes from crates.io through cargo (a throwaway project's `cargo
//! fetch`), as the `.crate` file cargo verified against the index's checksum.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use crate::system;

/// The upstream release the series is based on (vendor/README.md says how to move it).
pub const BASE_VERSION: &str = "0.14.0";

const PATCH_DIR: &str = "vendor/smoltcp-patches";
const FORK_DIR: &str = "vendor/smoltcp";

pub fn run(args: &[String]) -> Result<(), String> {
    let root = system::repo_root()?;
    match args {
        [flag] if flag == "--check" => check(&root),
        [flag, version] if flag == "--onto" => onto(&root, version),
        _ => Err("usage: cargo xtask smoltcp-series --check | --onto VERSION".into()),
    }
}

/// The `cargo xtask test` step: the series on the pristine base gives `vendor/smoltcp`.
pub fn check(root: &Path) -> Result<(), String> {
    let work = system::target_dir(root).join("smoltcp-series");
    let tree = work.join(format!("check-{BASE_VERSION}"));
    pristine_tree(&work, BASE_VERSION, &tree)?;
    let results = apply_series(root, &tree, true)?;
    let mut problems: Vec<String> = results
        .iter()
        .filter(|r| !r.is_exact())
        .map(|r| format!("{}: {}", r.name, r.describe()))
        .collect();
    let differences = compare_trees(root, &tree)?;
    if !differences.is_empty() {
        problems.push(format!(
            "the series applied to smoltcp {BASE_VERSION} differs from {FORK_DIR} in: {}",
            differences.join(", ")
        ));
    }
    if problems.is_empty() {
        eprintln!(
            "smoltcp-series: {} patches on smoltcp {BASE_VERSION} give {FORK_DIR} exactly",
            results.len()
        );
        Ok(())
    } else {
        Err(problems.join("\n"))
    }
}

/// Applies the series to another upstream release and reports each patch's fate.
fn onto(root: &Path, version: &str) -> Result<(), String> {
    if version.is_empty()
        || !version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || ".-+".contains(c))
    {
        return Err(format!("--onto {version:?}: not a version number"));
    }
    let work = system::target_dir(root).join("smoltcp-series");
    let tree = work.join(format!("onto-{version}"));
    pristine_tree(&work, version, &tree)?;
    let results = apply_series(root, &tree, false)?;
    let width = results.iter().map(|r| r.name.len()).max().unwrap_or(0);
    for r in &results {
        println!("{:width$}  {}", r.name, r.describe());
    }
    let failed = results.iter().filter(|r| !r.applied()).count();
    println!(
        "{} of {} patches applied onto smoltcp {version}; the tree is in {}",
        results.len() - failed,
        results.len(),
        tree.display()
    );
    if failed == 0 {
        println!("next: cargo test in it, then regenerate the patch files (vendor/README.md)");
        Ok(())
    } else {
        Err(format!(
            "{failed} patches did not apply cleanly onto {version}: rejected hunks are in \
             the *.rej files beside the files named above"
        ))
    }
}

/// Fetches smoltcp `version` from crates.io through cargo and lays it out in `dest` as the
/// series expects its base: the package's files, with its original `Cargo.toml`
/// (`Cargo.toml.orig`) instead of the normalised one, and without what packaging adds
/// (`.cargo_vcs_info.json`, `Cargo.lock`) or what upstream's CI alone uses (`.github`).
fn pristine_tree(work: &Path, version: &str, dest: &Path) -> Result<(), String> {
    let crate_file = fetch_crate(work, version)?;
    let unpack = work.join(format!("unpack-{version}"));
    remove_dir(&unpack)?;
    fs::create_dir_all(&unpack).map_err(|e| format!("creating {}: {e}", unpack.display()))?;
    system::run(
        Command::new("tar")
            .arg("-xzf")
            .arg(&crate_file)
            .arg("-C")
            .arg(&unpack),
    )?;
    let package = unpack.join(format!("smoltcp-{version}"));
    for generated in [
        ".cargo_vcs_info.json",
        "Cargo.lock",
        "Cargo.toml",
        ".github",
    ] {
        let path = package.join(generated);
        if path.is_dir() {
            remove_dir(&path)?;
        } else if path.exists() {
            fs::remove_file(&path).map_err(|e| format!("removing {}: {e}", path.display()))?;
        }
    }
    fs::rename(package.join("Cargo.toml.orig"), package.join("Cargo.toml"))
        .map_err(|e| format!("smoltcp {version}'s package has no Cargo.toml.orig: {e}"))?;
    remove_dir(dest)?;
    fs::rename(&package, dest).map_err(|e| format!("moving to {}: {e}", dest.display()))?;
    remove_dir(&unpack)
}

/// The `.crate` file of smoltcp `version`, downloaded (and checksummed) by `cargo fetch` of
/// a throwaway project that depends on exactly that version.
fn fetch_crate(work: &Path, version: &str) -> Result<PathBuf, String> {
    let project = work.join(format!("fetch-{version}"));
    fs::create_dir_all(project.join("src"))
        .map_err(|e| format!("creating {}: {e}", project.display()))?;
    // `[workspace]`: the project sits under this repository's target/, outside its workspace.
    let manifest = format!(
        "[package]\nname = \"fetch-smoltcp\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
         publish = false\n\n[dependencies]\nsmoltcp = {{ version = \"={version}\", \
         default-features = false }}\n\n[workspace]\n"
    );
    fs::write(project.join("Cargo.toml"), manifest)
        .and_then(|()| fs::write(project.join("src/lib.rs"), ""))
        .map_err(|e| format!("writing the fetch project: {e}"))?;
    system::run(
        Command::new(system::cargo())
            .args(["fetch", "--quiet", "--manifest-path"])
            .arg(project.join("Cargo.toml")),
    )
    .map_err(|e| format!("fetching smoltcp {version} from crates.io: {e}"))?;
    let cache = cargo_home()?.join("registry/cache");
    let name = format!("smoltcp-{version}.crate");
    let registries =
        fs::read_dir(&cache).map_err(|e| format!("reading {}: {e}", cache.display()))?;
    registries
        .filter_map(|entry| entry.ok().map(|e| e.path().join(&name)))
        .find(|path| path.is_file())
        .ok_or_else(|| {
            format!(
                "cargo fetched smoltcp {version} but {name} is not in {}",
                cache.display()
            )
        })
}

fn cargo_home() -> Result<PathBuf, String> {
    if let Some(home) = std::env::var_os("CARGO_HOME").filter(|h| !h.is_empty()) {
        return Ok(PathBuf::from(home));
    }
    std::env::var_os("HOME")
        .map(|home| PathBuf::from(home).join(".cargo"))
        .ok_or_else(|| "neither CARGO_HOME nor HOME is set".into())
}

fn remove_dir(path: &Path) -> Result<(), String> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
            Err(format!("removing {}: {e}", path.display()))
        }
        _ => Ok(()),
    }
}

/// The patch files in the order of the `series` file (blank lines and `#` comments aside).
fn series(root: &Path) -> Result<Vec<PathBuf>, String> {
    let dir = root.join(PATCH_DIR);
    let list = dir.join("series");
    let text = fs::read_to_string(&list).map_err(|e| format!("reading {}: {e}", list.display()))?;
    let names: Vec<PathBuf> = text
        .lines()
        .map(str::trim)
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .map(|name| dir.join(name))
        .collect();
    if names.is_empty() {
        return Err(format!("{} names no patch", list.display()));
    }
    if let Some(missing) = names.iter().find(|p| !p.is_file()) {
        return Err(format!("{} names a missing file", missing.display()));
    }
    Ok(names)
}

/// What `patch` said of one patch file.
#[derive(Debug, Default, PartialEq)]
struct Outcome {
    name: String,
    /// (file, hunk number, line where it went, offset in lines, fuzz)
    moved: Vec<(String, u32, u32, i64, u32)>,
    /// (file, hunk number, line where it was expected)
    failed: Vec<(String, u32, u32)>,
    /// `patch` found it applied already (reversed): upstream may have taken it.
    already_applied: bool,
    /// Anything else `patch` complained about, and its exit status when not success.
    trouble: Vec<String>,
}

impl Outcome {
    fn applied(&self) -> bool {
        self.failed.is_empty() && !self.already_applied && self.trouble.is_empty()
    }

    fn is_exact(&self) -> bool {
        self.applied() && self.moved.is_empty()
    }

    fn describe(&self) -> String {
        if self.is_exact() {
            return "applied cleanly".into();
        }
        let moved = |(file, hunk, _line, offset, fuzz): &(String, u32, u32, i64, u32)| {
            let mut how = format!("{offset:+}");
            if *fuzz != 0 {
                how += &format!(", fuzz {fuzz}");
            }
            (file.clone(), format!("{hunk} ({how})"))
        };
        let failed = |(file, hunk, line): &(String, u32, u32)| {
            (file.clone(), format!("{hunk} (line {line})"))
        };
        if self.applied() {
            let verdict = if self.moved.iter().any(|m| m.4 != 0) {
                "applied with fuzz"
            } else {
                "applied with offsets"
            };
            let hunks = by_file(self.moved.iter().map(moved));
            return format!("{verdict}: hunks {hunks}");
        }
        let mut parts = Vec::new();
        if self.already_applied {
            parts.push("looks applied already (upstream may have taken it)".to_string());
        }
        if !self.failed.is_empty() {
            parts.push(format!(
                "CONFLICT in hunks {}",
                by_file(self.failed.iter().map(failed))
            ));
        }
        parts.extend(self.trouble.iter().cloned());
        if !self.moved.is_empty() {
            parts.push(format!(
                "{} other hunks applied with offsets or fuzz",
                self.moved.len()
            ));
        }
        format!("did not apply: {}", parts.join("; "))
    }
}

/// `file a, b; other c` from (file, item) pairs in order.
fn by_file(items: impl Iterator<Item = (String, String)>) -> String {
    let mut groups: Vec<(String, Vec<String>)> = Vec::new();
    for (file, item) in items {
        match groups.last_mut() {
            Some((last, list)) if *last == file => list.push(item),
            _ => groups.push((file, vec![item])),
        }
    }
    groups
        .iter()
        .map(|(file, list)| format!("{file} {}", list.join(", ")))
        .collect::<Vec<_>>()
        .join("; ")
}

/// The number in a word of patch's report: `2553`, `-16` of `-16`, `2793` of `2793.`.
fn number(word: &str) -> &str {
    word.trim_matches(|c: char| !c.is_ascii_digit() && c != '-')
}

/// Reads GNU patch's report (run under `LC_ALL=C`).
fn parse_patch_output(name: &str, output: &str) -> Outcome {
    let mut outcome = Outcome {
        name: name.to_string(),
        ..Outcome::default()
    };
    let mut file = String::new();
    let mut missing: Option<usize> = None;
    for line in output.lines() {
        let line = line.trim();
        if let Some(rest) = line.strip_prefix("patching file ") {
            file = rest.trim_matches('\'').to_string();
        } else if let Some(rest) = line.strip_prefix("Hunk #") {
            let words: Vec<&str> = rest.split_whitespace().collect();
            let hunk: u32 = words.first().and_then(|w| w.parse().ok()).unwrap_or(0);
            let at = |key: &str| {
                words
                    .iter()
                    .position(|w| *w == key)
                    .and_then(|i| words.get(i + 1))
                    .and_then(|w| number(w).parse::<i64>().ok())
            };
            if rest.contains("FAILED") {
                outcome
                    .failed
                    .push((file.clone(), hunk, at("at").unwrap_or(0) as u32));
            } else if rest.contains("succeeded") {
                let line_no = at("at").unwrap_or(0) as u32;
                let offset = at("(offset").unwrap_or(0);
                let fuzz = at("fuzz").unwrap_or(0) as u32;
                outcome
                    .moved
                    .push((file.clone(), hunk, line_no, offset, fuzz));
            } else if !rest.contains("ignored") {
                outcome.trouble.push(format!("{file}: Hunk #{rest}"));
            }
        } else if line.contains("Reversed (or previously applied) patch detected") {
            outcome.already_applied = true;
        } else if line.contains("can't find file") {
            // Patch echoes the diff's header after this line: the name comes with `+++`.
            outcome.trouble.push("a file it patches is missing".into());
            missing = Some(outcome.trouble.len() - 1);
        } else if let Some(name) = line.strip_prefix("|+++ ") {
            let name = name.split_whitespace().next().unwrap_or(name);
            if let Some(i) = missing.take() {
                let name = name.strip_prefix("b/").unwrap_or(name);
                outcome.trouble[i] = format!("{name} is missing");
            }
        } else if line.contains("No file to patch") {
            // The line after "can't find file", counted there.
        } else if line.starts_with("patch: ****") || line.contains("malformed patch") {
            outcome.trouble.push(line.to_string());
        }
    }
    outcome
}

/// Applies each patch of the series to `tree` in order with GNU patch. `exact`: no fuzz
/// allowed (the `--check` of the base the patches were made on).
fn apply_series(root: &Path, tree: &Path, exact: bool) -> Result<Vec<Outcome>, String> {
    let mut results = Vec::new();
    for file in series(root)? {
        let name = file
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let mut cmd = Command::new("patch");
        cmd.env("LC_ALL", "C")
            .args(["-p1", "--forward", "--batch", "--no-backup-if-mismatch"])
            .arg("-d")
            .arg(tree)
            .arg("-i")
            .arg(&file);
        if exact {
            cmd.arg("--fuzz=0");
        }
        let output = cmd
            .output()
            .map_err(|e| format!("cannot run patch (Debian package patch): {e}"))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let mut outcome = parse_patch_output(&name, &text);
        if !output.status.success() && outcome.applied() {
            outcome
                .trouble
                .push(format!("patch failed ({}): {}", output.status, text.trim()));
        }
        results.push(outcome);
    }
    Ok(results)
}

/// The files (relative paths) that differ between `tree` and `vendor/smoltcp` as git sees it
/// (tracked and untracked files, not ignored ones like `target/`): missing on either side,
/// other contents, or another executable bit.
fn compare_trees(root: &Path, tree: &Path) -> Result<Vec<String>, String> {
    let listed = system::output_of(
        Command::new("git")
            .args([
                "ls-files",
                "-z",
                "--cached",
                "--others",
                "--exclude-standard",
                "--",
            ])
            .arg(FORK_DIR)
            .current_dir(root),
    )?;
    let prefix = format!("{FORK_DIR}/");
    let fork: BTreeSet<String> = listed
        .split('\0')
        .filter_map(|p| p.strip_prefix(&prefix))
        .filter(|p| root.join(FORK_DIR).join(p).is_file())
        .map(str::to_string)
        .collect();
    let mut applied = BTreeSet::new();
    list_files(tree, tree, &mut applied)?;
    let mut differences = Vec::new();
    for path in fork.union(&applied) {
        let (ours, theirs) = (root.join(FORK_DIR).join(path), tree.join(path));
        let why = match (fork.contains(path), applied.contains(path)) {
            (true, false) => Some("only in the fork"),
            (false, true) => Some("not in the fork"),
            _ if fs::read(&ours).ok() != fs::read(&theirs).ok() => Some("contents"),
            _ if is_executable(&ours) != is_executable(&theirs) => Some("executable bit"),
            _ => None,
        };
        if let Some(why) = why {
            differences.push(format!("{path} ({why})"));
        }
    }
    Ok(differences)
}

fn list_files(base: &Path, dir: &Path, out: &mut BTreeSet<String>) -> Result<(), String> {
    let entries = fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    for entry in entries {
        let path = entry
            .map_err(|e| format!("reading {}: {e}", dir.display()))?
            .path();
        if path.is_dir() {
            list_files(base, &path, out)?;
        } else if let Ok(relative) = path.strip_prefix(base) {
            out.insert(relative.to_string_lossy().into_owned());
        }
    }
    Ok(())
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    fs::metadata(path)
        .map(|m| m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::parse_patch_output;

    #[test]
    fn reads_gnu_patch_reports() {
        let clean = parse_patch_output("0001", "patching file src/socket/tcp.rs\n");
        assert!(clean.is_exact());
        assert_eq!(clean.describe(), "applied cleanly");

        let moved = parse_patch_output(
            "0002",
            "patching file src/socket/tcp.rs\n\
             Hunk #2 succeeded at 2553 (offset -16 lines).\n\
             Hunk #3 succeeded at 2793 with fuzz 2 (offset 4 lines).\n",
        );
        assert!(moved.applied() && !moved.is_exact());
        assert_eq!(
            moved.moved,
            vec![
                ("src/socket/tcp.rs".into(), 2, 2553, -16, 0),
                ("src/socket/tcp.rs".into(), 3, 2793, 4, 2)
            ]
        );
        assert_eq!(
            moved.describe(),
            "applied with fuzz: hunks src/socket/tcp.rs 2 (-16), 3 (+4, fuzz 2)"
        );

        let failed = parse_patch_output(
            "0003",
            "patching file src/socket/tcp/cubic.rs\n\
             Hunk #1 FAILED at 84.\n\
             1 out of 4 hunks FAILED -- saving rejects to file src/socket/tcp/cubic.rs.rej\n",
        );
        assert!(!failed.applied());
        assert_eq!(
            failed.failed,
            vec![("src/socket/tcp/cubic.rs".into(), 1, 84)]
        );
        assert_eq!(
            failed.describe(),
            "did not apply: CONFLICT in hunks src/socket/tcp/cubic.rs 1 (line 84)"
        );

        let taken = parse_patch_output(
            "0004",
            "patching file src/lib.rs\n\
             Reversed (or previously applied) patch detected!  Skipping patch.\n\
             1 out of 1 hunk ignored -- saving rejects to file src/lib.rs.rej\n",
        );
        assert!(taken.already_applied && !taken.applied());

        let missing = parse_patch_output(
            "0005",
            "can't find file to patch at input line 119\n\
             The text leading up to this was:\n\
             --------------------------\n\
             |--- a/tests/snapshots/netsim__netsim.snap\n\
             |+++ b/tests/snapshots/netsim__netsim.snap\n\
             --------------------------\n\
             No file to patch.  Skipping patch.\n\
             1 out of 1 hunk ignored\n",
        );
        assert_eq!(
            missing.describe(),
            "did not apply: tests/snapshots/netsim__netsim.snap is missing"
        );
    }
}
