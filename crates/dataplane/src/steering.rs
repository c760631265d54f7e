//! Steering datagrams to the worker that owns their session, in the kernel.
//!
//! Each worker has its own UDP socket; all of them are bound to the same port in one
//! `SO_REUSEPORT` group, in worker order, and a classic-BPF program attached to the group
//! picks the socket for every datagram. A WireGuard message that names one of our sessions
//! carries its receiver index (a data message and a cookie reply at bytes 4..8, a handshake
//! response at 8..12, little-endian), and the index's high 24 bits are the peer slot
//! (`Device` hands them out), so the owner is `slot % workers`: the program reads those
//! three bytes and returns that. Everything else (handshake initiations, which name no
//! session of ours, and datagrams too short to name one) gets the kernel's usual hash of the
//! source address: it lands on some worker, which hands initiations to the owner.
//!
//! [`owner_of`] is the same rule in Rust, for tests. The layout (types, where the index
//! sits) and the slot rule are `tunneld-wireguard`'s (`wire`, [`worker_of_index`]): the
//! program reads only the type byte and the index, so it sends well-formed messages where
//! `Device` expects them and anything else to some worker, which drops it.

use std::io;
use std::os::fd::{AsFd, AsRawFd};
use tunneld_wireguard::wire::{self, MSG_COOKIE_REPLY, MSG_DATA, MSG_RESPONSE};
use tunneld_wireguard::worker_of_index;

// The program sends data messages and cookie replies through one block.
const _: () = assert!(wire::data::RECEIVER == wire::cookie_reply::RECEIVER);
/// Where the index sits in a data message or cookie reply, and in a response.
const DATA_INDEX_AT: u32 = wire::data::RECEIVER as u32;
const RESPONSE_INDEX_AT: u32 = wire::response::RECEIVER as u32;

/// The worker owning the session `datagram` names, as the program computes it: from the
/// type byte and the receiver index alone (the rest is the worker's to check). `None` when
/// it names none (an initiation, another type, too short). `workers` must be at least 1.
pub fn owner_of(datagram: &[u8], workers: u32) -> Option<u32> {
    let at = wire::receiver_offset(*datagram.first()?)?;
    let index = u32::from_le_bytes(*datagram.get(at..)?.first_chunk::<4>()?);
    u32::try_from(worker_of_index(index, workers as usize)).ok()
}

// Classic BPF opcodes (linux/filter.h), as the kernel defines them.
const LD_B_ABS: u16 = 0x30; // BPF_LD | BPF_B | BPF_ABS
const LD_W_LEN: u16 = 0x80; // BPF_LD | BPF_W | BPF_LEN
const JEQ_K: u16 = 0x15; // BPF_JMP | BPF_JEQ | BPF_K
const JGE_K: u16 = 0x35; // BPF_JMP | BPF_JGE | BPF_K
const LSH_K: u16 = 0x64; // BPF_ALU | BPF_LSH | BPF_K
const OR_X: u16 = 0x4c; // BPF_ALU | BPF_OR | BPF_X
const MOD_K: u16 = 0x94; // BPF_ALU | BPF_MOD | BPF_K
const TAX: u16 = 0x07; // BPF_MISC | BPF_TAX
const RET_A: u16 = 0x16; // BPF_RET | BPF_A
const RET_K: u16 = 0x06; // BPF_RET | BPF_K

fn op(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

/// `slot % workers` from the three index bytes after `at` (the index's first byte is the
/// session counter), once the datagram is long enough to hold them; else the hash fallback.
/// Ends in a return, so the block is self-contained; `hash` is the number of instructions
/// from the one after this block's length check to the fallback return.
fn owner_block(at: u32, workers: u32, to_hash: u8) -> [libc::sock_filter; 13] {
    [
        op(LD_W_LEN, 0, 0, 0),
        op(JGE_K, 0, to_hash, at + 4),
        op(LD_B_ABS, 0, 0, at + 3),
        op(LSH_K, 0, 0, 8),
        op(TAX, 0, 0, 0),
        op(LD_B_ABS, 0, 0, at + 2),
        op(OR_X, 0, 0, 0),
        op(LSH_K, 0, 0, 8),
        op(TAX, 0, 0, 0),
        op(LD_B_ABS, 0, 0, at + 1),
        op(OR_X, 0, 0, 0),
        op(MOD_K, 0, 0, workers),
        op(RET_A, 0, 0, 0),
    ]
}

/// The program for a group of `workers` sockets (the reuseport filter sees the UDP payload
/// from offset 0). Returning an index past the group makes the kernel use its hash.
pub fn program(workers: u32) -> Vec<libc::sock_filter> {
    let workers = workers.max(1);
    let mut p = vec![
        // An empty datagram has no type byte to read (reading it would end the program
        // with 0, worker 0): the hash instead.
        op(LD_W_LEN, 0, 0, 0),
        op(JGE_K, 0, 30, 1),
        op(LD_B_ABS, 0, 0, 0),
        // Data and cookie replies: the block at 4; responses: the block after it.
        op(JEQ_K, 2, 0, u32::from(MSG_DATA)),
        op(JEQ_K, 1, 0, u32::from(MSG_COOKIE_REPLY)),
        op(JEQ_K, 13, 26, u32::from(MSG_RESPONSE)),
    ];
    // From each block's length check (its second instruction) to the final return: the
    // first block's 11 remaining instructions and the second's 13, then the return itself.
    p.extend(owner_block(DATA_INDEX_AT, workers, 11 + 13));
    p.extend(owner_block(RESPONSE_INDEX_AT, workers, 11));
    p.push(op(RET_K, 0, 0, u32::MAX));
    p
}

/// Attaches the steering program for `workers` sockets to the reuseport group of `socket`
/// (any member; it applies to the whole group).
pub fn attach(socket: &impl AsFd, workers: u32) -> io::Result<()> {
    let mut filter = program(workers);
    let prog = libc::sock_fprog {
        len: u16::try_from(filter.len()).map_err(|_| io::Error::other("program too long"))?,
        filter: filter.as_mut_ptr(),
    };
    // SAFETY: `prog` points at `filter`, alive for the call; the kernel copies the program.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_fd().as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_ATTACH_REUSEPORT_CBPF,
            std::ptr::addr_of!(prog).cast(),
            std::mem::size_of::<libc::sock_fprog>() as libc::socklen_t,
        )
    };
    if rc < 0 {
        return Err(io::Error::new(
            io::Error::last_os_error().kind(),
            format!(
                "cannot attach the reuseport steering program: {}",
                io::Error::last_os_error()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs a classic-BPF program the way the kernel does for these opcodes: a reference
    /// interpreter, so the program is checked against `owner_of` on every input shape.
    fn run(p: &[libc::sock_filter], packet: &[u8]) -> u32 {
        let (mut a, mut x, mut pc) = (0u32, 0u32, 0usize);
        loop {
            let i = p[pc];
            pc += 1;
            match i.code {
                LD_B_ABS => match packet.get(i.k as usize) {
                    Some(b) => a = u32::from(*b),
                    None => return 0, // the kernel aborts the program: 0
                },
                LD_W_LEN => a = packet.len() as u32,
                JEQ_K => pc += usize::from(if a == i.k { i.jt } else { i.jf }),
                JGE_K => pc += usize::from(if a >= i.k { i.jt } else { i.jf }),
                LSH_K => a <<= i.k,
                OR_X => a |= x,
                MOD_K => a %= i.k,
                TAX => x = a,
                RET_A => return a,
                RET_K => return i.k,
                other => panic!("opcode {other:#x} not modelled"),
            }
        }
    }

    #[test]
    fn the_program_computes_owner_of_for_every_shape() {
        let mut x = 0x2545_f491_4f6c_dd1du64;
        for workers in [1, 2, 3, 4, 7, 64] {
            let p = program(workers);
            for len in [0, 1, 3, 4, 5, 7, 8, 9, 11, 12, 13, 32, 92, 148] {
                for kind in 0..6u8 {
                    let mut d = vec![0u8; len];
                    for b in d.iter_mut() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *b = x as u8;
                    }
                    if let Some(first) = d.first_mut() {
                        *first = kind;
                    }
                    let got = run(&p, &d);
                    match owner_of(&d, workers) {
                        Some(owner) => assert_eq!(got, owner, "{workers} workers, {d:?}"),
                        None => assert!(got >= workers, "{workers} workers, {d:?}: {got}"),
                    }
                }
            }
        }
    }

    /// For every well-formed message that names a session, the program and `owner_of`
    /// pick the worker `Device` gave the index to (the parsed message's receiver).
    #[test]
    fn the_program_agrees_with_the_parsed_receiver() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for workers in [1, 2, 3, 4, 7, 64] {
            let p = program(workers);
            for (kind, len) in [
                (MSG_RESPONSE, wire::RESPONSE_LEN),
                (MSG_COOKIE_REPLY, wire::COOKIE_REPLY_LEN),
                (MSG_DATA, wire::DATA_MIN_LEN),
                (MSG_DATA, 1452),
            ] {
                for _ in 0..50 {
                    let mut d = vec![0u8; len];
                    for b in d.iter_mut() {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        *b = x as u8;
                    }
                    d[..4].copy_from_slice(&[kind, 0, 0, 0]);
                    let index = wire::parse(&d).unwrap().receiver().unwrap();
                    let owner = worker_of_index(index, workers as usize) as u32;
                    assert_eq!(owner_of(&d, workers), Some(owner));
                    assert_eq!(run(&p, &d), owner, "{workers} workers, {d:?}");
                }
            }
        }
    }

    #[test]
    fn owner_is_the_slot_modulo_the_workers() {
        // Slot 0x000105 (index bytes: counter 0x7f, then 05 01 00) on 4 workers: 261 % 4.
        let data = [4, 0, 0, 0, 0x7f, 0x05, 0x01, 0x00, 0, 0, 0, 0, 0, 0, 0, 0];
        assert_eq!(owner_of(&data, 4), Some(1));
        let mut response = [0u8; 92];
        response[0] = 2;
        response[8..12].copy_from_slice(&[0x01, 0x03, 0, 0]);
        assert_eq!(owner_of(&response, 2), Some(1));
        assert_eq!(owner_of(&[1; 148], 4), None);
        assert_eq!(owner_of(&[4, 0, 0], 4), None);
    }
}
