//! What several suites' end-to-end tests need beside namespaces: bounded waits, private
//! key files, byte patterns, stopping a daemon, and a wireguard-go peer.

use crate::NetNs;
use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Child;
use std::time::{Duration, Instant};

/// Generous: a wait for something that normally takes milliseconds, not a threshold.
pub const WAIT: Duration = Duration::from_secs(15);

/// Polls `ok` every 50 ms until it holds; panics naming `what` after [`WAIT`].
pub fn wait_until(what: &str, mut ok: impl FnMut() -> bool) {
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if ok() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("timed out waiting for {what}");
}

/// Writes `content` to `dir/name` with mode 0600, as key files must be.
pub fn write_private(dir: &Path, name: &str, content: &str) -> PathBuf {
    let path = dir.join(name);
    fs::write(&path, content).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    path
}

/// `len` bytes of a deterministic pattern (xorshift from `seed`), so a transfer can be
/// checked byte for byte.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(2_654_435_761) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// Stops a daemon as its service manager would: SIGTERM, up to 5 s to exit, then SIGKILL;
/// reaped either way.
pub fn stop_process(child: &mut Child) {
    let _ = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status();
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    let _ = child.wait();
}

/// The UAPI socket of interface `ifname` (wireguard-go's and tunneld's).
pub fn uapi_socket_path(ifname: &str) -> PathBuf {
    PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"))
}

/// Starts wireguard-go in the foreground in `ns` with interface `ifname`, logging (debug) to
/// `log`, and returns once its UAPI socket is there (panics with the log if it exits first).
/// The caller configures it with `wg` and stops it ([`stop_process`] or a kill).
pub fn start_wireguard_go(ns: &NetNs, ifname: &str, log: &Path) -> Child {
    let file = fs::File::create(log).unwrap();
    let mut child = ns
        .command("wireguard-go")
        .args(["-f", ifname])
        .env("WG_PROCESS_FOREGROUND", "1")
        .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
        .env("LOG_LEVEL", "debug")
        .stdout(file.try_clone().unwrap())
        .stderr(file)
        .spawn()
        .unwrap();
    let socket = uapi_socket_path(ifname);
    wait_until("wireguard-go's UAPI socket", || {
        if let Ok(Some(status)) = child.try_wait() {
            panic!(
                "wireguard-go exited early ({status}):\n{}",
                fs::read_to_string(log).unwrap_or_default()
            );
        }
        socket.exists()
    });
    child
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pattern_is_the_same_for_a_seed_and_differs_between_seeds() {
        assert_eq!(pattern(4096, 7), pattern(4096, 7));
        assert_ne!(pattern(4096, 7), pattern(4096, 8));
        assert_eq!(pattern(10, 7), pattern(4096, 7)[..10]);
        // Not a short cycle: every byte value shows up in 4 KiB.
        let seen: std::collections::HashSet<u8> = pattern(4096, 1).into_iter().collect();
        assert_eq!(seen.len(), 256);
    }

    #[test]
    fn a_private_file_is_readable_by_its_owner_only() {
        let dir = std::env::temp_dir().join(crate::unique_name("tdfx"));
        fs::create_dir(&dir).unwrap();
        let path = write_private(&dir, "k", "secret");
        let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(
            (fs::read_to_string(&path).unwrap(), mode),
            ("secret".into(), 0o600)
        );
        fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stopping_a_process_that_ignores_sigterm_kills_it() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "trap '' TERM; exec sleep 30"])
            .spawn()
            .unwrap();
        let started = Instant::now();
        stop_process(&mut child);
        assert!(child.try_wait().unwrap().is_some(), "reaped");
        assert!(started.elapsed() < Duration::from_secs(20));
    }

    #[test]
    fn waiting_returns_once_the_condition_holds() {
        let mut calls = 0;
        wait_until("the third call", || {
            calls += 1;
            calls == 3
        });
        assert_eq!(calls, 3);
    }
}
