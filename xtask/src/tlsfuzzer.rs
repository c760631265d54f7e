//! `cargo xtask tlsfuzzer [SCRIPT…]`, and the `tlsfuzzer` step of `cargo xtask test`:
//! tlsfuzzer's TLS 1.3 scripts against a `[[tls.listen]]` of the release tunneld and, side by
//! side, against OpenSSL's `s_server -tls1_3` (the reference), with no probe excluded.
//!
//! tlsfuzzer and tlslite-ng are vendored outside the repository, in `../shared/vendor/tlsfuzzer`
//! from its root (`TUNNELD_TLSFUZZER_DIR` names another copy); they are a test tool, never
//! shipped. The copy is read-only and holds the scripts' symlinks as files naming `_stub.py`,
//! so it is copied to a temporary directory and the symlinks are made again there.
//!
//! Everything runs in a network namespace made for the run, on its loopback: tunneld with three
//! `[[tls.listen]]` (an RSA-2048 certificate from the openssl CLI: most scripts offer only
//! RSA-PSS signatures), one forwarding to an HTTP backend that answers each `GET` with one
//! write (so the answer is one TLS record, as `openssl s_server -www`'s is), one to a
//! line-echo backend for `lengths` (each line back in one write), both with the default key
//! exchange groups, and a third to the HTTP backend with `groups` listing every group,
//! the opt-in ones (X448, ffdhe*, P-521) included; and OpenSSL with `-www` and `-rev` (which
//! sends each line back) with the same groups as the first two, and with `-www` and the
//! same groups as the third, same certificate. Both backends are threads of this process.
//! Every script runs all its probes (`-n 0`) on both servers at once, with a time limit;
//! the group scripts ([`OPT_IN_SCRIPTS`]) run once more against the opt-in pair. A run fails
//! when a probe that passes on OpenSSL does not pass on tunneld and is not one of the
//! documented [`compare::EXPECTED`] differences, or when an expected difference no longer
//! differs (see `compare.rs`). Afterwards an ordinary TLS client (`openssl s_client`,
//! verifying the certificate) must still get an answer through the listener. The report,
//! with each script's whole output on both servers, is in `target/tlsfuzzer-step/`. The
//! namespace, the processes and the temporary directory are removed at the end, also on
//! failure and on Ctrl-C.

use crate::system;
use crate::testbed::Guard;
use std::fs;
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tunneld_testnet::{unique_name, NetNs};

mod compare;

/// Where the vendored copy is, relative to the repository root.
const VENDORED: &str = "../shared/vendor/tlsfuzzer";
/// Names another copy of tlsfuzzer (the same layout) instead.
const DIR_VARIABLE: &str = "TUNNELD_TLSFUZZER_DIR";

/// The name in the certificate (`openssl s_client` checks it after the scripts).
const SERVER_NAME: &str = "tlsfuzzer.test";
/// tunneld's listeners in the namespace: to the HTTP backend, to the echo backend (both
/// with the default groups), and to the HTTP backend with every group, opt-in ones included.
const TLS_HTTP: &str = "127.0.0.1:4433";
const TLS_ECHO: &str = "127.0.0.1:4434";
const TLS_OPT_IN: &str = "127.0.0.1:4437";
/// The backends, on the namespace's loopback.
const HTTP_BACKEND: &str = "127.0.0.1:8080";
const ECHO_BACKEND: &str = "127.0.0.1:8081";

/// Longest any one script may run, on each server, in the step (`--compare-all` takes
/// `--limit`).
const SCRIPT_LIMIT: Duration = Duration::from_secs(90);
/// Longest tunneld may take to listen.
const READY_LIMIT: Duration = Duration::from_secs(10);
/// Longest a backend connection blocks on a read or write.
const BACKEND_IO: Duration = Duration::from_secs(10);

/// `lengths`' probes that run: the sanity one and these sizes of application data (an `A…A\n`
/// line, echoed back as one record). The script's default is 1000 random sizes of 1..=2^14,
/// which take minutes; these are the edges (one byte, powers of two and their neighbours, the
/// largest record) and a few odd sizes between.
const LENGTHS: &[usize] = &[
    1, 2, 3, 15, 16, 17, 100, 255, 256, 257, 1000, 1023, 1024, 1025, 1500, 4095, 4096, 4097, 8191,
    8192, 8193, 12345, 16383, 16384,
];

/// The scripts the step (`cargo xtask test`) runs, each against OpenSSL and tunneld side by
/// side: every TLS 1.3 script of tlsfuzzer where OpenSSL passes some probe and tunneld passes
/// every probe OpenSSL passes (docs/reliability.md lists the others and why), except
/// `dhe-shared-secret-padding`, whose run time is chance (it repeats each group until a key
/// share and a shared secret that start with a zero byte have both come: about 20 s here,
/// more in a bad draw) and which `--compare-all` runs. A script
/// where OpenSSL passes nothing could show no difference, so it would be a test that cannot
/// fail; the step refuses such a run. `--compare-all` runs every TLS 1.3 script.
const STEP_SCRIPTS: &[&str] = &[
    "0rtt-garbage",
    "ccs",
    "certificate-compression",
    "connection-abort",
    "conversation",
    "count-tickets",
    "crfg-curves",
    "ecdhe-curves",
    "ecdsa-support",
    "eddsa",
    "empty-alert",
    "ffdhe-groups",
    "ffdhe-sanity",
    "finished",
    "finished-plaintext",
    "hrr",
    "invalid-ciphers",
    "keyshare-omitted",
    "keyupdate",
    "keyupdate-from-server",
    "large-number-of-extensions",
    "legacy-version",
    "lengths",
    "multiple-ccs-messages",
    "no-unknown-groups",
    "nociphers",
    "obsolete-curves",
    "pkcs-signature",
    "record-layer-limits",
    "record-padding",
    "rsa-signatures",
    "serverhello-random",
    "session-resumption",
    "shuffled-extentions",
    "signature-algorithms",
    "symetric-ciphers",
    "unencrypted-alert",
    "unrecognised-groups",
    "version-negotiation",
    "zero-content-type",
    "zero-length-data",
];

/// The scripts that exercise key exchange groups and key shares (every group, HelloRetryRequest
/// choices, shares of unknown or obsolete groups): the step runs them (again) against the
/// listener whose `groups` lists the opt-in ones (X448, ffdhe2048 to ffdhe8192, P-521), and
/// OpenSSL with the same groups, so that those stay conformant though no default listener
/// offers them. About 20 s of the step. `--compare-all` adds `dhe-shared-secret-padding`.
const OPT_IN_SCRIPTS: &[&str] = &[
    "crfg-curves",
    "ecdhe-curves",
    "ffdhe-groups",
    "ffdhe-sanity",
    "no-unknown-groups",
    "obsolete-curves",
    "serverhello-random",
    "unrecognised-groups",
];

/// Of [`OPT_IN_SCRIPTS`], those whose probes all ask for finite-field groups: with the default
/// groups OpenSSL passes none of them (so no difference could show), and they run with the
/// opt-in groups only.
const OPT_IN_ONLY: &[&str] = &["ffdhe-groups", "ffdhe-sanity"];

/// Which of tunneld's listeners (and OpenSSL's servers) a script runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Groups {
    /// The default key exchange groups (rustls's default provider's; OpenSSL: the same but
    /// X25519MLKEM768, which OpenSSL 3.0 lacks).
    Default,
    /// Every group tunneld knows, the opt-in ones included (OpenSSL: the same).
    OptIn,
}

impl Groups {
    /// `-groups` for OpenSSL's servers: tunneld's groups in its order, in OpenSSL's spelling,
    /// without X25519MLKEM768 (OpenSSL 3.0, the reference, refuses the name). tunneld uses the
    /// hybrid only when a client sent its share, which no script of the step does.
    fn openssl(self) -> String {
        let names = match self {
            Groups::Default => tunneld_config::DEFAULT_LISTEN_GROUPS,
            Groups::OptIn => tunneld_config::LISTEN_GROUPS,
        };
        let names: Vec<&str> = names
            .iter()
            .filter(|name| **name != "X25519MLKEM768")
            .copied()
            .collect();
        names.join(":")
    }
}

/// One script against one pair of servers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Run {
    pub script: String,
    pub groups: Groups,
}

impl Run {
    /// The name the report and the output give it.
    pub fn label(&self) -> String {
        match self.groups {
            Groups::Default => self.script.clone(),
            Groups::OptIn => format!("{} (opt-in groups)", self.script),
        }
    }

    /// Its saved output's file name, in a side's directory.
    fn file(&self) -> String {
        match self.groups {
            Groups::Default => format!("{}.txt", self.script),
            Groups::OptIn => format!("{}.opt-in-groups.txt", self.script),
        }
    }
}

/// `names` against the default pair (but those of [`OPT_IN_ONLY`]), and those of them in
/// `opt_in` against the opt-in pair.
fn runs(names: &[String], opt_in: &[&str]) -> Vec<Run> {
    let default = names
        .iter()
        .filter(|name| !OPT_IN_ONLY.contains(&name.as_str()))
        .map(|script| Run {
            script: script.clone(),
            groups: Groups::Default,
        });
    let with_opt_in = names
        .iter()
        .filter(|name| opt_in.contains(&name.as_str()))
        .map(|script| Run {
            script: script.clone(),
            groups: Groups::OptIn,
        });
    default.chain(with_opt_in).collect()
}

/// Runs compared and how many showed an undocumented difference, in one comparison.
#[derive(Debug, Default)]
pub struct Counts {
    pub passed: u64,
    pub failed: u64,
    /// Runs where OpenSSL passed no probe (so none can differ).
    pub vacuous: Vec<String>,
    /// Probes that differ as documented ([`compare::EXPECTED`]), by run.
    pub expected: Vec<String>,
}

/// `cargo xtask tlsfuzzer [SCRIPT…]`: the named scripts (the step's without names), each
/// against OpenSSL and tunneld; or `--compare-all`.
pub fn run(args: &[String]) -> Result<(), String> {
    if args.iter().any(|a| a == "--compare-all") {
        return compare::compare_all(args);
    }
    let names: Vec<String> = if args.is_empty() {
        STEP_SCRIPTS.iter().map(|s| s.to_string()).collect()
    } else {
        args.iter().map(|a| compare::short_name(a)).collect()
    };
    match run_scripts(&names)? {
        None => Err("tlsfuzzer did not run".into()),
        Some(counts) if counts.failed == 0 => Ok(()),
        Some(counts) => Err(format!(
            "{} of {} tlsfuzzer runs differ from OpenSSL otherwise than documented",
            counts.failed,
            counts.passed + counts.failed
        )),
    }
}

/// The `tlsfuzzer` step of `cargo xtask test`: [`STEP_SCRIPTS`], and [`OPT_IN_SCRIPTS`] again
/// with the opt-in groups. `Ok(None)` when it was skipped (no vendored tlsfuzzer, or no
/// network namespaces, without `TUNNELD_REQUIRE_ALL=1`).
pub fn step() -> Result<Option<Counts>, String> {
    let names: Vec<String> = STEP_SCRIPTS.iter().map(|s| s.to_string()).collect();
    run_scripts(&names)
}

/// How many runs the step makes (what a skip counts).
pub fn script_count() -> u64 {
    let names: Vec<String> = STEP_SCRIPTS.iter().map(|s| s.to_string()).collect();
    runs(&names, OPT_IN_SCRIPTS).len() as u64
}

/// A skip, or a failure under `TUNNELD_REQUIRE_ALL=1` ([`crate::skip_step`]).
fn skip(why: &str) -> Result<Option<Counts>, String> {
    crate::skip_step("tlsfuzzer", why).map(|()| None)
}

fn vendored_dir() -> Result<PathBuf, String> {
    match std::env::var_os(DIR_VARIABLE) {
        Some(dir) if !dir.is_empty() => Ok(PathBuf::from(dir)),
        _ => Ok(system::repo_root()?.join(VENDORED)),
    }
}

/// Runs `names` against both servers and compares them ([`compare::run_and_report`]); the
/// report goes to `target/tlsfuzzer-step/`.
fn run_scripts(names: &[String]) -> Result<Option<Counts>, String> {
    let vendored = vendored_dir()?;
    if !vendored.join("scripts/_stub.py").is_file() {
        return skip(&format!(
            "no tlsfuzzer at {} (set {DIR_VARIABLE} to a copy)",
            vendored.display()
        ));
    }
    if !crate::netns_usable() {
        return skip("needs root for a network namespace");
    }
    let report_dir = system::target_dir(&system::repo_root()?).join("tlsfuzzer-step");
    let scripts = compare::script_names(&vendored.join("scripts"), names)?;
    let runs = runs(&scripts, OPT_IN_SCRIPTS);
    let counts = compare::run_and_report(
        &runs,
        &["openssl", "tunneld"],
        SCRIPT_LIMIT,
        &report_dir,
        compare::Vacuous::Fails,
    )?;
    Ok(Some(counts))
}

fn sock(text: &str) -> SocketAddr {
    text.parse().expect("a constant socket address")
}

// ----------------------------------------------------------------------------------------
// The copy of tlsfuzzer

/// A private directory removed (with everything in it) when dropped.
struct TempDir(PathBuf);

impl TempDir {
    fn new() -> Result<TempDir, String> {
        let path = std::env::temp_dir().join(unique_name("tlsf"));
        fs::create_dir(&path).map_err(|e| format!("cannot create {}: {e}", path.display()))?;
        let dir = TempDir(path);
        fs::set_permissions(&dir.0, fs::Permissions::from_mode(0o700))
            .map_err(|e| format!("cannot restrict {}: {e}", dir.0.display()))?;
        Ok(dir)
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = fs::remove_dir_all(&self.0);
    }
}

/// Copies the directory tree `from` to `to` (files and directories; symlinks as the files
/// they name), made writable for the copy's `__pycache__`. Bounded: at most this many entries.
fn copy_tree(from: &Path, to: &Path) -> Result<(), String> {
    const MAX_ENTRIES: usize = 20_000;
    let mut pending = vec![(from.to_path_buf(), to.to_path_buf())];
    let mut entries = 0;
    while let Some((src, dst)) = pending.pop() {
        fs::create_dir(&dst).map_err(|e| format!("cannot create {}: {e}", dst.display()))?;
        let list = fs::read_dir(&src).map_err(|e| format!("cannot read {}: {e}", src.display()))?;
        for entry in list {
            entries += 1;
            if entries > MAX_ENTRIES {
                return Err(format!(
                    "{} holds more than {MAX_ENTRIES} entries; is it tlsfuzzer?",
                    from.display()
                ));
            }
            let entry = entry.map_err(|e| format!("reading {}: {e}", src.display()))?;
            let (s, d) = (entry.path(), dst.join(entry.file_name()));
            if s.is_dir() {
                pending.push((s, d));
            } else {
                fs::copy(&s, &d).map_err(|e| format!("cannot copy {}: {e}", s.display()))?;
                let mode = fs::metadata(&d)
                    .map_err(|e| e.to_string())?
                    .permissions()
                    .mode();
                fs::set_permissions(&d, fs::Permissions::from_mode(mode | 0o200))
                    .map_err(|e| e.to_string())?;
            }
        }
    }
    Ok(())
}

/// The vendored copy holds each script's symlink to `_stub.py` as a file whose content is
/// the link's target; makes them symlinks again.
fn relink_scripts(scripts: &Path) -> Result<(), String> {
    let list =
        fs::read_dir(scripts).map_err(|e| format!("cannot read {}: {e}", scripts.display()))?;
    let mut made = 0;
    for entry in list {
        let path = entry.map_err(|e| e.to_string())?.path();
        let small = fs::metadata(&path).is_ok_and(|m| m.is_file() && m.len() < 64);
        if !small || path.file_name().is_some_and(|n| n == "_stub.py") {
            continue;
        }
        let target = fs::read_to_string(&path).unwrap_or_default();
        let target = target.trim();
        if target.ends_with(".py") && !target.contains('/') {
            fs::remove_file(&path).map_err(|e| e.to_string())?;
            std::os::unix::fs::symlink(target, &path)
                .map_err(|e| format!("cannot link {}: {e}", path.display()))?;
            made += 1;
        }
    }
    if made == 0 {
        return Err(format!("no script links in {}", scripts.display()));
    }
    Ok(())
}

// ----------------------------------------------------------------------------------------
// The certificate and tunneld

/// A self-signed RSA-2048 certificate for [`SERVER_NAME`] and its key (PKCS#8, mode 0600).
fn certificate(dir: &Path) -> Result<(PathBuf, PathBuf), String> {
    let (cert, key) = (dir.join("server.pem"), dir.join("server.key"));
    let out = system::output_within(
        Command::new("openssl")
            .args([
                "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
            ])
            .args(["-subj", &format!("/CN={SERVER_NAME}")])
            .args(["-addext", &format!("subjectAltName=DNS:{SERVER_NAME}")])
            .arg("-keyout")
            .arg(&key)
            .arg("-out")
            .arg(&cert),
        Duration::from_secs(60),
    )?;
    if !out.status.success() {
        return Err(format!(
            "openssl req failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    fs::set_permissions(&key, fs::Permissions::from_mode(0o600)).map_err(|e| e.to_string())?;
    Ok((cert, key))
}

fn start_tunneld(
    ns: &NetNs,
    bin: &Path,
    dir: &Path,
    cert: &Path,
    key: &Path,
    log: &Path,
) -> Result<Guard, String> {
    let mut config = String::new();
    let every = tunneld_config::LISTEN_GROUPS
        .iter()
        .map(|g| format!("\"{g}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let every = format!("groups = [{every}]\n");
    for (listen, to, groups) in [
        (TLS_HTTP, HTTP_BACKEND, ""),
        (TLS_ECHO, ECHO_BACKEND, ""),
        (TLS_OPT_IN, HTTP_BACKEND, every.as_str()),
    ] {
        config.push_str(&format!(
            "[[tls.listen]]\nlisten = \"{listen}\"\ncert_file = \"{}\"\nkey_file = \"{}\"\n\
             forward_to = \"{to}\"\n{groups}\n",
            cert.display(),
            key.display()
        ));
    }
    let path = dir.join("tunneld.toml");
    fs::write(&path, config).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let stderr = fs::File::create(log).map_err(|e| format!("cannot create log: {e}"))?;
    let mut guard = Guard(
        ns.command(&bin.to_string_lossy())
            .arg("up")
            .arg(&path)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .map_err(|e| format!("cannot start tunneld: {e}"))?,
    );
    let deadline = Instant::now() + READY_LIMIT;
    loop {
        if let Ok(Some(status)) = guard.0.try_wait() {
            return Err(format!("tunneld exited ({status}):{}", tail(log)));
        }
        if crate::tls_bench::listening(ns, &[TLS_HTTP, TLS_ECHO, TLS_OPT_IN]) {
            return Ok(guard);
        }
        if Instant::now() >= deadline {
            return Err(format!(
                "tunneld did not listen within {} s:{}",
                READY_LIMIT.as_secs(),
                tail(log)
            ));
        }
        system::check_interrupted()?;
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The last lines of a log, for error messages.
fn tail(log: &Path) -> String {
    let text = fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    let mut out = String::new();
    for line in &lines[lines.len().saturating_sub(15)..] {
        out.push_str("\n  ");
        out.push_str(line);
    }
    out
}

/// An ordinary TLS client (`openssl s_client`, verifying the certificate and its name) gets
/// the HTTP answer through the listener.
fn still_serves(ns: &NetNs, cert: &Path) -> Result<(), String> {
    // -quiet: no session details, and it reads until the server closes after stdin's end.
    let mut cmd = ns.command("openssl");
    cmd.args(["s_client", "-quiet", "-tls1_3"])
        .args(["-connect", TLS_HTTP, "-servername", SERVER_NAME])
        .args(["-verify_hostname", SERVER_NAME, "-verify_return_error"])
        .arg("-CAfile")
        .arg(cert);
    let out = system::output_with_input(&mut cmd, HTTP_REQUEST, Duration::from_secs(20))?;
    let answer = String::from_utf8_lossy(&out.stdout);
    if out.status.success() && answer.starts_with("HTTP/1.0 200 ") {
        Ok(())
    } else {
        Err(format!(
            "after the scripts, openssl s_client got no answer through {TLS_HTTP} ({}): {}{}",
            out.status,
            answer.trim(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

// ----------------------------------------------------------------------------------------
// The backends

/// The request `still_serves` sends (the scripts send the same).
const HTTP_REQUEST: &[u8] = b"GET / HTTP/1.0\r\n\r\n";
/// The HTTP backend's answer to every GET, in one write.
const HTTP_ANSWER: &[u8] = b"HTTP/1.0 200 OK\r\nContent-Type: text/plain\r\nContent-Length: \
    22\r\nConnection: close\r\n\r\ntunneld tlsfuzzer run\n";

/// A TCP server on a thread that entered the namespace, a thread per connection. Stops
/// accepting when dropped; connection threads end when their client closes, or after
/// [`BACKEND_IO`] of silence.
struct Backend {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Backend {
    fn start(ns: &NetNs, addr: SocketAddr, serve: fn(TcpStream)) -> Result<Backend, String> {
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<(), String>>();
        let stopping = stop.clone();
        let thread = ns.spawn_in_ns(move || {
            let listener = match TcpListener::bind(addr) {
                Ok(l) => l,
                Err(e) => {
                    let _ = ready_tx.send(Err(format!("backend cannot bind {addr}: {e}")));
                    return;
                }
            };
            let _ = ready_tx.send(Ok(()));
            // Bounded even if never stopped: at most an hour.
            let deadline = Instant::now() + Duration::from_secs(3600);
            while !stopping.load(Ordering::SeqCst) && Instant::now() < deadline {
                if !crate::tls_bench::readable(listener.as_raw_fd(), 100) {
                    continue;
                }
                if let Ok((stream, _)) = listener.accept() {
                    let _ = stream.set_read_timeout(Some(BACKEND_IO));
                    let _ = stream.set_write_timeout(Some(BACKEND_IO));
                    std::thread::spawn(move || serve(stream));
                }
            }
        });
        let ready = ready_rx
            .recv_timeout(Duration::from_secs(5))
            .unwrap_or_else(|_| Err(format!("backend on {addr} did not start within 5 s")));
        let backend = Backend {
            stop,
            thread: Some(thread),
        };
        ready.map(|()| backend)
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads a request up to its blank line, answers a `GET` with [`HTTP_ANSWER`] in one write
/// (one TLS record on the other side), then closes, after reading what else comes so that
/// the close is a FIN, not a reset.
fn http_connection(mut stream: TcpStream) {
    let mut request = Vec::new();
    let mut buf = [0u8; 4096];
    while !request.windows(4).any(|w| w == b"\r\n\r\n") && request.len() < 64 * 1024 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => request.extend_from_slice(&buf[..n]),
        }
    }
    if request.starts_with(b"GET ") && stream.write_all(HTTP_ANSWER).is_err() {
        return;
    }
    let _ = stream.shutdown(Shutdown::Write);
    drain(&mut stream);
}

/// Sends each line back in one write (so as one TLS record), whatever pieces it came in.
/// `lengths` sends `A…A\n` and expects a record of the same size back.
fn echo_connection(mut stream: TcpStream) {
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
        if let Some(end) = pending.iter().rposition(|&b| b == b'\n') {
            if stream.write_all(&pending[..=end]).is_err() {
                return;
            }
            pending.drain(..=end);
        }
        if pending.len() > 1 << 20 {
            return;
        }
    }
    let _ = stream.write_all(&pending);
    let _ = stream.shutdown(Shutdown::Write);
}

/// Reads until the end of the stream (or a read timeout), at most 1 MiB.
fn drain(stream: &mut TcpStream) {
    let mut buf = [0u8; 4096];
    let mut left = 1usize << 20;
    while left > 0 {
        match stream.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => left = left.saturating_sub(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_step_runs_tls13_scripts_once_each() {
        let mut names = STEP_SCRIPTS.to_vec();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), STEP_SCRIPTS.len());
        assert_eq!(compare::short_name("test-tls13-lengths.py"), "lengths");
        // The group scripts run a second time, with the opt-in groups: each is a step script.
        let runs = runs(
            &names.iter().map(|n| n.to_string()).collect::<Vec<_>>(),
            OPT_IN_SCRIPTS,
        );
        let opt_in: Vec<&str> = runs
            .iter()
            .filter(|r| r.groups == Groups::OptIn)
            .map(|r| r.script.as_str())
            .collect();
        assert_eq!(opt_in, OPT_IN_SCRIPTS);
        assert!(OPT_IN_ONLY.iter().all(|s| OPT_IN_SCRIPTS.contains(s)));
        assert!(!runs
            .iter()
            .any(|r| r.groups == Groups::Default && OPT_IN_ONLY.contains(&r.script.as_str())));
        assert_eq!(
            script_count() as usize,
            STEP_SCRIPTS.len() - OPT_IN_ONLY.len() + OPT_IN_SCRIPTS.len()
        );
    }

    /// OpenSSL's servers get tunneld's groups but the hybrid its 3.0 lacks; the opt-in pair
    /// every group, X448 and the finite-field ones included.
    #[test]
    fn openssl_gets_the_listeners_groups() {
        assert_eq!(Groups::Default.openssl(), "X25519:secp256r1:secp384r1");
        let every = Groups::OptIn.openssl();
        for group in ["X448", "ffdhe2048", "ffdhe8192", "secp521r1"] {
            assert!(every.split(':').any(|g| g == group), "{every}");
        }
    }
}
