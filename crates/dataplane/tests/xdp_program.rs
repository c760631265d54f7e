//! The XDP program and its loader against the real kernel (privileged: skipped without root
//! unless TUNNELD_REQUIRE_ALL=1). Verdicts come from BPF_PROG_TEST_RUN, which runs the
//! loaded program on a frame without attaching it; attaching is tried on a veth in a network
//! namespace the test creates (and removes, also when it fails).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use tunneld_dataplane::xdp::program::{
    attach_legacy, attached_program, AttachMode, AttachedMode, XdpProgram, PROGRAM_NAME, XDP_PASS,
    XDP_REDIRECT,
};
use tunneld_dataplane::xdp::{bpf, device};
use tunneld_testnet::{require_netns, unique_name, NetNs};

const PORT: u16 = 51820;
const V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 1);
const V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1);
const OTHER_V4: Ipv4Addr = Ipv4Addr::new(192, 0, 2, 2);
const OTHER_V6: Ipv6Addr = Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 2);

/// An AF_XDP socket, unbound: enough for the XSKMAP, which is all a test run looks at.
fn xsk() -> OwnedFd {
    // SAFETY: plain socket creation; the result is checked and owned at once.
    let raw = unsafe { libc::socket(libc::AF_XDP, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    assert!(raw >= 0, "AF_XDP socket: {}", io::Error::last_os_error());
    // SAFETY: a new descriptor nothing else owns.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// The program for PORT with V4 and V6 as its addresses and a socket on queue 0.
fn loaded() -> (XdpProgram, OwnedFd) {
    let prog = XdpProgram::load(PORT, 4).expect("load the XDP program");
    prog.set_addresses(&[V4.into(), V6.into()])
        .expect("set_addresses");
    let sock = xsk();
    prog.register_socket(0, sock.as_fd())
        .expect("register_socket");
    (prog, sock)
}

// ---------------------------------------------------------------------------------------------
// Frames

fn ethernet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0x02, 0, 0, 0, 0, 1, 0x02, 0, 0, 0, 0, 2];
    f.extend_from_slice(&ethertype.to_be_bytes());
    f.extend_from_slice(payload);
    f
}

fn udp(dst_port: u16, payload_len: usize) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&40000u16.to_be_bytes());
    u.extend_from_slice(&dst_port.to_be_bytes());
    u.extend_from_slice(&((8 + payload_len) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend((0..payload_len).map(|i| i as u8));
    u
}

/// An IPv4 packet; `options` are appended to the header (IHL grows), `frag` is the 16-bit
/// flags + fragment offset field.
fn ipv4(dst: Ipv4Addr, protocol: u8, frag: u16, options: &[u8], payload: &[u8]) -> Vec<u8> {
    let ihl = 5 + options.len() / 4;
    let total = ihl * 4 + payload.len();
    let mut p = vec![0x40 | ihl as u8, 0];
    p.extend_from_slice(&(total as u16).to_be_bytes());
    p.extend_from_slice(&[0x12, 0x34]);
    p.extend_from_slice(&frag.to_be_bytes());
    p.extend_from_slice(&[64, protocol, 0, 0]);
    p.extend_from_slice(&[198, 51, 100, 9]);
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(options);
    p.extend_from_slice(payload);
    p
}

fn ipv6(dst: Ipv6Addr, next_header: u8, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0x60, 0, 0, 0];
    p.extend_from_slice(&(payload.len() as u16).to_be_bytes());
    p.extend_from_slice(&[next_header, 64]);
    p.extend_from_slice(&Ipv6Addr::new(0x2001, 0xdb8, 9, 0, 0, 0, 0, 9).octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(payload);
    p
}

fn v4_udp(dst: Ipv4Addr, port: u16) -> Vec<u8> {
    ethernet(0x0800, &ipv4(dst, 17, 0x4000, &[], &udp(port, 32)))
}

fn v6_udp(dst: Ipv6Addr, port: u16) -> Vec<u8> {
    ethernet(0x86dd, &ipv6(dst, 17, &udp(port, 32)))
}

fn arp() -> Vec<u8> {
    let mut a = vec![0, 1, 8, 0, 6, 4, 0, 1, 0x02, 0, 0, 0, 0, 2, 192, 0, 2, 2];
    a.extend_from_slice(&[0; 6]);
    a.extend_from_slice(&V4.octets());
    ethernet(0x0806, &a)
}

/// The frames of the verdict table: (what, frame, verdict).
fn table() -> Vec<(&'static str, Vec<u8>, u32)> {
    // A hop-by-hop options header (8 bytes) carrying UDP.
    let mut hop_by_hop = vec![17, 0, 1, 4, 0, 0, 0, 0];
    hop_by_hop.extend(udp(PORT, 32));
    let mut ns = vec![135, 0, 0, 0, 0, 0, 0, 0];
    ns.extend_from_slice(&V6.octets());
    let mut vlan = vec![0, 5, 0x08, 0x00];
    vlan.extend(ipv4(V4, 17, 0, &[], &udp(PORT, 32)));
    // The tunnel's port in the UDP source port, another destination port.
    let mut swapped = udp(PORT, 32);
    swapped.swap(0, 2);
    swapped.swap(1, 3);
    swapped[2..4].copy_from_slice(&PORT.wrapping_add(1).to_be_bytes());
    let mut version_5 = ipv6(V6, 17, &udp(PORT, 32));
    version_5[0] = 0x50;
    vec![
        (
            "IPv4 UDP to our port and address",
            v4_udp(V4, PORT),
            XDP_REDIRECT,
        ),
        (
            "IPv4 UDP, DF clear",
            ethernet(0x0800, &ipv4(V4, 17, 0, &[], &udp(PORT, 0))),
            XDP_REDIRECT,
        ),
        (
            "IPv6 UDP to our port and address",
            v6_udp(V6, PORT),
            XDP_REDIRECT,
        ),
        ("IPv4, another port", v4_udp(V4, PORT + 1), XDP_PASS),
        (
            "IPv4, port byte-swapped",
            v4_udp(V4, PORT.swap_bytes()),
            XDP_PASS,
        ),
        ("IPv4, another address", v4_udp(OTHER_V4, PORT), XDP_PASS),
        (
            "IPv4, our port as the source",
            ethernet(0x0800, &ipv4(V4, 17, 0, &[], &swapped)),
            XDP_PASS,
        ),
        (
            "IPv4 with options",
            ethernet(0x0800, &ipv4(V4, 17, 0, &[1, 1, 1, 1], &udp(PORT, 32))),
            XDP_PASS,
        ),
        (
            "IPv4 first fragment (MF)",
            ethernet(0x0800, &ipv4(V4, 17, 0x2000, &[], &udp(PORT, 32))),
            XDP_PASS,
        ),
        (
            "IPv4 later fragment (offset)",
            ethernet(0x0800, &ipv4(V4, 17, 0x0007, &[], &udp(PORT, 32))),
            XDP_PASS,
        ),
        (
            "IPv4 last fragment (offset, DF bit pattern)",
            ethernet(0x0800, &ipv4(V4, 17, 0x1000, &[], &udp(PORT, 32))),
            XDP_PASS,
        ),
        (
            "IPv4 TCP",
            ethernet(0x0800, &ipv4(V4, 6, 0, &[], &udp(PORT, 32))),
            XDP_PASS,
        ),
        (
            "IPv4 ICMP",
            ethernet(0x0800, &ipv4(V4, 1, 0, &[], &[8, 0, 0, 0, 0, 1, 0, 1])),
            XDP_PASS,
        ),
        (
            "IPv4 header with version 6",
            {
                let mut f = v4_udp(V4, PORT);
                f[14] = 0x65;
                f
            },
            XDP_PASS,
        ),
        ("ARP", arp(), XDP_PASS),
        ("IPv6, another port", v6_udp(V6, PORT + 1), XDP_PASS),
        ("IPv6, another address", v6_udp(OTHER_V6, PORT), XDP_PASS),
        (
            "IPv6 to our IPv4 address, mapped",
            v6_udp(V4.to_ipv6_mapped(), PORT + 1),
            XDP_PASS,
        ),
        (
            "IPv6 with a hop-by-hop header",
            ethernet(0x86dd, &ipv6(V6, 0, &hop_by_hop)),
            XDP_PASS,
        ),
        (
            "IPv6 ICMPv6 neighbour solicitation",
            ethernet(0x86dd, &ipv6(V6, 58, &ns)),
            XDP_PASS,
        ),
        (
            "IPv6 header with version 5",
            ethernet(0x86dd, &version_5),
            XDP_PASS,
        ),
        ("IPv4 in an 802.1Q VLAN", ethernet(0x8100, &vlan), XDP_PASS),
        (
            "IPv6 ethertype, IPv4 packet",
            ethernet(0x86dd, &ipv4(V4, 17, 0, &[], &udp(PORT, 60))),
            XDP_PASS,
        ),
        ("all zeros", vec![0; 64], XDP_PASS),
    ]
}

// ---------------------------------------------------------------------------------------------
// Verdicts (BPF_PROG_TEST_RUN)

#[test]
fn xdp_verdicts_follow_the_rules_frame_by_frame() {
    if !require_netns("xdp_verdicts_follow_the_rules_frame_by_frame") {
        return;
    }
    let (prog, _sock) = loaded();
    let mut wrong = Vec::new();
    for (what, frame, want) in table() {
        match prog.test_run(&frame, 0) {
            Ok(got) if got == want => {}
            other => wrong.push(format!("{what}: {other:?}, want {want}")),
        }
    }
    assert!(wrong.is_empty(), "wrong verdicts:\n{}", wrong.join("\n"));
}

#[test]
fn xdp_every_truncation_passes() {
    if !require_netns("xdp_every_truncation_passes") {
        return;
    }
    let (prog, _sock) = loaded();
    for (what, frame, _) in table() {
        for len in 0..frame.len() {
            let got = prog.test_run(&frame[..len], 0);
            if len < 14 {
                // The kernel refuses to test-run a frame shorter than an Ethernet header (the
                // program's own first check passes those on, but no frame reaches it here).
                let e = got.expect_err("a test run of less than 14 bytes");
                assert_eq!(e.raw_os_error(), None, "{e}"); // wrapped with context
                assert_eq!(
                    e.kind(),
                    io::ErrorKind::InvalidInput,
                    "{what}, {len} bytes: {e}"
                );
                continue;
            }
            let headers = if frame[12..14] == [0x86, 0xdd] {
                62
            } else {
                42
            };
            let want = if len >= headers && prog.test_run(&frame, 0).unwrap() == XDP_REDIRECT {
                XDP_REDIRECT // the headers are whole: the payload's length is not the program's
            } else {
                XDP_PASS
            };
            assert_eq!(
                prog.test_run(&frame[..len], 0)
                    .unwrap_or_else(|e| panic!("{what}, {len}: {e}")),
                want,
                "{what} cut to {len} bytes"
            );
        }
    }
}

#[test]
fn xdp_without_a_socket_for_the_queue_the_kernel_gets_it() {
    if !require_netns("xdp_without_a_socket_for_the_queue_the_kernel_gets_it") {
        return;
    }
    let prog = XdpProgram::load(PORT, 2).expect("load");
    prog.set_addresses(&[V4.into()]).unwrap();
    assert_eq!(prog.test_run(&v4_udp(V4, PORT), 0).unwrap(), XDP_PASS);
    let sock = xsk();
    prog.register_socket(0, sock.as_fd()).unwrap();
    assert_eq!(prog.test_run(&v4_udp(V4, PORT), 0).unwrap(), XDP_REDIRECT);
    prog.unregister_socket(0).unwrap();
    prog.unregister_socket(0).unwrap(); // an empty slot: no error
    assert_eq!(prog.test_run(&v4_udp(V4, PORT), 0).unwrap(), XDP_PASS);
    // Past the XSKMAP's size: refused.
    assert!(prog.register_socket(2, sock.as_fd()).is_err());
}

#[test]
fn xdp_set_addresses_replaces_the_set() {
    if !require_netns("xdp_set_addresses_replaces_the_set") {
        return;
    }
    let (prog, _sock) = loaded();
    let a: IpAddr = Ipv4Addr::new(10, 0, 0, 1).into();
    let b: IpAddr = Ipv6Addr::new(0xfd00, 0, 0, 0, 0, 0, 0, 1).into();
    let c: IpAddr = Ipv4Addr::new(10, 0, 0, 3).into();
    let verdict = |addr: IpAddr| {
        let frame = match addr {
            IpAddr::V4(v4) => v4_udp(v4, PORT),
            IpAddr::V6(v6) => v6_udp(v6, PORT),
        };
        prog.test_run(&frame, 0).unwrap()
    };
    prog.set_addresses(&[a, b, a]).unwrap();
    assert_eq!(prog.addresses().unwrap(), vec![a, b]);
    assert_eq!(
        (verdict(a), verdict(b), verdict(c)),
        (XDP_REDIRECT, XDP_REDIRECT, XDP_PASS)
    );
    assert_eq!(verdict(V4.into()), XDP_PASS, "the first set is gone");
    prog.set_addresses(&[b, c]).unwrap();
    assert_eq!(prog.addresses().unwrap(), vec![c, b]);
    assert_eq!(
        (verdict(a), verdict(b), verdict(c)),
        (XDP_PASS, XDP_REDIRECT, XDP_REDIRECT)
    );
    prog.set_addresses(&[]).unwrap();
    assert!(prog.addresses().unwrap().is_empty());
    assert_eq!(
        (verdict(a), verdict(b), verdict(c)),
        (XDP_PASS, XDP_PASS, XDP_PASS)
    );
    // At most 64, counted after removing duplicates.
    let many: Vec<IpAddr> = (0..65u8)
        .map(|i| Ipv4Addr::new(10, 1, 0, i).into())
        .collect();
    let e = prog.set_addresses(&many).unwrap_err();
    assert!(e.to_string().contains("at most 64"), "{e}");
    prog.set_addresses(&many[..64]).unwrap();
    assert_eq!(prog.addresses().unwrap().len(), 64);
    assert_eq!(verdict(many[63]), XDP_REDIRECT);
}

#[test]
fn xdp_a_refused_program_brings_the_verifier_log() {
    if !require_netns("xdp_a_refused_program_brings_the_verifier_log") {
        return;
    }
    // r2 = ctx->data; r0 = *(u8 *)(r2 + 0): a packet read without a bounds check.
    let insns = [
        bpf::load(bpf::Size::W, bpf::R2, bpf::R1, 0),
        bpf::load(bpf::Size::B, bpf::R0, bpf::R2, 0),
        bpf::exit(),
    ];
    let e = bpf::prog_load(bpf::PROG_TYPE_XDP, &insns, c"GPL", "unchecked").unwrap_err();
    let text = e.to_string();
    assert!(text.contains("verifier log"), "{text}");
    assert!(text.contains("invalid access to packet"), "{text}");
}

// ---------------------------------------------------------------------------------------------
// Attaching (a veth in a namespace of its own)

/// A namespace holding a veth pair (up) with `queues` receive queues; runs `f` in it with the
/// first end's index.
fn with_veth<T: Send + 'static>(queues: u32, f: impl FnOnce(u32) -> T + Send + 'static) -> T {
    let ns = NetNs::new();
    let (a, b) = (unique_name("xa"), unique_name("xb"));
    let q = queues.to_string();
    ns.run(&[
        "ip",
        "link",
        "add",
        &a,
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        &b,
        "numrxqueues",
        &q,
        "numtxqueues",
        &q,
    ]);
    ns.run(&["ip", "link", "set", &a, "up"]);
    ns.run(&["ip", "link", "set", &b, "up"]);
    ns.in_ns(move || {
        let name = std::ffi::CString::new(a).unwrap();
        // SAFETY: a valid NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert_ne!(ifindex, 0, "if_nametoindex: {}", io::Error::last_os_error());
        f(ifindex)
    })
}

/// The program attached to `ifindex` once the link's last descriptor is closed: at once,
/// unless another test of this process was starting a child just then (a forked child holds
/// copies of every descriptor until it execs, close-on-exec ones too), so it is asked again
/// for up to two seconds.
fn attached_after_close(ifindex: u32) -> Option<tunneld_dataplane::xdp::program::AttachedProgram> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    loop {
        let attached = attached_program(ifindex).unwrap();
        if attached.is_none() || std::time::Instant::now() > deadline {
            return attached;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

#[test]
fn xdp_attaches_in_both_modes_and_leaves_nothing_behind() {
    if !require_netns("xdp_attaches_in_both_modes_and_leaves_nothing_behind") {
        return;
    }
    with_veth(1, |ifindex| {
        for mode in [AttachMode::Generic, AttachMode::Driver] {
            assert_eq!(attached_program(ifindex).unwrap(), None);
            let mut prog = XdpProgram::load(PORT, 1).unwrap();
            assert_eq!(prog.mode(), None);
            prog.attach(ifindex, mode)
                .unwrap_or_else(|e| panic!("{mode:?}: {e}"));
            assert_eq!(prog.mode(), Some(mode));
            let on = attached_program(ifindex)
                .unwrap()
                .expect("a program attached");
            assert_eq!((on.id, on.name.as_str()), (prog.id(), PROGRAM_NAME));
            assert_eq!(on.mode, AttachedMode::from(mode));

            // A second tunneld on the same interface: refused, nothing stacked.
            let mut second = XdpProgram::load(PORT, 1).unwrap();
            for m in [AttachMode::Generic, AttachMode::Driver] {
                let e = second.attach(ifindex, m).unwrap_err();
                assert_eq!(e.kind(), io::ErrorKind::ResourceBusy, "{e}");
                assert!(e.to_string().contains("another tunneld"), "{e}");
            }
            assert_eq!(second.mode(), None);
            assert_eq!(
                attached_program(ifindex).unwrap().map(|p| p.id),
                Some(prog.id())
            );
            // Attached once is enough.
            assert!(prog.attach(ifindex, mode).is_err());

            drop(second);
            drop(prog);
            assert_eq!(attached_after_close(ifindex), None, "{mode:?}: left behind");
        }
        // Detach without dropping, then attach again.
        let mut prog = XdpProgram::load(PORT, 1).unwrap();
        prog.attach(ifindex, AttachMode::Generic).unwrap();
        prog.detach();
        assert_eq!(attached_program(ifindex).unwrap(), None);
        prog.attach(ifindex, AttachMode::Driver).unwrap();
        assert_eq!(
            attached_program(ifindex).unwrap().map(|p| p.mode),
            Some(AttachedMode::Driver)
        );
    });
}

#[test]
fn xdp_a_program_left_behind_is_replaced_not_stacked() {
    if !require_netns("xdp_a_program_left_behind_is_replaced_not_stacked") {
        return;
    }
    with_veth(1, |ifindex| {
        for (left_in, attach_in) in [
            (AttachMode::Generic, AttachMode::Generic),
            (AttachMode::Driver, AttachMode::Driver),
            (AttachMode::Generic, AttachMode::Driver),
            (AttachMode::Driver, AttachMode::Generic),
        ] {
            // A killed tunneld of old, which attached over netlink: its program stays after
            // its descriptors close.
            let old = XdpProgram::load(PORT, 1).unwrap();
            let old_id = old.id();
            attach_legacy(ifindex, old.fd(), left_in).unwrap();
            drop(old);
            let left = attached_program(ifindex).unwrap().expect("left behind");
            assert_eq!(left.id, old_id);

            let mut prog = XdpProgram::load(PORT, 1).unwrap();
            prog.attach(ifindex, attach_in)
                .unwrap_or_else(|e| panic!("{left_in:?} then {attach_in:?}: {e}"));
            let on = attached_program(ifindex).unwrap().expect("attached");
            assert_eq!(on.id, prog.id(), "{left_in:?} then {attach_in:?}");
            assert_eq!(on.mode, AttachedMode::from(attach_in));
            drop(prog);
            assert_eq!(attached_after_close(ifindex), None);
        }
    });
}

#[test]
fn xdp_someone_elses_program_is_left_alone() {
    if !require_netns("xdp_someone_elses_program_is_left_alone") {
        return;
    }
    with_veth(1, |ifindex| {
        let theirs = bpf::prog_load(
            bpf::PROG_TYPE_XDP,
            &[bpf::mov_imm(bpf::R0, XDP_PASS as i32), bpf::exit()],
            c"GPL",
            "their_xdp",
        )
        .unwrap();
        attach_legacy(ifindex, theirs.as_fd(), AttachMode::Generic).unwrap();
        let theirs_id = bpf::prog_info(theirs.as_fd()).unwrap().id;
        for mode in [AttachMode::Generic, AttachMode::Driver] {
            let mut prog = XdpProgram::load(PORT, 1).unwrap();
            let e = prog.attach(ifindex, mode).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::ResourceBusy, "{e}");
            assert!(e.to_string().contains("not tunneld's"), "{e}");
            assert!(e.to_string().contains("their_xdp"), "{e}");
            let on = attached_program(ifindex).unwrap().expect("still theirs");
            assert_eq!((on.id, on.name.as_str()), (theirs_id, "their_xdp"));
        }
    });
}

#[test]
fn xdp_steers_by_the_receiving_queue() {
    if !require_netns("xdp_steers_by_the_receiving_queue") {
        return;
    }
    with_veth(4, |ifindex| {
        let prog = XdpProgram::load(PORT, 4).unwrap();
        prog.set_addresses(&[V4.into()]).unwrap();
        let sock = xsk();
        prog.register_socket(2, sock.as_fd()).unwrap();
        let frame = v4_udp(V4, PORT);
        for queue in 0..4 {
            let want = if queue == 2 { XDP_REDIRECT } else { XDP_PASS };
            assert_eq!(
                prog.test_run_on(&frame, ifindex, queue).unwrap(),
                want,
                "queue {queue}"
            );
        }
        // Loopback has one queue: queue 1 there is refused by the kernel, not guessed.
        assert!(prog.test_run(&frame, 1).is_err());
    });
}

/// The child of `xdp_kill_9_leaves_nothing_behind`, run in a process of its own (this test
/// binary again, that test alone, with TUNNELD_XDP_CHILD=<netns>:<ifname>): enters the
/// namespace, attaches, says so, and waits to be killed. Not a test of its own, so that it
/// is never counted as one that passed.
fn xdp_child_attaches_and_waits(spec: &str) {
    let (ns, ifname) = spec.split_once(':').unwrap();
    let file = std::fs::File::open(format!("/var/run/netns/{ns}")).unwrap();
    // SAFETY: setns on a valid namespace descriptor; it changes only this thread's namespace.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "setns: {}", io::Error::last_os_error());
    let name = std::ffi::CString::new(ifname).unwrap();
    // SAFETY: a valid NUL-terminated name.
    let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
    let mut prog = XdpProgram::load(PORT, 1).unwrap();
    prog.attach(ifindex, AttachMode::Driver).unwrap();
    println!("XDP_CHILD_ATTACHED {}", prog.id());
    std::thread::sleep(std::time::Duration::from_secs(60));
}

#[test]
fn xdp_kill_9_leaves_nothing_behind() {
    use std::io::BufRead;
    if let Ok(spec) = std::env::var("TUNNELD_XDP_CHILD") {
        return xdp_child_attaches_and_waits(&spec);
    }
    if !require_netns("xdp_kill_9_leaves_nothing_behind") {
        return;
    }
    let ns = NetNs::new();
    let (a, b) = (unique_name("xa"), unique_name("xb"));
    ns.run(&["ip", "link", "add", &a, "type", "veth", "peer", "name", &b]);
    ns.run(&["ip", "link", "set", &a, "up"]);
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "xdp_kill_9_leaves_nothing_behind", "--nocapture"])
        .env("TUNNELD_XDP_CHILD", format!("{}:{a}", ns.name()))
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Killed however the test ends.
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = child.stdout.take().unwrap();
    let mut child = Kill(child);
    let id: u32 = std::io::BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("XDP_CHILD_ATTACHED ")
                .map(|id| id.parse().unwrap())
        })
        .expect("the child attached");
    let ifname = a.clone();
    let ifindex = move || {
        let name = std::ffi::CString::new(ifname.clone()).unwrap();
        // SAFETY: a valid NUL-terminated name.
        unsafe { libc::if_nametoindex(name.as_ptr()) }
    };
    let before = {
        let ifindex = ifindex.clone();
        ns.in_ns(move || attached_program(ifindex()).unwrap())
    };
    assert_eq!(before.map(|p| p.id), Some(id));
    // SIGKILL, and reaped: the process's descriptors, its link with them, are gone.
    child.0.kill().unwrap();
    child.0.wait().unwrap();
    let after = ns.in_ns(move || {
        let ifindex = ifindex();
        let left = attached_program(ifindex).unwrap();
        // And the next start attaches as if nothing had happened.
        let mut prog = XdpProgram::load(PORT, 1).unwrap();
        prog.attach(ifindex, AttachMode::Driver).unwrap();
        left
    });
    assert_eq!(after, None, "a program left behind after kill -9");
}

/// Real traffic through the attached program, both modes: with no socket for the queue the
/// tunnel's datagrams still reach the kernel; with one registered (unbound, so what is
/// redirected to it is dropped) they no longer do, while other ports, other addresses and
/// pings still do, over IPv4 and IPv6.
#[test]
fn xdp_live_traffic_is_steered_only_when_it_matches() {
    use std::net::{SocketAddr, UdpSocket};
    use std::time::Duration;
    if !require_netns("xdp_live_traffic_is_steered_only_when_it_matches") {
        return;
    }
    let (a, b) = (NetNs::new(), NetNs::new());
    let (a_if, b_if) = tunneld_testnet::veth(&a, "10.77.0.1/24", &b, "10.77.0.2/24");
    a.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd77::1/64",
        "dev",
        &a_if,
        "nodad",
    ]);
    a.run(&["ip", "-4", "addr", "add", "10.77.0.3/24", "dev", &a_if]);
    b.run(&[
        "ip",
        "-6",
        "addr",
        "add",
        "fd77::2/64",
        "dev",
        &b_if,
        "nodad",
    ]);
    let ours: [IpAddr; 2] = [
        Ipv4Addr::new(10, 77, 0, 1).into(),
        "fd77::1".parse().unwrap(),
    ];
    let not_ours: IpAddr = Ipv4Addr::new(10, 77, 0, 3).into(); // also a's, not in the map

    // The kernel's sockets in a: the tunnel's port and another, dual-stack.
    let receivers: Vec<UdpSocket> = a.in_ns(|| {
        [PORT, PORT + 1]
            .iter()
            .map(|&port| {
                let s = UdpSocket::bind(SocketAddr::from((Ipv6Addr::UNSPECIFIED, port))).unwrap();
                s.set_read_timeout(Some(Duration::from_millis(200)))
                    .unwrap();
                s
            })
            .collect()
    });
    let sender: UdpSocket = b.in_ns(|| UdpSocket::bind("[::]:0").unwrap());
    // Neighbours resolved both ways first, so that a datagram that does not arrive was not
    // just waiting for ARP/NDP.
    b.run(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]);
    b.run(&["ping", "-c", "1", "-W", "2", "10.77.0.3"]);
    b.run(&["ping", "-c", "1", "-W", "2", "fd77::1"]);
    // Whether a datagram from b to `to:port` reaches a's kernel socket (three tries).
    let arrives = |to: IpAddr, port: u16| -> bool {
        let r = &receivers[usize::from(port - PORT)];
        let to = match to {
            IpAddr::V4(v4) => v4.to_ipv6_mapped(),
            IpAddr::V6(v6) => v6,
        };
        for _ in 0..3 {
            sender.send_to(b"hello", (to, port)).unwrap();
            let mut buf = [0u8; 16];
            if r.recv_from(&mut buf).is_ok() {
                while r.recv_from(&mut buf).is_ok() {} // the rest of the tries
                return true;
            }
        }
        false
    };

    for mode in [AttachMode::Generic, AttachMode::Driver] {
        let mut prog = XdpProgram::load(PORT, 1).unwrap();
        prog.set_addresses(&ours).unwrap();
        let ifname = a_if.clone();
        let prog = a.in_ns(move || {
            let name = std::ffi::CString::new(ifname).unwrap();
            // SAFETY: a valid NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
            prog.attach(ifindex, mode).unwrap();
            prog
        });
        for addr in ours {
            assert!(
                arrives(addr, PORT),
                "{mode:?}: no socket yet, {addr} reaches the kernel"
            );
        }
        let sock = xsk();
        prog.register_socket(0, sock.as_fd()).unwrap();
        for addr in ours {
            assert!(
                !arrives(addr, PORT),
                "{mode:?}: {addr}:{PORT} steered away from the kernel"
            );
            assert!(
                arrives(addr, PORT + 1),
                "{mode:?}: {addr}, another port, to the kernel"
            );
        }
        assert!(
            arrives(not_ours, PORT),
            "{mode:?}: an address not in the map, to the kernel"
        );
        b.run(&["ping", "-c", "1", "-W", "2", "10.77.0.1"]);
        b.run(&["ping", "-c", "1", "-W", "2", "fd77::1"]);
        drop(prog);
        for addr in ours {
            assert!(
                arrives(addr, PORT),
                "{mode:?}: detached, {addr} reaches the kernel again"
            );
        }
    }
}

/// The child of `xdp_without_a_capability_the_error_names_it`, run in a process of its own
/// (this test binary again, that test alone, with TUNNELD_XDP_CHILD_LOAD set and fewer
/// capabilities): loads the program and prints the outcome. Not a test of its own.
fn xdp_child_loads() {
    match XdpProgram::load(PORT, 1) {
        Ok(_) => println!("XDP_LOAD_RESULT ok"),
        Err(e) => println!("XDP_LOAD_RESULT {e}"),
    }
}

#[test]
fn xdp_without_a_capability_the_error_names_it() {
    if std::env::var_os("TUNNELD_XDP_CHILD_LOAD").is_some() {
        return xdp_child_loads();
    }
    if !require_netns("xdp_without_a_capability_the_error_names_it")
        || !tunneld_testnet::require_tool("xdp_without_a_capability_the_error_names_it", "setpriv")
    {
        return;
    }
    // CAP_SYS_ADMIN stands in for both in bpf(2), so it goes too.
    for (drop, lacks) in [
        ("-bpf,-sys_admin", "lacks CAP_BPF)"),
        ("-net_admin,-sys_admin", "lacks CAP_NET_ADMIN)"),
        (
            "-bpf,-net_admin,-sys_admin",
            "lacks CAP_BPF and CAP_NET_ADMIN)",
        ),
    ] {
        let out = std::process::Command::new("setpriv")
            .args(["--inh-caps", drop, "--bounding-set", drop])
            .arg(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "xdp_without_a_capability_the_error_names_it",
                "--nocapture",
            ])
            .env("TUNNELD_XDP_CHILD_LOAD", "1")
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let result = stdout
            .lines()
            .find_map(|l| l.strip_prefix("XDP_LOAD_RESULT "))
            .unwrap_or_else(|| panic!("no result from the child: {stdout}"));
        assert!(
            result.contains("Operation not permitted"),
            "{drop}: {result}"
        );
        assert!(result.contains(lacks), "{drop}: {result}");
    }
}

/// What the interface offers the AF_XDP path, asked of the real kernel about a veth: its
/// TX checksumming follows `ethtool -K tx`, its queues are what it was made with, and the
/// netdev family answers with no AF_XDP TX checksum (veth has no zero-copy driver).
#[test]
fn xdp_device_features_of_a_veth() {
    if !require_netns("xdp_device_features_of_a_veth") {
        return;
    }
    let (a, b) = (NetNs::new(), NetNs::new());
    let (va, _) = tunneld_testnet::veth(&a, "192.0.2.1/24", &b, "192.0.2.2/24");
    let answers = a.in_ns(move || {
        let name = std::ffi::CString::new(va.clone()).unwrap();
        // SAFETY: a NUL-terminated name.
        let ifindex = unsafe { libc::if_nametoindex(name.as_ptr()) };
        let on = device::tx_checksumming(ifindex).map_err(|e| e.to_string());
        tunneld_testnet::link::set_tx_checksumming(&va, false).unwrap();
        let off = device::tx_checksumming(ifindex).map_err(|e| e.to_string());
        let features = device::xsk_features(ifindex).map_err(|e| e.to_string());
        let missing = device::tx_checksumming(999_999).is_err();
        (
            on,
            off,
            features,
            device::interface_queues(ifindex),
            missing,
        )
    });
    assert_eq!(answers, (Ok(true), Ok(false), Ok(0), 1, true));
}
