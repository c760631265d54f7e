//! Network namespaces for privileged tests, made by the test and removed when dropped.
//!
//! Every name carries the process id and a counter, so tests run in parallel without
//! colliding. Without root (or without `ip netns`), [`require_netns`] tells the test to skip.
//! Every skip in the workspace goes through [`skip_unless`] (module [`skip`]), which
//! `TUNNELD_REQUIRE_ALL=1` turns into a failure unless what is missing is hardware.

pub mod etcd;
pub mod fixture;
pub mod link;
pub mod nat;
pub mod relay;
pub mod skip;

pub use fixture::{
    pattern, start_wireguard_go, stop_process, uapi_socket_path, wait_until, write_private, WAIT,
};
pub use skip::{skip_unless, Missing};

use std::fs::File;
use std::os::fd::AsRawFd;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// A short name unique to this process and call: `{prefix}{pid}x{n}`, at most 15 bytes when
/// `prefix` is at most 4 bytes (interface names are limited to 15).
pub fn unique_name(prefix: &str) -> String {
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let pid = std::process::id() % 1_000_000;
    format!("{prefix}{pid}x{n}")
}

/// Why privileged namespace tests cannot run here (not root, or no usable `ip netns`), or
/// `None` when they can. For what is not a test (`cargo xtask bench`); tests call
/// [`require_netns`].
pub fn netns_unusable() -> Option<&'static str> {
    if unsafe_geteuid() != 0 {
        Some("not running as root (run as root to include it)")
    } else if !Command::new("ip")
        .args(["netns", "list"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
    {
        Some("`ip netns` is not usable (is iproute2 installed?)")
    } else {
        None
    }
}

/// Whether privileged namespace tests can run here; a skip (or, under
/// `TUNNELD_REQUIRE_ALL=1`, a failure) through [`skip_unless`] otherwise.
pub fn require_netns(test: &str) -> bool {
    match netns_unusable() {
        None => true,
        Some(why) => skip_unless(
            test,
            false,
            "the network-namespace test",
            Missing::Setup(why),
        ),
    }
}

/// Whether the external `tool` is on PATH (`cargo xtask deps` installs it); a skip through
/// [`skip_unless`] otherwise.
pub fn require_tool(test: &str, tool: &str) -> bool {
    let found = std::env::var_os("PATH")
        .map(|paths| std::env::split_paths(&paths).any(|dir| dir.join(tool).is_file()))
        .unwrap_or(false);
    skip_unless(
        test,
        found,
        &format!("what needs `{tool}`"),
        Missing::Setup("it is not installed (`cargo xtask deps` installs it)"),
    )
}

/// Runs `f` where the IPv6 loopback address `::1` is usable: on this thread when the host's
/// loopback has it, else in a namespace of its own whose loopback has IPv6 turned on (hosts
/// and containers often disable IPv6, which is set-up the test can undo, not a fact about
/// what it tests). Needs root for the namespace; without it a skip through [`skip_unless`].
pub fn with_ipv6_loopback<T: Send + 'static>(
    test: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    if std::net::UdpSocket::bind("[::1]:0").is_ok() {
        return Some(f());
    }
    if !require_netns(test) {
        return None;
    }
    in_namespace_with_ipv6_loopback(test, f)
}

/// The namespace half of [`with_ipv6_loopback`]; `None` (a skip) only when this kernel has
/// no IPv6 at all.
fn in_namespace_with_ipv6_loopback<T: Send + 'static>(
    test: &str,
    f: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    let ns = NetNs::new();
    let test = test.to_string();
    ns.in_ns(move || {
        // /proc/sys/net is the namespace of the thread that opens it: this one's.
        let knob = "/proc/sys/net/ipv6/conf/lo/disable_ipv6";
        let enabled = std::fs::write(knob, "0");
        let why = format!("this kernel has no IPv6 ({knob}: {enabled:?})");
        if !skip_unless(
            &test,
            enabled.is_ok(),
            "the IPv6 loopback test",
            Missing::Setup(&why),
        ) {
            return None;
        }
        Some(f())
    })
}

fn unsafe_geteuid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// A network namespace that exists until this value is dropped.
#[derive(Debug)]
pub struct NetNs {
    name: String,
}

impl NetNs {
    /// Creates `td{pid}x{n}` and brings its loopback up.
    // Not `Default`: creating a namespace is a system change, not a default value.
    #[allow(clippy::new_without_default)]
    pub fn new() -> NetNs {
        let name = unique_name("td");
        run_ok(Command::new("ip").args(["netns", "add", &name]));
        let ns = NetNs { name };
        ns.run(&["ip", "link", "set", "lo", "up"]);
        ns
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// A command that runs inside the namespace.
    pub fn command(&self, program: &str) -> Command {
        let mut cmd = Command::new("ip");
        cmd.args(["netns", "exec", &self.name, program]);
        cmd
    }

    /// Runs `argv` inside the namespace and panics with its output if it fails.
    pub fn run(&self, argv: &[&str]) -> String {
        let mut cmd = self.command(argv[0]);
        cmd.args(&argv[1..]);
        let out = run_ok(&mut cmd);
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs `argv` inside the namespace and returns its raw output, success or not.
    pub fn output(&self, argv: &[&str]) -> Output {
        let mut cmd = self.command(argv[0]);
        cmd.args(&argv[1..]);
        cmd.output()
            .unwrap_or_else(|e| panic!("cannot run {argv:?}: {e}"))
    }

    /// Turns off ICMP redirects both ways for the interfaces made after this call: this
    /// namespace sends none (IPv4; IPv6 has no such switch) and takes none (IPv4 and IPv6).
    /// For a LAN whose gateways hand each other what they cannot carry: a redirect would send
    /// a host straight to one gateway and keep it there for minutes after that one died.
    pub fn without_redirects(&self) {
        for key in [
            "net.ipv4.conf.all.send_redirects",
            "net.ipv4.conf.default.send_redirects",
            "net.ipv4.conf.all.accept_redirects",
            "net.ipv4.conf.default.accept_redirects",
            "net.ipv6.conf.all.accept_redirects",
            "net.ipv6.conf.default.accept_redirects",
        ] {
            self.run(&["sysctl", "-qw", &format!("{key}=0")]);
        }
    }

    /// Runs `f` on a new thread that has entered this namespace (sockets it opens live there).
    pub fn in_ns<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
        .join()
        .unwrap_or_else(|e| std::panic::resume_unwind(e))
    }

    /// Spawns a thread that has entered this namespace and runs `f` there.
    pub fn spawn_in_ns<T: Send + 'static>(
        &self,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> std::thread::JoinHandle<T> {
        let path = format!("/var/run/netns/{}", self.name);
        std::thread::spawn(move || {
            enter(&path);
            f()
        })
    }
}

fn enter(path: &str) {
    let file = File::open(path).unwrap_or_else(|e| panic!("cannot open {path}: {e}"));
    // SAFETY: setns on a valid namespace fd; it changes only the calling thread's namespace.
    let rc = unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Processes still inside would keep interfaces alive; kill them first.
        let _ = Command::new("ip")
            .args(["netns", "pids", &self.name])
            .output()
            .map(|out| {
                for pid in String::from_utf8_lossy(&out.stdout).split_whitespace() {
                    let _ = Command::new("kill").args(["-9", pid]).status();
                }
            });
        let _ = Command::new("ip")
            .args(["netns", "del", &self.name])
            .stderr(Stdio::null())
            .status();
    }
}

/// Joins two namespaces with a veth pair and gives each end an address (CIDR form).
/// Returns the interface names (in `a`, in `b`).
pub fn veth(a: &NetNs, a_addr: &str, b: &NetNs, b_addr: &str) -> (String, String) {
    let a_if = unique_name("va");
    let b_if = unique_name("vb");
    run_ok(Command::new("ip").args([
        "link",
        "add",
        &a_if,
        "netns",
        a.name(),
        "type",
        "veth",
        "peer",
        "name",
        &b_if,
        "netns",
        b.name(),
    ]));
    for (ns, ifname, addr) in [(a, &a_if, a_addr), (b, &b_if, b_addr)] {
        if addr.contains(':') {
            // nodad: the address is usable at once instead of after duplicate detection.
            ns.run(&["ip", "-6", "addr", "add", addr, "dev", ifname, "nodad"]);
        } else {
            ns.run(&["ip", "-4", "addr", "add", addr, "dev", ifname]);
        }
        ns.run(&["ip", "link", "set", ifname, "up"]);
    }
    (a_if, b_if)
}

/// The source addresses [`hub_and_spokes`] gives the spokes: 192.0.2.10-137 and
/// 198.51.100.1-128.
pub fn spoke_source_addresses() -> Vec<std::net::IpAddr> {
    (10..138u8)
        .map(|h| std::net::IpAddr::from([192, 0, 2, h]))
        .chain((1..129u8).map(|h| std::net::IpAddr::from([198, 51, 100, h])))
        .collect()
}

/// Joins a hub's namespace (192.0.2.1) to a spokes' namespace (192.0.2.2) holding the 256
/// [`spoke_source_addresses`], which the hub reaches through 192.0.2.2 rather than on the
/// link: so the hub keeps one neighbour entry, not 256. The kernel's neighbour table is
/// one for all namespaces (`gc_thresh3`, 1024 by default): 256 on-link spokes per hub,
/// beside other tests' namespaces, overflowed it, and replies to spokes were dropped.
/// Returns the source addresses.
pub fn hub_and_spokes(hub: &NetNs, spokes: &NetNs) -> Vec<std::net::IpAddr> {
    let (hub_if, spokes_if) = veth(hub, "192.0.2.1/32", spokes, "192.0.2.2/24");
    hub.run(&["ip", "route", "add", "192.0.2.2/32", "dev", &hub_if]);
    for net in ["192.0.2.0/24", "198.51.100.0/24"] {
        hub.run(&["ip", "route", "add", net, "via", "192.0.2.2"]);
    }
    let addresses = spoke_source_addresses();
    let mut batch = String::new();
    for ip in &addresses {
        batch.push_str(&format!("address add {ip}/24 dev {spokes_if}\n"));
    }
    let mut child = spokes
        .command("ip")
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .spawn()
        .expect("ip -batch");
    {
        use std::io::Write;
        let mut stdin = child.stdin.take().expect("ip's stdin");
        stdin
            .write_all(batch.as_bytes())
            .expect("ip -batch's input");
    }
    assert!(
        child.wait().expect("ip -batch").success(),
        "ip -batch failed"
    );
    addresses
}

/// Runs a command and panics with its stderr when it fails.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&out.stderr).trim()
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn veth_joins_two_namespaces() {
        if !require_netns("veth_joins_two_namespaces") {
            return;
        }
        let a = NetNs::new();
        let b = NetNs::new();
        veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
        a.run(&["ping", "-c", "1", "-W", "2", "192.0.2.2"]);
        let name = a.name().to_string();
        drop(a);
        let list = run_ok(Command::new("ip").args(["netns", "list"]));
        assert!(!String::from_utf8_lossy(&list.stdout).contains(&name));
    }

    #[test]
    fn a_namespace_of_its_own_has_a_usable_ipv6_loopback() {
        let test = "a_namespace_of_its_own_has_a_usable_ipv6_loopback";
        if !require_netns(test) {
            return;
        }
        let bound = in_namespace_with_ipv6_loopback(test, || {
            let socket = std::net::UdpSocket::bind("[::1]:0").unwrap();
            socket.send_to(b"v6", socket.local_addr().unwrap()).unwrap();
            let mut buf = [0; 2];
            socket.recv(&mut buf).unwrap();
            buf
        });
        assert_eq!(bound, Some(*b"v6"));
    }
}
