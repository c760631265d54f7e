//! Two workers per site over the in-memory backends: packets read on the worker that does
//! not carry their flow's sub-tunnel cross the hand-off ring and arrive, in order per flow.

use tunneld_benches::{flow_packet, SimLanes};

#[test]
fn packets_read_on_the_wrong_worker_are_handed_over_and_arrive_in_order() {
    let mut lanes = SimLanes::handshaken(2);
    // The set-up hands its first packet of sub-tunnel 1 to sub-tunnel 0 (no session yet).
    let before: Vec<(u64, u64)> = lanes
        .lanes
        .iter()
        .map(|(a, _)| {
            let stats = a.worker.device().stats();
            (stats.handoffs_out, stats.handoffs_in)
        })
        .collect();
    // Flow f belongs to sub-tunnel f % 2; every packet of it is read on the other worker.
    let flows: Vec<Vec<u8>> = (0..2).map(|sub| flow_packet(200, sub, 2)).collect();
    for seq in 0u32..40 {
        for (sub, packet) in flows.iter().enumerate() {
            let mut p = packet.clone();
            p[28..32].copy_from_slice(&seq.to_be_bytes());
            assert!(lanes.lanes[1 - sub].0.tun.inject(&p));
        }
    }
    let mut arrived: Vec<Vec<u32>> = vec![Vec::new(); 2];
    for _ in 0..20 {
        lanes.turn_all();
        for (sub, (_, b)) in lanes.lanes.iter().enumerate() {
            while let Some(p) = b.tun.take() {
                assert_eq!(
                    &p[20..22],
                    &flows[sub][20..22],
                    "flow on its own sub-tunnel"
                );
                arrived[sub].push(u32::from_be_bytes(p[28..32].try_into().unwrap()));
            }
        }
    }
    for seqs in &arrived {
        assert_eq!(
            seqs,
            &(0..40).collect::<Vec<u32>>(),
            "every packet, in order"
        );
    }
    for ((a, _), (out, into)) in lanes.lanes.iter().zip(before) {
        let stats = a.worker.device().stats();
        let handed = (stats.handoffs_out - out, stats.handoffs_in - into);
        assert_eq!(handed, (40, 40), "{stats:?}");
        assert_eq!(stats.total_drops(), 0, "{stats:?}");
    }
}
