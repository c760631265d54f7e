//! `cargo xtask kernel-wg`, and the `kernel WireGuard` step of `cargo xtask test`: the
//! release tunneld against the Linux kernel's own WireGuard.
//!
//! The checks are one script, `xtask/guest/kernel_wg.sh` (with its TCP helper
//! `kwg_tcp.py`): two network namespaces joined by a veth, tunneld in one, a kernel
//! WireGuard interface in the other, each side initiating in turn, a preshared key, pings and
//! TCP both ways over IPv4 and IPv6, a rekey by restarting a side, `wg show` on both. Its
//! header says exactly what it does; it prints one `check: NAME: ok` line per check.
//!
//! Where the host's kernel has WireGuard the script runs on the host. Where it does not (this
//! project's machines), it runs in a QEMU guest under software emulation (TCG; no KVM is
//! needed): Debian's current `linux-image-amd64` kernel, booted by virtme-ng over the host's
//! own root filesystem (read-only, with overlays, so the guest changes nothing on the host),
//! sees the repository and the tunneld binary at the same paths. Everything the guest needs is
//! kept in a cache, `target/kernel-wg/`: a Python venv with virtme-ng from PyPI, and the
//! kernel package unpacked (`apt-get download`, `dpkg-deb -x`, `depmod -b`), whose modules
//! virtme-ng hands to the guest itself; the host's `/lib/modules` is not touched. The system
//! packages it needs (QEMU, busybox, kmod, udev, file, python3-venv) are installed with
//! apt-get when missing. Emulation is 25–40 times slower than the machine: the step proves
//! interoperability, never speed.
//!
//! Needs root. Without it the step is skipped, or fails under `TUNNELD_REQUIRE_ALL=1`, as
//! the other privileged steps. The script and the guest are bounded in time; on a time-out or
//! Ctrl-C the whole process group (vng, QEMU) is stopped.

use crate::system;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// The script and its helper, relative to the repository root.
const SCRIPT: &str = "xtask/guest/kernel_wg.sh";
/// The checks the script makes when all pass (its `check: …: ok` lines): a run that ends
/// well with another count has skipped or added one, and fails until this is brought along.
const CHECKS: u64 = 24;
/// The metapackage whose dependency names the kernel package to boot.
const KERNEL_METAPACKAGE: &str = "linux-image-amd64";
/// virtme-ng, pinned to the release this step was written and tried with.
const VIRTME_NG: &str = "virtme-ng==1.42";
/// Longest the whole guest run (boot, checks, power-off) or the host run may take.
const RUN_LIMIT: Duration = Duration::from_secs(600);
/// Longest a download or an install may take.
const FETCH_LIMIT: Duration = Duration::from_secs(600);

/// (command to look for, Debian package providing it): what booting the guest needs.
const GUEST_TOOLS: &[(&str, &str)] = &[
    ("qemu-system-x86_64", "qemu-system-x86"),
    // virtme-ng builds the guest's initramfs around a static busybox.
    ("busybox", "busybox-static"),
    // depmod for the unpacked modules; modprobe in the guest.
    ("depmod", "kmod"),
    // Without udev the guest has no /dev/virtio-ports names, and vng cannot pass the
    // script's output and exit status back.
    ("udevadm", "udev"),
    // virtme-ng reads the kernel's version with file(1).
    ("file", "file"),
];

/// Whether `cmd` from `pkg` is there. A busybox on the PATH may be Debian's dynamically
/// linked one (initramfs-tools brings it), which virtme-ng refuses: only the static package
/// counts (installing it replaces the other).
fn guest_tool_present(cmd: &str, pkg: &str) -> bool {
    if pkg == "busybox-static" {
        return Command::new("dpkg-query")
            .args(["-W", "-f", "${Status}", pkg])
            .output()
            .is_ok_and(|out| out.stdout.ends_with(b" installed"));
    }
    system::have(cmd)
}

/// Checks passed and failed in one run.
#[derive(Debug, Default)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
}

/// `cargo xtask kernel-wg`.
pub fn run(args: &[String]) -> Result<(), String> {
    if let Some(arg) = args.first() {
        return Err(format!("kernel-wg takes no arguments (got {arg:?})"));
    }
    system::catch_interrupts();
    match step()? {
        None => Err("the kernel WireGuard check did not run".into()),
        Some(counts) if counts.failed == 0 => Ok(()),
        Some(counts) => Err(format!(
            "the kernel WireGuard check failed after {} passed check(s)",
            counts.passed
        )),
    }
}

/// How many checks a skip counts as.
pub fn check_count() -> u64 {
    CHECKS
}

/// The step of `cargo xtask test`. `Ok(None)` when skipped (not root, without
/// `TUNNELD_REQUIRE_ALL=1`); `Err` when it could not be set up.
pub fn step() -> Result<Option<Counts>, String> {
    if !crate::netns_usable() {
        return skip(
            "needs root for network namespaces (and, without WireGuard in this kernel, to \
             install QEMU)",
        );
    }
    // Ctrl-C from here on stops the run (the guest runs in a process group of its own, which
    // the terminal's Ctrl-C does not reach) and cleans up.
    system::catch_interrupts();
    let started = Instant::now();
    let root = system::repo_root()?;
    let script = root.join(SCRIPT);
    if !script.is_file() {
        return Err(format!("{} is missing", script.display()));
    }
    let tunneld = system::build_tunneld()?;
    // Kept to the end: its drop removes the scratch directory vng and QEMU use.
    let guest = if host_kernel_has_wireguard() {
        eprintln!("==> kernel WireGuard: this kernel has it; the checks run on the host");
        None
    } else {
        let guest = Guest::prepare(&system::target_dir(&root).join("kernel-wg"))?;
        eprintln!(
            "==> kernel WireGuard: no WireGuard in this kernel; booting {} under QEMU (TCG, \
             slow) with virtme-ng",
            guest.version
        );
        Some(guest)
    };
    let (mut cmd, place) = match &guest {
        None => {
            let mut cmd = Command::new("bash");
            cmd.arg(&script).arg(&tunneld);
            (cmd, "on the host".to_string())
        }
        Some(guest) => (
            guest.command(&root, &script, &tunneld)?,
            format!("in a QEMU guest running {}", guest.version),
        ),
    };
    cmd.current_dir(&root);
    let outcome = run_bounded(&mut cmd, RUN_LIMIT)?;
    drop(guest);
    let passed = outcome.lines.iter().filter(|l| is_pass(l)).count() as u64;
    let failed_line = outcome
        .lines
        .iter()
        .find(|l| l.starts_with("check: ") && l.contains(": FAILED: "));
    let seconds = started.elapsed().as_secs_f64();
    let counts = match (&outcome.status, failed_line) {
        (Ok(()), None) if passed == CHECKS => {
            eprintln!(
                "kernel WireGuard: {passed} checks passed {place}, in {seconds:.0} s (the \
                 whole step)"
            );
            Counts { passed, failed: 0 }
        }
        (Ok(()), None) => {
            eprintln!(
                "kernel WireGuard: FAILED: the script ended well after {passed} checks, not \
                 {CHECKS} (a check skipped or added: bring CHECKS in xtask/src/kernel_wg.rs along)"
            );
            Counts { passed, failed: 1 }
        }
        (status, line) => {
            let why = line.cloned().unwrap_or_else(|| match status {
                Err(e) => e.clone(),
                Ok(()) => "a check failed".into(),
            });
            eprintln!("kernel WireGuard: FAILED {place} after {passed} checks: {why}");
            if outcome.lines.is_empty() {
                eprintln!("(no output from the script; vng's messages are above)");
            }
            Counts { passed, failed: 1 }
        }
    };
    Ok(Some(counts))
}

/// A `check: NAME: ok …` line (`ok`, what was seen in brackets, the seconds so far).
fn is_pass(line: &str) -> bool {
    line.starts_with("check: ") && line.contains(": ok") && !line.contains(": FAILED: ")
}

/// A skip, or a failure under `TUNNELD_REQUIRE_ALL=1` ([`crate::skip_step`]).
fn skip(why: &str) -> Result<Option<Counts>, String> {
    crate::skip_step("kernel WireGuard", why).map(|()| None)
}

/// Whether `ip link add … type wireguard` works here, tried in a namespace of its own.
fn host_kernel_has_wireguard() -> bool {
    let ns = format!("kwgprobe{}", std::process::id());
    let quiet = |args: &[&str]| {
        Command::new("ip")
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    if !quiet(&["netns", "add", &ns]) {
        return false;
    }
    let has = quiet(&["-n", &ns, "link", "add", "wgprobe", "type", "wireguard"]);
    quiet(&["netns", "del", &ns]);
    has
}

// ----------------------------------------------------------------------------------------
// The guest: a cached Debian kernel and virtme-ng

/// What the guest boots: a kernel unpacked in the cache, and vng from the cache's venv.
#[derive(Debug)]
struct Guest {
    /// The kernel's release, e.g. `6.1.0-56-amd64`.
    version: String,
    vmlinuz: PathBuf,
    venv_bin: PathBuf,
    /// Scratch for vng and QEMU (`TMPDIR`), emptied before each boot.
    scratch: PathBuf,
}

impl Guest {
    /// Installs what is missing and fills the cache: the kernel, the venv.
    fn prepare(cache: &Path) -> Result<Guest, String> {
        let missing: Vec<&str> = GUEST_TOOLS
            .iter()
            .filter(|(cmd, pkg)| !guest_tool_present(cmd, pkg))
            .map(|(_, pkg)| *pkg)
            .collect();
        system::install_packages(&missing)
            .map_err(|e| format!("cannot install {}: {e}", missing.join(" ")))?;
        fs::create_dir_all(cache).map_err(|e| format!("cannot create {}: {e}", cache.display()))?;
        let (version, vmlinuz) = kernel(cache)?;
        let venv_bin = virtme_ng(cache)?;
        Ok(Guest {
            version,
            vmlinuz,
            venv_bin,
            scratch: cache.join("tmp"),
        })
    }

    /// `vng --run <vmlinuz> --disable-kvm … --exec "<script> <tunneld>"`.
    fn command(&self, root: &Path, script: &Path, tunneld: &Path) -> Result<Command, String> {
        let _ = fs::remove_dir_all(&self.scratch);
        fs::create_dir_all(&self.scratch)
            .map_err(|e| format!("cannot create {}: {e}", self.scratch.display()))?;
        let path = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![self.venv_bin.clone()];
        dirs.extend(std::env::split_paths(&path));
        let path = std::env::join_paths(dirs).map_err(|e| format!("bad PATH: {e}"))?;
        let exec = format!(
            "bash {} {}",
            shell_quote(&script.to_string_lossy()),
            shell_quote(&tunneld.to_string_lossy())
        );
        let mut cmd = Command::new(self.venv_bin.join("vng"));
        cmd.arg("--run")
            .arg(&self.vmlinuz)
            .args(["--disable-kvm", "--cpus", "2", "--memory", "2G"])
            .arg("--cwd")
            .arg(root)
            .arg("--exec")
            .arg(exec)
            .env("PATH", path)
            .env("TMPDIR", &self.scratch);
        Ok(cmd)
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

/// Single quotes for the guest's shell (the paths are this machine's, but may hold spaces).
fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', "'\\''"))
}

/// The kernel package `linux-image-amd64` depends on now, unpacked in the cache (once), with
/// its modules' `depmod` tables. Other kernels in the cache are removed. Returns the
/// kernel's release and its `vmlinuz`.
fn kernel(cache: &Path) -> Result<(String, PathBuf), String> {
    let package = match kernel_package() {
        Ok(package) => package,
        Err(_) => {
            // The package lists may be missing or old on a fresh machine.
            system::run(Command::new("apt-get").args(["update", "-qq"]))
                .map_err(|e| format!("cannot update the package lists: {e}"))?;
            kernel_package()?
        }
    };
    let version = package
        .strip_prefix("linux-image-")
        .unwrap_or(&package)
        .to_string();
    let dir = cache.join(&package);
    let vmlinuz = dir.join(format!("boot/vmlinuz-{version}"));
    let modules = dir.join(format!("lib/modules/{version}"));
    let ready = || vmlinuz.is_file() && modules.join("modules.dep").is_file();
    if !ready() {
        let partial = cache.join(format!("{package}.partial{}", std::process::id()));
        let _ = fs::remove_dir_all(&partial);
        fs::create_dir_all(&partial)
            .map_err(|e| format!("cannot create {}: {e}", partial.display()))?;
        let result = unpack_kernel(&package, &version, &partial);
        if let Err(e) = result {
            let _ = fs::remove_dir_all(&partial);
            return Err(e);
        }
        let _ = fs::remove_dir_all(&dir);
        fs::rename(partial.join("root"), &dir)
            .map_err(|e| format!("cannot move the unpacked kernel into the cache: {e}"))?;
        let _ = fs::remove_dir_all(&partial);
        if !ready() {
            return Err(format!(
                "{package} has no boot/vmlinuz-{version} or lib/modules/{version}"
            ));
        }
    }
    // Older kernels (Debian moved on) and interrupted unpackings.
    if let Ok(entries) = fs::read_dir(cache) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("linux-image-") && name != package {
                let _ = fs::remove_dir_all(entry.path());
            }
        }
    }
    Ok((version, vmlinuz))
}

/// `linux-image-<release>`: the dependency of `linux-image-amd64` that names one kernel.
fn kernel_package() -> Result<String, String> {
    let out = system::output_within(
        Command::new("apt-cache").args(["depends", KERNEL_METAPACKAGE]),
        Duration::from_secs(60),
    )?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .map(str::trim)
        .find(|p| p.starts_with("linux-image-") && p.chars().any(|c| c.is_ascii_digit()))
        .map(String::from)
        .ok_or_else(|| {
            format!(
                "cannot find the kernel package: apt-cache depends {KERNEL_METAPACKAGE} names \
                 no linux-image-<release> ({})",
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

/// Downloads `package` into `work` and unpacks it into `work/root`, with `depmod` run there.
fn unpack_kernel(package: &str, version: &str, work: &Path) -> Result<(), String> {
    eprintln!("==> kernel WireGuard: downloading and unpacking {package} (once, into the cache)");
    let out = system::output_within(
        Command::new("apt-get")
            .args(["download", "-q", package])
            .current_dir(work),
        FETCH_LIMIT,
    )
    .map_err(|e| format!("cannot download {package}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cannot download {package}: {}",
            last_line(&out.stderr)
        ));
    }
    let deb = fs::read_dir(work)
        .map_err(|e| format!("cannot read {}: {e}", work.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "deb"))
        .ok_or_else(|| format!("cannot download {package}: apt-get wrote no .deb"))?;
    let root = work.join("root");
    let out = system::output_within(
        Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root),
        FETCH_LIMIT,
    )?;
    if !out.status.success() {
        return Err(format!(
            "cannot unpack {}: {}",
            deb.display(),
            last_line(&out.stderr)
        ));
    }
    let _ = fs::remove_file(&deb);
    let out = system::output_within(
        Command::new("depmod").arg("-b").arg(&root).arg(version),
        FETCH_LIMIT,
    )?;
    if !out.status.success() {
        return Err(format!(
            "depmod failed for {package}: {}",
            last_line(&out.stderr)
        ));
    }
    Ok(())
}

/// A venv in the cache with virtme-ng installed; returns its `bin` directory.
fn virtme_ng(cache: &Path) -> Result<PathBuf, String> {
    let venv = cache.join("venv");
    let bin = venv.join("bin");
    let works = || {
        system::output_within(
            Command::new(bin.join("vng")).arg("--version"),
            Duration::from_secs(60),
        )
        .is_ok_and(|o| {
            o.status.success()
                && String::from_utf8_lossy(&o.stdout).trim() == VIRTME_NG.replace("==", " ")
        })
    };
    if works() {
        return Ok(bin);
    }
    eprintln!(
        "==> kernel WireGuard: installing {VIRTME_NG} into {}",
        venv.display()
    );
    let _ = fs::remove_dir_all(&venv);
    // Debian's python3 (the venv outlives shells whose PATH names another); python3-venv
    // brings the venv module's pip.
    let python = if Path::new("/usr/bin/python3").is_file() {
        "/usr/bin/python3"
    } else {
        "python3"
    };
    let make_venv = || {
        system::output_within(
            Command::new(python).args(["-m", "venv"]).arg(&venv),
            FETCH_LIMIT,
        )
        .is_ok_and(|o| o.status.success())
    };
    if !make_venv() {
        let _ = fs::remove_dir_all(&venv);
        system::install_packages(&["python3-venv"])
            .map_err(|e| format!("cannot install python3-venv: {e}"))?;
        if !make_venv() {
            return Err(format!("cannot make a Python venv in {}", venv.display()));
        }
    }
    let out = system::output_within(
        Command::new(bin.join("pip")).args([
            "install",
            "-q",
            "--disable-pip-version-check",
            VIRTME_NG,
        ]),
        FETCH_LIMIT,
    )
    .map_err(|e| format!("cannot install {VIRTME_NG}: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cannot install {VIRTME_NG}: {}",
            last_line(&out.stderr)
        ));
    }
    if works() {
        Ok(bin)
    } else {
        Err(format!(
            "{VIRTME_NG} installed, but `vng --version` does not answer"
        ))
    }
}

fn last_line(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("(no message)")
        .trim()
        .to_string()
}

// ----------------------------------------------------------------------------------------
// Running it, bounded

/// How a bounded run ended, and the lines its standard output printed.
#[derive(Debug)]
struct Outcome {
    status: Result<(), String>,
    lines: Vec<String>,
}

/// A child in a process group of its own: the group is stopped when dropped.
struct Group(Child);

impl Group {
    fn signal(&self, signal: libc::c_int) {
        if let Ok(pid) = libc::pid_t::try_from(self.0.id()) {
            // SAFETY: kill has no memory preconditions; the group is this child's own.
            unsafe {
                libc::kill(-pid, signal);
            }
        }
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            self.signal(libc::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        // The guest's QEMU may outlive vng; the group takes both.
        self.signal(libc::SIGKILL);
        let _ = self.0.wait();
    }
}

/// Runs `cmd` in a process group of its own, echoing its output as it comes, for at most
/// `limit` (or until Ctrl-C); then stops whatever of the group is left.
fn run_bounded(cmd: &mut Command, limit: Duration) -> Result<Outcome, String> {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .spawn()
        .map_err(|e| format!("cannot run {cmd:?}: {e}"))?;
    let mut group = Group(child);
    let lines = Arc::new(Mutex::new(Vec::new()));
    let stdout = echo(group.0.stdout.take(), Some(Arc::clone(&lines)));
    let stderr = echo(group.0.stderr.take(), None);
    let deadline = Instant::now() + limit;
    let status = loop {
        match group.0.try_wait() {
            Ok(Some(status)) if status.success() => break Ok(()),
            Ok(Some(status)) => break Err(format!("the run ended with {status}")),
            Ok(None) if system::interrupted() => break Err("interrupted".to_string()),
            Ok(None) if Instant::now() >= deadline => {
                break Err(format!(
                    "stopped after {} s (the time limit)",
                    limit.as_secs()
                ))
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(100)),
            Err(e) => break Err(format!("cannot wait for the run: {e}")),
        }
    };
    drop(group);
    let _ = stdout.join();
    let _ = stderr.join();
    let lines = std::mem::take(&mut *lines.lock().unwrap_or_else(|e| e.into_inner()));
    Ok(Outcome { status, lines })
}

/// Echoes a pipe's lines to this process's stderr, indented, keeping them when asked.
fn echo(
    pipe: Option<impl Read + Send + 'static>,
    keep: Option<Arc<Mutex<Vec<String>>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let Some(pipe) = pipe else { return };
        for line in BufReader::new(pipe).split(b'\n') {
            let Ok(line) = line else { break };
            let line = String::from_utf8_lossy(&line).trim_end().to_string();
            eprintln!("    {line}");
            if let Some(keep) = &keep {
                keep.lock().unwrap_or_else(|e| e.into_inner()).push(line);
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::{is_pass, shell_quote};

    #[test]
    fn pass_lines_are_told_from_the_rest() {
        assert!(is_pass(
            "check: kernel initiates: ping IPv4 both ways: ok [12 s]"
        ));
        assert!(is_pass(
            "check: x: TCP: ok (2048 KiB, SHA-256 equal) [40 s]"
        ));
        assert!(!is_pass("check: x: FAILED: sent \"1\", received \"\""));
        assert!(!is_pass("check: x: ok: FAILED: no reply"));
        assert!(!is_pass("    [tunneld] latest handshake: ok"));
    }

    #[test]
    fn shell_quote_survives_quotes_and_spaces() {
        assert_eq!(shell_quote("/a b/c"), "'/a b/c'");
        assert_eq!(shell_quote("it's"), "'it'\\''s'");
    }
}
