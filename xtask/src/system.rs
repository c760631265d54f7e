//! Running commands and installing the system tools the tests and the demo need.

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// (command to look for, Debian package providing it)
const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ping", "iputils-ping"),
    ("iperf3", "iperf3"),
    ("wg", "wireguard-tools"),
    ("wireguard-go", "wireguard-go"),
    ("nft", "nftables"),
    ("pkill", "procps"),
];

pub fn repo_root() -> Result<PathBuf, String> {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    manifest
        .parent()
        .map(PathBuf::from)
        .ok_or_else(|| "cannot find the repository root".into())
}

pub fn which(command: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(command))
        .find(|p| p.is_file())
}

pub fn have(command: &str) -> bool {
    which(command).is_some()
}

pub fn cargo() -> String {
    std::env::var("CARGO").unwrap_or_else(|_| "cargo".into())
}

/// Builds tunneld in release mode and returns its path.
pub fn build_tunneld() -> Result<PathBuf, String> {
    let root = repo_root()?;
    eprintln!("==> building tunneld (release)");
    run(Command::new(cargo())
        .args(["build", "--release", "-q", "-p", "tunneld"])
        .current_dir(&root))?;
    Ok(root.join("target/release/tunneld"))
}

/// Installs, with apt-get, the packages whose commands are missing. Without root, says what
/// is missing and carries on (privileged tests then skip, or fail if required).
pub fn install_tools() -> Result<(), String> {
    let missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!(
            "xtask: not root, so not installing: {} (tests that need them will skip)",
            missing.join(" ")
        );
        return Ok(());
    }
    eprintln!("==> installing {}", missing.join(" "));
    run(Command::new("apt-get").args(["update", "-qq"]))?;
    run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(&missing)
        .env("DEBIAN_FRONTEND", "noninteractive"))?;
    Ok(())
}

pub fn run(cmd: &mut Command) -> Result<(), String> {
    let status = cmd
        .status()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{cmd:?} failed ({status})"))
    }
}

/// Runs cargo with `args`, echoing its output and handing every line to `on_line`.
/// Returns whether it succeeded.
pub fn cargo_streaming(
    root: &PathBuf,
    args: &[&str],
    mut on_line: impl FnMut(&str),
) -> Result<bool, String> {
    let mut child = Command::new(cargo())
        .args(args)
        .current_dir(root)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| format!("cannot run cargo: {e}"))?;
    if let Some(out) = child.stdout.take() {
        for line in BufReader::new(out).lines() {
            let line = line.map_err(|e| format!("reading cargo output: {e}"))?;
            println!("{line}");
            on_line(&line);
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo: {e}"))?;
    Ok(status.success())
}
