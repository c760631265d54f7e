//! The reuseport steering program against the real kernel, over loopback: which datagram
//! reaches which socket of a group, not just that datagrams arrive.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};
use tunneld_dataplane::steering::owner_of;
use tunneld_dataplane::udp::UdpSocket;
use tunneld_dataplane::{Batch, DatagramIo};

/// Everything each socket of `group` receives within `wait`, by socket.
fn drain(group: &mut [UdpSocket], expected: usize, wait: Duration) -> Vec<Vec<Vec<u8>>> {
    let mut got = vec![Vec::new(); group.len()];
    let until = Instant::now() + wait;
    let mut batch = Batch::new();
    while got.iter().map(Vec::len).sum::<usize>() < expected && Instant::now() < until {
        for (i, s) in group.iter_mut().enumerate() {
            batch.clear();
            s.recv_batch(&mut batch).expect("recv_batch");
            for f in 0..batch.len() {
                got[i].push(batch.payload(f).to_vec());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    got
}

fn message(kind: u8, len: usize, index_at: usize, slot: u32, counter: u8) -> Vec<u8> {
    let mut d = vec![0u8; len];
    d[0] = kind;
    let s = slot.to_le_bytes();
    d[index_at..index_at + 4].copy_from_slice(&[counter, s[0], s[1], s[2]]);
    d
}

#[test]
fn each_session_datagram_reaches_its_owners_socket() {
    for workers in [2usize, 3, 4] {
        let mut group = UdpSocket::bind_group((Ipv4Addr::LOCALHOST, 0).into(), workers)
            .expect("bind a reuseport group");
        let to: SocketAddr = (Ipv4Addr::LOCALHOST, group[0].local_addr().port()).into();
        assert!(group.iter().all(|s| s.local_addr().port() == to.port()));
        let senders: Vec<std::net::UdpSocket> = (0..8)
            .map(|_| std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
            .collect();
        let mut sent = Vec::new();
        for slot in 0..40u32 {
            // Data, cookie reply and handshake response for this slot, from varied sources
            // (the source must not matter for these).
            for (kind, len, at) in [(4u8, 32usize, 4usize), (3, 64, 4), (2, 92, 8)] {
                let d = message(kind, len, at, slot * 7919, slot as u8);
                senders[slot as usize % senders.len()]
                    .send_to(&d, to)
                    .unwrap();
                sent.push(d);
            }
        }
        let got = drain(&mut group, sent.len(), Duration::from_secs(5));
        let total: usize = got.iter().map(Vec::len).sum();
        assert_eq!(total, sent.len(), "{workers} workers: all arrive");
        for (socket, datagrams) in got.iter().enumerate() {
            for d in datagrams {
                assert_eq!(
                    owner_of(d, workers as u32),
                    Some(socket as u32),
                    "{workers} workers: a datagram for worker {:?} reached socket {socket}",
                    owner_of(d, workers as u32)
                );
            }
        }
        assert!(
            got.iter().all(|g| !g.is_empty()),
            "every worker got its share"
        );
    }
}

#[test]
fn initiations_and_garbage_go_by_source_hash() {
    let workers = 4;
    let mut group = UdpSocket::bind_group((Ipv4Addr::LOCALHOST, 0).into(), workers).unwrap();
    let to: SocketAddr = (Ipv4Addr::LOCALHOST, group[0].local_addr().port()).into();
    let senders: Vec<std::net::UdpSocket> = (0..16)
        .map(|_| std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0)).unwrap())
        .collect();
    // From each source: an initiation, an empty datagram, a short one, a data message too
    // short to hold its index. They name no session: the kernel's hash of the source picks
    // the socket, so they arrive, spread over the group.
    let shapes: [&[u8]; 4] = [&[1; 148], &[], &[4, 0], &[4, 0, 0, 0, 9, 9]];
    for (i, s) in senders.iter().enumerate() {
        for shape in shapes {
            let mut d = shape.to_vec();
            if let Some(last) = d.last_mut().filter(|_| shape.len() > 1) {
                *last = i as u8;
            }
            s.send_to(&d, to).unwrap();
        }
    }
    let expected = senders.len() * shapes.len();
    let got = drain(&mut group, expected, Duration::from_secs(5));
    assert_eq!(got.iter().map(Vec::len).sum::<usize>(), expected);
    // The initiations spread over more than one socket (16 sources, 4 sockets).
    let with_initiations = got
        .iter()
        .filter(|g| g.iter().any(|d| d.len() == 148))
        .count();
    assert!(
        with_initiations > 1,
        "all initiations on one socket: no hash fallback?"
    );
}
