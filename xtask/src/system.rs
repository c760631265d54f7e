//! Running commands and installing the system tools the tests and the demo need.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// (command to look for, Debian package providing it)
const TOOLS: &[(&str, &str)] = &[
    ("ip", "iproute2"),
    ("ping", "iputils-ping"),
    ("iperf3", "iperf3"),
    ("wg", "wireguard-tools"),
    ("wireguard-go", "wireguard-go"),
    ("nft", "nftables"),
    ("pkill", "procps"),
    // TLS forwarding: test CAs and certificates (tests, bench-tls), the stunnel bench row.
    ("stunnel4", "stunnel4"),
    ("openssl", "openssl"),
    // libfuzzer-sys (the fuzz crate, replayed in the tests) compiles libFuzzer's C++.
    ("g++", "g++"),
    // The package check: `man -w tunneld`, and the unit's `systemd-analyze verify`/`security`.
    ("man", "man-db"),
    ("systemd-analyze", "systemd"),
    // wg-quick (tests/bare.rs) runs it with bash.
    ("bash", "bash"),
    // `promtool check metrics` on a scrape (tests/metrics.rs); images of this kind keep apt
    // from starting the prometheus service it comes with (policy-rc.d).
    ("promtool", "prometheus"),
    // A DNS server inside a far site, for names resolved through a user-space tunnel
    // (crates/userspace/tests/ecosystem.rs); the -base package has no service.
    ("dnsmasq", "dnsmasq-base"),
    // `ssh -o ProxyCommand='nc -X 5 -x …'` through `tunneld proxy` (crates/cli/tests/proxy.rs):
    // the OpenBSD netcat is the one with -X/-x.
    ("nc", "netcat-openbsd"),
    // The proxy test's SOCKS5 and HTTP client (curl --socks5-hostname, -x, --proxytunnel).
    ("curl", "curl"),
    // The fleet (crates/fleet): etcd-client's build compiles etcd's protobuf definitions,
    // and the fleet tests run their own etcd cluster.
    ("protoc", "protobuf-compiler"),
    ("etcd", "etcd-server"),
    ("etcdctl", "etcd-client"),
    // Sites behind NAT (tunneld_testnet::nat): a NAT's mappings flushed and listed.
    ("conntrack", "conntrack"),
    // `cargo xtask smoltcp-series` applies the smoltcp fork's patch files with it.
    ("patch", "patch"),
];

/// (file to look for, Debian package providing it): what no command shows.
const FILES: &[(&str, &str)] = &[
    // protoc's well-known types, which etcd's definitions import.
    (
        "/usr/include/google/protobuf/descriptor.proto",
        "libprotobuf-dev",
    ),
];

/// (Python module to look for, Debian package providing it), for the system's python3.
const PYTHON_MODULES: &[(&str, &str)] = &[
    // tlsfuzzer (the tlsfuzzer step; vendored beside the repository) needs ecdsa.
    ("ecdsa", "python3-ecdsa"),
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

/// Where cargo puts build output: `CARGO_TARGET_DIR` (relative to the repository root when
/// relative), else `target/` in the repository.
pub fn target_dir(root: &Path) -> PathBuf {
    match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => root.join(dir),
        _ => root.join("target"),
    }
}

/// Builds the tunneld binary (package tunneld-cli) in release mode and returns its path.
pub fn build_tunneld() -> Result<PathBuf, String> {
    let root = repo_root()?;
    eprintln!("==> building tunneld (release)");
    run(Command::new(cargo())
        .args([
            "build",
            "--release",
            "-q",
            "-p",
            "tunneld-cli",
            "--bin",
            "tunneld",
        ])
        .current_dir(&root))?;
    let bin = target_dir(&root).join("release/tunneld");
    bin.is_file()
        .then_some(bin)
        .ok_or_else(|| "cargo build succeeded but target/release/tunneld is missing".into())
}

/// `ip`, `nft` and friends live in sbin directories, which a non-login root shell (or sudo
/// with a restricted PATH) may leave out; add them so this process and its children find them.
pub fn ensure_sbin_in_path() {
    let current = std::env::var_os("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&current).collect();
    let mut changed = false;
    for sbin in ["/usr/local/sbin", "/usr/sbin", "/sbin"] {
        if !dirs.iter().any(|d| d == Path::new(sbin)) {
            dirs.push(PathBuf::from(sbin));
            changed = true;
        }
    }
    if changed {
        if let Ok(path) = std::env::join_paths(dirs) {
            // Edition 2021, and called first thing in main, before any thread exists.
            std::env::set_var("PATH", path);
        }
    }
}

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    // Only an atomic store: async-signal-safe.
    INTERRUPTED.store(true, Ordering::SeqCst);
}

/// Turns SIGINT/SIGTERM into a flag ([`interrupted`]) so the demo and the benchmark stop at
/// the next step and their guards remove the namespaces and processes they made. (Ctrl-C also
/// reaches the children in the terminal's process group, so the step under way ends soon.)
/// Handlers, unlike ignored signals, are reset in children on exec.
pub fn catch_interrupts() {
    let handler = on_interrupt as extern "C" fn(libc::c_int) as libc::sighandler_t;
    // SAFETY: installs a handler that only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGINT, handler);
        libc::signal(libc::SIGTERM, handler);
    }
}

pub fn interrupted() -> bool {
    INTERRUPTED.load(Ordering::SeqCst)
}

/// An error when the user has interrupted the run (Ctrl-C), so callers can `?` it between steps.
pub fn check_interrupted() -> Result<(), String> {
    if interrupted() {
        Err("interrupted; cleaning up".into())
    } else {
        Ok(())
    }
}

/// Reads a spawned child's piped stdout and stderr to their ends on threads of their own (so
/// neither pipe can fill and stall it); join them once it has exited.
pub fn capture_output(
    child: &mut std::process::Child,
) -> (
    std::thread::JoinHandle<Vec<u8>>,
    std::thread::JoinHandle<Vec<u8>>,
) {
    let drain = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut buf);
            }
            buf
        })
    };
    let stdout = drain(
        child
            .stdout
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    let stderr = drain(
        child
            .stderr
            .take()
            .map(|p| Box::new(p) as Box<dyn Read + Send>),
    );
    (stdout, stderr)
}

/// Runs `cmd` to completion, but kills it if it runs longer than `limit`. Returns its output
/// (stdout and stderr captured) or an error saying it was killed.
pub fn output_within(cmd: &mut Command, limit: Duration) -> Result<Output, String> {
    output_with_input(cmd, &[], limit)
}

/// [`output_within`], with `input` written to the command's stdin (then closed).
pub fn output_with_input(
    cmd: &mut Command,
    input: &[u8],
    limit: Duration,
) -> Result<Output, String> {
    let mut child = cmd
        .stdin(if input.is_empty() {
            Stdio::null()
        } else {
            Stdio::piped()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let (stdout, stderr) = capture_output(&mut child);
    if let Some(mut stdin) = child.stdin.take() {
        // Small inputs only (a pipe's buffer): a command that never reads cannot block this.
        let _ = stdin.write_all(input);
    }
    let deadline = Instant::now() + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let stdout = stdout.join().unwrap_or_default();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Some(status) => Ok(Output {
            status,
            stdout,
            stderr,
        }),
        None => Err(format!(
            "{cmd:?} did not finish within {} s and was stopped",
            limit.as_secs()
        )),
    }
}

/// The first `python3` on PATH that imports `module` (the system's may not be first).
pub fn python_with(module: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join("python3"))
        .filter(|p| p.is_file())
        .find(|python| {
            output_within(
                Command::new(python).args(["-c", &format!("import {module}")]),
                Duration::from_secs(30),
            )
            .is_ok_and(|out| out.status.success())
        })
}

/// A `python3` that imports `module`, after installing `package` (apt-get) when none does.
pub fn python_with_module(module: &str, package: &str) -> Result<PathBuf, String> {
    if let Some(python) = python_with(module) {
        return Ok(python);
    }
    install_packages(&[package])?;
    python_with(module).ok_or_else(|| format!("no python3 on PATH imports {module} ({package})"))
}

/// Installs, with apt-get, the packages whose commands are missing. Without root, says what
/// is missing and carries on (privileged tests then skip, or fail if required).
pub fn install_tools() -> Result<(), String> {
    let mut missing: Vec<&str> = TOOLS
        .iter()
        .filter(|(cmd, _)| !have(cmd))
        .map(|(_, pkg)| *pkg)
        .collect();
    missing.extend(
        FILES
            .iter()
            .filter(|(file, _)| !Path::new(file).exists())
            .map(|(_, pkg)| *pkg),
    );
    missing.extend(
        PYTHON_MODULES
            .iter()
            .filter(|(module, _)| python_with(module).is_none())
            .map(|(_, pkg)| *pkg),
    );
    install_packages(&missing)
}

/// Installs Debian packages with apt-get (nothing when `missing` is empty). Without root,
/// says what is missing and carries on.
pub fn install_packages(missing: &[&str]) -> Result<(), String> {
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
    // Packages like prometheus (for promtool) come with a service; a test machine must not
    // start it. Debian's policy-rc.d hook says no for the length of the install, unless the
    // machine has one of its own already.
    let policy = Path::new("/usr/sbin/policy-rc.d");
    let made_policy = !policy.exists()
        && std::fs::write(
            policy,
            "#!/bin/sh\n# services are not started on a test machine\nexit 101\n",
        )
        .and_then(|()| {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(policy, std::fs::Permissions::from_mode(0o755))
        })
        .is_ok();
    let installed = run(Command::new("apt-get")
        .args(["install", "-y", "-qq", "--no-install-recommends"])
        .args(missing)
        .env("DEBIAN_FRONTEND", "noninteractive"));
    if made_policy {
        let _ = std::fs::remove_file(policy);
    }
    installed
}

/// cargo-deny checks the dependency policy (`deny.toml`); installed from crates.io (a few
/// minutes of compiling, once) when `cargo deny` is missing.
pub fn install_cargo_deny() -> Result<(), String> {
    let have_deny = Command::new("cargo")
        .args(["deny", "--version"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    if have_deny {
        return Ok(());
    }
    eprintln!("==> installing cargo-deny (cargo install --locked cargo-deny)");
    run(Command::new("cargo").args(["install", "--locked", "cargo-deny"]))
}

/// Runs `cmd` to completion and returns its standard output, trimmed; an error with both its
/// outputs when it fails.
pub fn output_of(cmd: &mut Command) -> Result<String, String> {
    let out = cmd
        .output()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "{cmd:?} failed ({}):\n{}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
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

/// The host's default TCP congestion control, which the report names beside the one used.
pub(crate) fn host_tcp_cc() -> String {
    std::fs::read_to_string("/proc/sys/net/ipv4/tcp_congestion_control")
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "unknown".into())
}
