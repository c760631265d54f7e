//! The packaged-crates rehearsal: what a user who depends on tunneld from crates.io gets.
//!
//! Every published crate is packaged as `cargo publish` would upload it; the packages and the
//! third-party crates at the workspace's locked versions (`cargo vendor`) are laid out as one
//! directory source that replaces crates.io; a small program (`xtask/rehearsal/consumer.rs`)
//! is built against them in an empty directory, with no `[patch]` and no path into this
//! repository, and run in a network namespace: an embedded gateway and a user-space tunnel
//! connected to it move 1 MiB and back. A crate that builds only thanks to the workspace (a
//! `[patch]`, a file outside its package, an API of a patched dependency) fails here.

use crate::system::{cargo, output_of, output_within, run, target_dir};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// The consumer's source, kept in the repository and copied into an empty directory.
const CONSUMER: &str = include_str!("../rehearsal/consumer.rs");

/// How long the consumer may take to move its bytes.
const RUN_LIMIT: Duration = Duration::from_secs(120);

pub fn run_rehearsal(root: &Path) -> Result<(), String> {
    let target = target_dir(root);
    let work = target.join("rehearsal");
    let _ = fs::remove_dir_all(&work);
    let packages = target.join("package");
    let _ = fs::remove_dir_all(&packages);
    let registry = work.join("registry");
    fs::create_dir_all(&registry)
        .map_err(|e| format!("cannot create {}: {e}", registry.display()))?;

    // 1. The packages, as uploaded (not verified here: building them is the consumer's
    // job). The smoltcp fork is a member, so it is packaged with the crates that need it.
    let mut package: Vec<String> = ["package", "--workspace", "--no-verify", "--allow-dirty"]
        .map(String::from)
        .into();
    for name in crate::publish::UNPUBLISHED {
        package.extend(["--exclude".into(), name.into()]);
    }
    eprintln!("==> rehearsal: cargo {}", package.join(" "));
    run(Command::new(cargo()).args(&package).current_dir(root))?;

    // 2. crates.io's crates at the workspace's locked versions, and the packages beside them.
    eprintln!("==> rehearsal: cargo vendor (the locked third-party crates)");
    // Its standard output is the source-replacement snippet, not needed here.
    output_of(
        Command::new(cargo())
            .args(["vendor", "--versioned-dirs", "--quiet"])
            .arg(&registry)
            .current_dir(root),
    )?;
    let unpacked = unpack_packages(&packages, &registry)?;
    eprintln!("==> rehearsal: packaged {}", unpacked.join(", "));

    // 3. The consumer, in an empty directory outside the repository.
    let home = std::env::temp_dir().join(format!("tunneld-rehearsal-{}", std::process::id()));
    let _ = fs::remove_dir_all(&home);
    let result = build_and_run(root, &home, &registry, &target);
    let _ = fs::remove_dir_all(&home);
    if result.is_ok() {
        // Half a gigabyte of sources, made again on every run; kept only to look into a failure.
        let _ = fs::remove_dir_all(&work);
    }
    result
}

/// Unpacks every `.crate` in `packages` into the directory source `registry`, and returns
/// their names.
fn unpack_packages(packages: &Path, registry: &Path) -> Result<Vec<String>, String> {
    let mut unpacked = Vec::new();
    for entry in fs::read_dir(packages).map_err(|e| format!("{}: {e}", packages.display()))? {
        let path = entry.map_err(|e| e.to_string())?.path();
        if path.extension().is_some_and(|e| e == "crate") {
            run(Command::new("tar")
                .arg("-xzf")
                .arg(&path)
                .arg("-C")
                .arg(registry))?;
            let dir = path.file_stem().map(PathBuf::from).unwrap_or_default();
            // A directory source checks the files its checksum file lists: none, for a
            // package just made here.
            fs::write(
                registry.join(&dir).join(".cargo-checksum.json"),
                r#"{"files":{},"package":null}"#,
            )
            .map_err(|e| format!("cannot write a checksum file: {e}"))?;
            unpacked.push(dir.display().to_string());
        }
    }
    unpacked.sort();
    Ok(unpacked)
}

fn build_and_run(root: &Path, home: &Path, registry: &Path, target: &Path) -> Result<(), String> {
    let version = workspace_version(root)?;
    let write = |path: PathBuf, text: &str| {
        fs::create_dir_all(path.parent().unwrap_or(home))
            .and_then(|()| fs::write(&path, text))
            .map_err(|e| format!("cannot write {}: {e}", path.display()))
    };
    write(
        home.join("Cargo.toml"),
        &format!(
            "[package]\nname = \"tunneld-consumer\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\
             publish = false\n\n[dependencies]\n\
             tunneld = {{ version = \"{version}\", features = [\"tokio\"] }}\n\
             tunneld-userspace = \"{version}\"\ntunneld-fleet = \"{version}\"\n\
             tokio = {{ version = \"1\", features = [\"rt\", \"time\"] }}\n\n[workspace]\n"
        ),
    )?;
    write(home.join("src/main.rs"), CONSUMER)?;
    write(
        home.join(".cargo/config.toml"),
        &format!(
            "[source.crates-io]\nreplace-with = \"rehearsal\"\n\n[source.rehearsal]\ndirectory = \"{}\"\n",
            registry.display()
        ),
    )?;
    eprintln!(
        "==> rehearsal: cargo build of a consumer of tunneld {version} from its packages, in {}",
        home.display()
    );
    // The workspace's target directory: the third-party crates built for the tests serve
    // again where their features agree.
    run(Command::new(cargo())
        .args(["build", "--offline", "--quiet"])
        .env("CARGO_TARGET_DIR", target)
        .current_dir(home))?;
    let binary = target.join("debug/tunneld-consumer");
    if tunneld_testnet::netns_unusable().is_some() {
        return crate::skip_step(
            "rehearsal run",
            "the consumer built; running it needs root for a network namespace",
        );
    }
    let ns = tunneld_testnet::NetNs::new();
    let mut cmd = ns.command(&binary.display().to_string());
    let out = output_within(&mut cmd, RUN_LIMIT)?;
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    eprint!("{text}");
    if out.status.success() && text.contains("moved 1048576 bytes") {
        Ok(())
    } else {
        Err(format!("the consumer failed ({})", out.status))
    }
}

/// `[workspace.package] version`, which every published crate inherits.
fn workspace_version(root: &Path) -> Result<String, String> {
    let manifest = fs::read_to_string(root.join("Cargo.toml")).map_err(|e| e.to_string())?;
    let section = manifest
        .split("[workspace.package]")
        .nth(1)
        .ok_or("Cargo.toml has no [workspace.package]")?;
    section
        .lines()
        .take_while(|l| !l.starts_with('['))
        .find_map(|l| {
            let value = l.strip_prefix("version")?.trim_start().strip_prefix('=')?;
            Some(value.trim().trim_matches('"').to_string())
        })
        .ok_or_else(|| "[workspace.package] has no version".into())
}
