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
    let deadline = std::time::Instant::now() + WAIT;
    let status = loop {
        if let Some(status) = child.0.try_wait().unwrap() {
            break status;
        }
        assert!(std::time::Instant::now() < deadline, "tunneld did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
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
