//! What systemd sees of `tunneld up` under `Type=notify`: READY=1 once the interface is up,
//! RELOADING=1 (with MONOTONIC_USEC) then READY=1 around a SIGHUP, STOPPING=1 on SIGTERM.
//! The notify socket is a datagram socket this test binds, as systemd would.

mod common;

use common::*;
use std::os::unix::net::UnixDatagram;
use std::process::Stdio;
use std::time::Duration;
use tunneld_testnet::NetNs;

/// Kills the process if the test ends before it has exited.
struct KillOnDrop(std::process::Child);
impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The exit status of `child`, waited for at most [`WAIT`].
fn wait_for_exit(child: &mut std::process::Child) -> std::process::ExitStatus {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(std::time::Instant::now() < deadline, "tunneld did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The next message on `socket` (bounded).
fn next_message(socket: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = socket
        .recv(&mut buf)
        .expect("a notify message within the timeout");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn up_tells_systemd_ready_reloading_and_stopping() {
    if !require_netns_and_wg("up_tells_systemd_ready_reloading_and_stopping") {
        return;
    }
    let ns = NetNs::new();
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let ifname = tunneld_testnet::unique_name("wg");
    write_private(dir.path(), "private.key", &genkey());
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"private.key\"\naddress = [\"10.77.0.1/24\"]\n"
        ),
    )
    .unwrap();
    let mut child = KillOnDrop(
        ns.command(TUNNELD)
            .args(["up"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let kill = |signal: &str, pid: u32| {
        std::process::Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .unwrap()
    };

    step("READY=1 once the interface is up");
    let ready = next_message(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    assert!(
        ready.contains(&format!("STATUS=interface {ifname} up")),
        "{ready:?}"
    );
    assert!(ns.output(&["ip", "link", "show", &ifname]).status.success());

    step("SIGHUP: RELOADING=1 with MONOTONIC_USEC, then READY=1");
    kill("HUP", child.0.id());
    let reloading = next_message(&socket);
    assert!(
        reloading.lines().any(|l| l == "RELOADING=1"),
        "{reloading:?}"
    );
    let usec = reloading
        .lines()
        .find_map(|l| l.strip_prefix("MONOTONIC_USEC="))
        .and_then(|v| v.parse::<u64>().ok());
    assert!(usec.is_some_and(|u| u > 0), "{reloading:?}");
    let ready = next_message(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");

    step("SIGTERM: STOPPING=1, then a clean exit");
    kill("TERM", child.0.id());
    let stopping = next_message(&socket);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "{stopping:?}");
    let status = wait_for_exit(&mut child.0);
    assert!(status.success(), "{status}");
}

/// The messages that arrive on `socket` within `time`.
fn messages_within(socket: &UnixDatagram, time: Duration) -> Vec<String> {
    let deadline = std::time::Instant::now() + time;
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
        socket
            .set_read_timeout(Some(left.max(Duration::from_millis(1))))
            .unwrap();
        if let Ok(n) = socket.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
    }
    messages
}

/// `WatchdogSec=`: systemd sets WATCHDOG_USEC, and tunneld says WATCHDOG=1 every half
/// interval while every worker makes progress. A worker that stops (the test hook
/// `TUNNELD_TEST_STALL_AFTER_MS` makes one sleep in its loop) leaves the watchdog unfed, so
/// systemd would kill the service after the interval; the test plays systemd's part.
#[test]
fn the_watchdog_is_fed_from_the_workers_progress_and_starves_when_one_is_stuck() {
    let test = "the_watchdog_is_fed_from_the_workers_progress_and_starves_when_one_is_stuck";
    if !require_netns_and_wg(test) {
        return;
    }
    let ns = NetNs::new();
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify.sock");
    let socket = UnixDatagram::bind(&notify).unwrap();
    socket.set_read_timeout(Some(WAIT)).unwrap();
    let ifname = tunneld_testnet::unique_name("wg");
    write_private(dir.path(), "private.key", &genkey());
    let config = dir.path().join("gateway.toml");
    std::fs::write(
        &config,
        format!(
            "[interface]\nname = \"{ifname}\"\nprivate_key_file = \"private.key\"\naddress = [\"10.77.0.1/24\"]\n\n[dataplane]\nworkers = 2\n"
        ),
    )
    .unwrap();
    let _child = KillOnDrop(
        ns.command(TUNNELD)
            .args(["up"])
            .arg(&config)
            .env("NOTIFY_SOCKET", &notify)
            .env("WATCHDOG_USEC", "1000000")
            .env("TUNNELD_TEST_STALL_AFTER_MS", "3000")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    step("READY=1, then WATCHDOG=1 every half second while both workers run");
    let ready = next_message(&socket);
    assert!(ready.lines().any(|l| l == "READY=1"), "{ready:?}");
    let fed = messages_within(&socket, Duration::from_millis(2000));
    let watchdog = fed.iter().filter(|m| m.trim() == "WATCHDOG=1").count();
    assert!(
        watchdog >= 2,
        "the watchdog was fed {watchdog} times: {fed:?}"
    );

    step("one worker stuck (the hook, 3 s after start): no WATCHDOG=1 from then on");
    // The stall comes at 3 s; the last feeding may be up to half an interval later. What
    // arrives until then is read and set aside.
    let _ = messages_within(&socket, Duration::from_millis(2000));
    let starved = messages_within(&socket, Duration::from_millis(3000));
    assert!(
        !starved.iter().any(|m| m.trim() == "WATCHDOG=1"),
        "the watchdog was fed while a worker was stuck: {starved:?}"
    );
}

/// Puts a directory's owner back when dropped (also when the test fails).
struct Owner {
    path: &'static str,
    uid: u32,
    gid: u32,
}

impl Owner {
    fn change(path: &'static str, uid: u32, gid: u32) -> Owner {
        use std::os::unix::fs::MetadataExt;
        std::fs::create_dir_all(path).unwrap();
        let meta = std::fs::metadata(path).unwrap();
        let before = Owner {
            path,
            uid: meta.uid(),
            gid: meta.gid(),
        };
        std::os::unix::fs::chown(path, Some(uid), Some(gid)).unwrap();
        before
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        let _ = std::os::unix::fs::chown(self.path, Some(self.uid), Some(self.gid));
    }
}

/// A command that runs its arguments in `ns` and in a mount namespace of their own, where
/// `/dev/net` is a new tmpfs holding a TUN clone device (character 10:200, fixed by the
/// kernel's ABI) of `mode`, owned by root. The host's device is neither used nor changed.
fn with_tun_device(ns: &NetNs, mode: &str) -> std::process::Command {
    let mut cmd = ns.command("unshare");
    cmd.args([
        "--mount",
        "--propagation",
        "private",
        "sh",
        "-ec",
        "mode=$1; shift; mount -t tmpfs -o mode=0755 tunneld-test /dev/net; \
         mknod -m \"$mode\" /dev/net/tun c 10 200; exec \"$@\"",
        "sh",
        mode,
    ]);
    cmd
}

/// What the unit does (`User=tunneld`, `AmbientCapabilities=CAP_NET_ADMIN`,
/// `CapabilityBoundingSet=CAP_NET_ADMIN`, `RuntimeDirectory=wireguard` owned by the user):
/// `tunneld up` started by `setpriv` as `nobody` with CAP_NET_ADMIN alone brings the
/// interface up, carries traffic to a peer, serves `wg` (root's), reloads its file on
/// SIGHUP and removes its socket on SIGTERM; every thread runs as that user with
/// CAP_NET_ADMIN and nothing else. A device the user cannot open is refused with what to
/// change.
#[test]
fn up_runs_as_an_unprivileged_user_with_cap_net_admin_alone() {
    const NOBODY: u32 = 65534;
    let test = "up_runs_as_an_unprivileged_user_with_cap_net_admin_alone";
    if !require_netns_and_wg(test) || !require_tool(test, "setpriv") {
        return;
    }
    let (a, b) = two_sites();
    let (ka, kb) = (genkey(), genkey());
    let ib = tunneld_testnet::unique_name("wg");
    let _gb = Gateway::start(&b, &ib, &kb, &site_body(2, &pubkey(&ka), "192.0.2.1:51820"));

    // The binary, config and key in a directory of the user's own (the build's directory
    // may not be open to other users).
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("tunneld");
    std::fs::copy(TUNNELD, &bin).unwrap();
    write_private(dir.path(), "private.key", &ka);
    let ia = tunneld_testnet::unique_name("wg");
    let body = site_body(1, &pubkey(&kb), "192.0.2.2:51820");
    let config = dir.path().join("gateway.toml");
    let write_config = |extra: &str| {
        std::fs::write(
            &config,
            format!(
                "[interface]\nname = \"{ia}\"\nprivate_key_file = \"private.key\"\n{body}{extra}"
            ),
        )
        .unwrap();
    };
    write_config("");
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        std::os::unix::fs::chown(entry.unwrap().path(), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    // The UAPI socket's directory, as RuntimeDirectory= makes it; root's tunnelds and `wg`
    // go on using it.
    let _run = Owner::change("/var/run/wireguard", NOBODY, NOBODY);
    let log = dir.path().join("tunneld.log");
    // tunneld as the unit runs it, with a /dev/net/tun of `mode` of its own (see
    // `with_tun_device`): hosts differ (udev makes it 0666; a host without udev may leave it
    // 0600), so the test makes the device it needs instead of assuming the host's.
    let as_nobody = |mode: &str| {
        let mut cmd = with_tun_device(&a, mode);
        cmd.args([
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--bounding-set=-all,+net_admin",
            "--inh-caps=-all,+net_admin",
            "--ambient-caps=+net_admin",
        ])
        .arg(&bin)
        .arg("up")
        .arg(&config);
        cmd
    };

    step("a /dev/net/tun the user cannot open: one line saying what to change");
    let out = output_bounded(&mut as_nobody("0600"));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success(),
        "started without the device:\n{stderr}"
    );
    let error = the_one_error_line(&stderr);
    assert!(
        error.contains("/dev/net/tun is mode 0600")
            && error.contains("uid 65534")
            && error.contains("make it 0666"),
        "{stderr}"
    );

    step("tunneld up as nobody with CAP_NET_ADMIN alone");
    let mut child = KillOnDrop(
        as_nobody("0666")
            .env("TUNNELD_LOG", "debug")
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let socket = socket_path(&ia);
    wait_until("the interface is up", || {
        if let Ok(Some(status)) = child.0.try_wait() {
            panic!("tunneld exited ({status}):\n{}", log_text());
        }
        log_text().contains("interface up") && socket.exists()
    });
    ping(&a, "10.77.0.2");
    let shown = a.run(&["wg", "show", &ia]);
    assert!(shown.contains("latest handshake"), "{shown}");

    step("every thread runs as nobody with CAP_NET_ADMIN alone");
    let pid = child.0.id();
    let mut threads = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let status = std::fs::read_to_string(task.unwrap().path().join("status")).unwrap();
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
        };
        assert_eq!(field("Uid:"), "65534 65534 65534 65534", "{status}");
        // CAP_NET_ADMIN is bit 12.
        assert_eq!(field("CapEff:"), "0000000000001000", "{status}");
        assert_eq!(field("CapPrm:"), "0000000000001000", "{status}");
        threads += 1;
    }
    assert!(threads > 1, "tunneld runs {threads} thread");

    step("SIGHUP: the file read again as nobody, a new allowed IP routed");
    write_config("");
    let changed = std::fs::read_to_string(&config)
        .unwrap()
        .replace("\"fd77::2/128\"]", "\"fd77::2/128\", \"10.99.0.0/24\"]");
    std::fs::write(&config, changed).unwrap();
    std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()
        .unwrap();
    wait_until("the reload is applied", || {
        log_text().contains("WireGuard settings reloaded")
    });
    let routes = a.run(&["ip", "route", "show", "dev", &ia]);
    assert!(routes.contains("10.99.0.0/24"), "{routes}");

    step("SIGTERM: it exits and removes its socket");
    std::process::Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    let status = wait_for_exit(&mut child.0);
    assert!(status.success(), "{status}:\n{}", log_text());
    assert!(!socket.exists(), "the socket is left behind");

    step("a key file the user cannot read: one line naming the file and the user");
    write_private(dir.path(), "root.key", &genkey());
    let refused = dir.path().join("refused.toml");
    std::fs::write(
        &refused,
        format!("[interface]\nname = \"{ia}\"\nprivate_key_file = \"root.key\"\n{body}"),
    )
    .unwrap();
    let out = std::process::Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(&bin)
        .arg("check")
        .arg(&refused)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "check accepted an unreadable key");
    assert!(
        stderr.contains("interface.private_key_file: cannot read")
            && stderr.contains("root.key")
            && stderr.contains("tunneld runs as uid 65534: the file must be that user's"),
        "{stderr}"
    );
}
