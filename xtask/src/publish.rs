//! The library as others depend on it: its docs build with no warning, every published
//! crate packages and builds from its package (`cargo publish --dry-run`), and, once a
//! version is tagged, the public API keeps semver against the latest tag
//! (cargo-semver-checks).

use crate::system::{cargo, output_of, run};
use std::path::Path;
use std::process::Command;

/// The workspace members that are not published (test support, benches, this tool).
pub const UNPUBLISHED: [&str; 3] = ["tunneld-testnet", "tunneld-benches", "xtask"];

/// Every feature of the published crates, so their docs and API are checked whole.
pub const FEATURES: &str = "tunneld-userspace/axum,tunneld-userspace/hyper,\
    tunneld-userspace/dns,tunneld-userspace/tonic,tunneld/tokio,tunneld/proxy";

fn excluded(args: &mut Vec<String>) {
    for name in UNPUBLISHED {
        args.push("--exclude".into());
        args.push(name.into());
    }
}

/// `cargo doc` of the published libraries with every feature, warnings as errors.
pub fn docs(root: &Path) -> Result<(), String> {
    let mut args: Vec<String> = [
        "doc",
        "--no-deps",
        "--workspace",
        "--lib",
        "--features",
        FEATURES,
    ]
    .map(String::from)
    .into();
    excluded(&mut args);
    // The smoltcp fork's docs are upstream's, built and linted as upstream does.
    args.extend(["--exclude".into(), "tunneld-smoltcp".into()]);
    eprintln!(
        "==> docs: RUSTDOCFLAGS=\"-D warnings\" cargo {}",
        args.join(" ")
    );
    run(Command::new(cargo())
        .args(&args)
        .current_dir(root)
        .env("RUSTDOCFLAGS", "-D warnings"))
}

/// `cargo publish --dry-run` of every published crate together (cargo packages each and
/// builds it from its package, the workspace's own crates standing in for the registry).
/// `--allow-dirty` for a tree with uncommitted changes.
pub fn dry_run(root: &Path, allow_dirty: bool) -> Result<(), String> {
    let mut args: Vec<String> = ["publish", "--dry-run", "--workspace"]
        .map(String::from)
        .into();
    if allow_dirty {
        args.push("--allow-dirty".into());
    }
    excluded(&mut args);
    eprintln!("==> publish dry run: cargo {}", args.join(" "));
    run(Command::new(cargo()).args(&args).current_dir(root))
}

/// The latest version tag (`v1.2.3`), if any.
fn latest_version_tag(root: &Path) -> Result<Option<String>, String> {
    let tags = output_of(
        Command::new("git")
            .args(["tag", "--list", "v[0-9]*", "--sort=-v:refname"])
            .current_dir(root),
    )?;
    Ok(tags.lines().next().map(str::to_string))
}

/// cargo-semver-checks against the latest version tag (installed with `cargo install`
/// when missing); with no tag yet there is nothing to compare, which it says.
pub fn semver(root: &Path) -> Result<(), String> {
    let Some(tag) = latest_version_tag(root)? else {
        eprintln!("==> semver check: no version tagged yet (v*), nothing to compare against");
        return Ok(());
    };
    let have = Command::new(cargo())
        .args(["semver-checks", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have {
        eprintln!("==> installing cargo-semver-checks");
        run(Command::new(cargo()).args(["install", "--locked", "cargo-semver-checks"]))?;
    }
    let mut args: Vec<String> = ["semver-checks", "--workspace", "--baseline-rev"]
        .map(String::from)
        .into();
    args.push(tag.clone());
    excluded(&mut args);
    eprintln!("==> semver check against {tag}: cargo {}", args.join(" "));
    run(Command::new(cargo()).args(&args).current_dir(root))
}
