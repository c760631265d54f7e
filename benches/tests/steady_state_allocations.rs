//! No allocation on the data path after start-up: two workers joined by the in-memory
//! backends carry traffic both ways (plain packets, and TCP super-packets as a TUN with
//! offloads hands them over, which the worker segments), and a counting global allocator must
//! see no allocation on this thread while the workers turn (the sim's own queues recycle their
//! buffers).

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::time::Instant;
use tunneld_benches::{ipv4_packet, tcp_super_packet, SimPair, A_IP, B_IP};
use tunneld_dataplane::offload::VnetHdr;

/// Segment size of the super-packets: a 1420-byte IPv4/TCP packet per segment.
const MSS: usize = 1380;
const SEGMENTS: usize = 20;

/// Counts allocations made by a thread while its `COUNTING` flag is set.
struct Counting;

thread_local! {
    static COUNTING: Cell<bool> = const { Cell::new(false) };
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: defers every call to the system allocator; the bookkeeping touches only
// const-initialised thread locals, which never allocate.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: the caller's contract for `alloc` is passed on unchanged.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if COUNTING.with(Cell::get) {
            ALLOCATIONS.with(|n| n.set(n.get() + 1));
        }
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns how many allocations it made on this thread.
fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    COUNTING.with(|c| c.set(true));
    f();
    COUNTING.with(|c| c.set(false));
    ALLOCATIONS.with(Cell::get) - before
}

/// A packet from B to A: the test packet with its addresses swapped.
fn reply_packet(len: usize) -> Vec<u8> {
    let mut p = ipv4_packet(len);
    p[12..16].copy_from_slice(&B_IP.octets());
    p[16..20].copy_from_slice(&A_IP.octets());
    p
}

#[test]
fn workers_carry_traffic_without_allocating() {
    // The counter must see allocations, or a zero below would prove nothing.
    assert!(allocations_in(|| drop(std::hint::black_box(vec![1u8; 64]))) >= 1);

    let mut pair = SimPair::handshaken();
    let mut traffic = Traffic {
        super_to_b: tcp_super_packet(SEGMENTS, MSS),
        segments: 0,
        to_b: ipv4_packet(1400),
        to_a: reply_packet(600),
        got: Vec::with_capacity(2048),
        delivered: [0; 2],
    };
    // Warm-up: the sim queues grow their buffer pools to the traffic's size.
    for _ in 0..20 {
        traffic.round(&mut pair, false);
    }
    let before = traffic.delivered;
    let mut allocations = 0;
    for _ in 0..200 {
        allocations += traffic.round(&mut pair, true);
    }
    let carried = [
        traffic.delivered[0] - before[0],
        traffic.delivered[1] - before[1],
    ];
    assert_eq!(carried, [20_000, 20_000], "every packet crossed both ways");
    assert_eq!(
        traffic.segments,
        220 * 2 * SEGMENTS as u64,
        "every segment crossed"
    );
    assert_eq!(
        allocations, 0,
        "allocations on the data path in steady state"
    );
}

struct Traffic {
    super_to_b: (VnetHdr, Vec<u8>),
    /// Segments of super-packets delivered to B.
    segments: u64,
    to_b: Vec<u8>,
    to_a: Vec<u8>,
    got: Vec<u8>,
    /// Packets delivered to B, and to A.
    delivered: [u64; 2],
}

impl Traffic {
    /// 100 packets each way and two super-packets from A through both workers; returns the
    /// allocations the workers made (counted only if `count`).
    fn round(&mut self, pair: &mut SimPair, count: bool) -> u64 {
        for _ in 0..100 {
            assert!(pair.a.tun.inject(&self.to_b));
            assert!(pair.b.tun.inject(&self.to_a));
        }
        for _ in 0..2 {
            let (hdr, packet) = &self.super_to_b;
            assert!(pair.a.tun.inject_offload(*hdr, packet));
        }
        let run = |pair: &mut SimPair| {
            let now = Instant::now();
            for _ in 0..3 {
                pair.a.worker.turn(now);
                pair.b.worker.turn(now);
            }
        };
        let allocations = if count {
            allocations_in(|| run(pair))
        } else {
            run(pair);
            0
        };
        while pair.b.tun.take_into(&mut self.got) {
            if self.got.len() == 40 + MSS {
                assert_eq!(self.got[9], 6, "a TCP segment");
                self.segments += 1;
            } else {
                assert_eq!(self.got, self.to_b);
                self.delivered[0] += 1;
            }
        }
        while pair.a.tun.take_into(&mut self.got) {
            assert_eq!(self.got, self.to_a);
            self.delivered[1] += 1;
        }
        allocations
    }
}

#[test]
fn hand_offs_between_workers_do_not_allocate() {
    let mut lanes = tunneld_benches::SimLanes::handshaken(2);
    let handed = |lanes: &tunneld_benches::SimLanes| -> u64 {
        lanes
            .lanes
            .iter()
            .map(|(a, _)| a.worker.device().stats().handoffs_out)
            .sum()
    };
    let handed_in_set_up = handed(&lanes);
    // Each worker reads packets of both sub-tunnels: half of them cross to the other worker.
    let packets: Vec<Vec<u8>> = (0..2)
        .map(|sub| tunneld_benches::flow_packet(1000, sub, 2))
        .collect();
    let mut got = Vec::with_capacity(2048);
    let mut round = |lanes: &mut tunneld_benches::SimLanes, count: bool| {
        for (a, _) in &lanes.lanes {
            for _ in 0..50 {
                for p in &packets {
                    assert!(a.tun.inject(p));
                }
            }
        }
        let mut allocations = 0;
        for _ in 0..3 {
            if count {
                allocations += allocations_in(|| lanes.turn_all());
            } else {
                lanes.turn_all();
            }
        }
        let mut delivered = 0;
        for (_, b) in &lanes.lanes {
            while b.tun.take_into(&mut got) {
                delivered += 1;
            }
        }
        assert_eq!(delivered, 200, "every packet crossed");
        allocations
    };
    for _ in 0..20 {
        round(&mut lanes, false);
    }
    let allocations: u64 = (0..100).map(|_| round(&mut lanes, true)).sum();
    assert_eq!(
        handed(&lanes) - handed_in_set_up,
        120 * 100,
        "half the packets were handed over"
    );
    assert_eq!(allocations, 0, "allocations while handing off");
}
