//! A fleet's LAN address as the kernel holds it, in a network namespace the test creates
//! (privileged; skipped without root unless TUNNELD_REQUIRE_ALL=1): held with a lifetime it
//! goes by itself when not renewed (what fences a gateway that was killed), and announced
//! with frames another interface on the link receives as sent.

use std::net::IpAddr;
use std::time::{Duration, Instant};
use tunneld_dataplane::announce::Announcer;
use tunneld_dataplane::netlink::{Link, Netlink};
use tunneld_testnet::link::capture_received;
use tunneld_testnet::{require_netns, NetNs};

#[test]
fn a_held_address_goes_unless_renewed_and_its_announcements_arrive() {
    if !require_netns("a_held_address_goes_unless_renewed_and_its_announcements_arrive") {
        return;
    }
    let ns = NetNs::new();
    ns.run(&[
        "ip", "link", "add", "gw", "type", "veth", "peer", "name", "host",
    ]);
    ns.run(&["ip", "link", "set", "gw", "up"]);
    ns.run(&["ip", "link", "set", "host", "up"]);
    ns.in_ns(|| {
        let v4: ipnet::IpNet = "10.9.0.1/24".parse().unwrap();
        let v6: ipnet::IpNet = "fd09::1/64".parse().unwrap();
        let mut netlink = Netlink::open().unwrap();
        let index = netlink.link_index("gw").unwrap();
        let Link::Ethernet(mac) = netlink.link(index).unwrap() else {
            panic!("a veth has a MAC");
        };
        let held = Instant::now();
        netlink.hold_address(index, v4, 1).unwrap();
        netlink.hold_address(index, v6, 1).unwrap();
        // Not tentative (no DAD): usable at once.
        let have = netlink.addresses(index).unwrap();
        assert!(
            have.contains(&v4.addr()) && have.contains(&v6.addr()),
            "{have:?}"
        );

        let capture = std::thread::spawn(|| capture_received("host", Duration::from_secs(1), 64));
        std::thread::sleep(Duration::from_millis(200));
        let announcer = Announcer::open().unwrap();
        announcer
            .announce(index, mac, &[v4.addr(), v6.addr()])
            .unwrap();
        let frames = capture.join().unwrap().unwrap();
        let from_gw: Vec<&Vec<u8>> = frames.iter().filter(|f| f[6..12] == mac).collect();
        let arp: Vec<u8> = from_gw
            .iter()
            .filter(|f| f[12..14] == [0x08, 0x06] && f[28..32] == [10, 9, 0, 1])
            .map(|f| f[21])
            .collect();
        assert_eq!(arp, [1, 2], "a gratuitous request and reply: {from_gw:?}");
        assert!(
            from_gw.iter().any(|f| f[12..14] == [0x86, 0xdd]
                && f[54] == 136
                && f[62..78]
                    == v6
                        .addr()
                        .to_string()
                        .parse::<std::net::Ipv6Addr>()
                        .unwrap()
                        .octets()),
            "an unsolicited neighbour advertisement: {from_gw:?}"
        );

        // Renewed for 2 s at 0.5 s: still there at 1.5 s, gone by itself by 3.3 s.
        std::thread::sleep(Duration::from_millis(500).saturating_sub(held.elapsed()));
        netlink.hold_address(index, v4, 2).unwrap();
        netlink.hold_address(index, v6, 2).unwrap();
        let renewed = Instant::now();
        std::thread::sleep(Duration::from_millis(1000));
        let have = netlink.addresses(index).unwrap();
        assert!(
            have.contains(&v4.addr()) && have.contains(&v6.addr()),
            "{have:?}"
        );
        let gone = |have: &[IpAddr]| !have.contains(&v4.addr()) && !have.contains(&v6.addr());
        while !gone(&netlink.addresses(index).unwrap()) {
            assert!(
                renewed.elapsed() < Duration::from_millis(2800),
                "the kernel keeps an address past its lifetime"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            renewed.elapsed() >= Duration::from_millis(1900),
            "gone {:?} after a renewal for 2 s",
            renewed.elapsed()
        );
        // A lifetime of 0 is refused in words, not sent.
        let e = netlink.hold_address(index, v4, 0).unwrap_err();
        assert!(e.to_string().contains("a lifetime of 0 is none"), "{e}");
    });
}
