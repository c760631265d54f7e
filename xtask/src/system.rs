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

pub fn have(command: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(command).is_file()))
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
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut child = Command::new(cargo)
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
