//! The invariant "the library carries no command-line dependency" (ARCHITECTURE.md): what
//! `tunneld` (with every feature) compiles for an embedder, from `cargo tree`, holds none of
//! the crates only the command line (`tunneld-cli`) needs.

use std::path::Path;
use std::process::Command;

/// Crates for arguments, man pages, completions, systemd, signals and log output: the
/// command line's, never the library's.
const CLI_ONLY: [&str; 6] = [
    "clap",
    "clap_mangen",
    "clap_complete",
    "sd-notify",
    "signal-hook",
    "tracing-subscriber",
];

/// The names of the crates `package` compiles as normal dependencies (no dev- or
/// build-dependencies), every feature on.
fn normal_dependencies(package: &str) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = Command::new(env!("CARGO"))
        .args([
            "tree",
            "--offline",
            "-p",
            package,
            "--all-features",
            "-e",
            "normal",
        ])
        .args(["--prefix", "none", "--format", "{p}"])
        .current_dir(root)
        .output()
        .expect("cargo tree runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| line.split_whitespace().next())
        .map(String::from)
        .collect()
}

#[test]
fn the_library_compiles_no_command_line_dependency() {
    let library = normal_dependencies("tunneld");
    assert!(
        library.iter().any(|name| name == "tunneld-tls"),
        "cargo tree did not list tunneld's dependencies: {library:?}"
    );
    let found: Vec<&String> = library
        .iter()
        .filter(|name| CLI_ONLY.contains(&name.as_str()))
        .collect();
    assert!(
        found.is_empty(),
        "the tunneld library compiles command-line crates (they belong in tunneld-cli): {found:?}"
    );
    // The check can fail: the command line does compile them.
    let cli = normal_dependencies("tunneld-cli");
    assert!(CLI_ONLY.iter().all(|name| cli.iter().any(|c| c == name)));
}
