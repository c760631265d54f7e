//! The XDP program that steers the tunnel's datagrams to the AF_XDP sockets, and its loader.
//!
//! The program is assembled here, in Rust ([`assemble`]), and loaded with bpf(2): building
//! or running tunneld needs no C compiler, clang, libbpf or nightly Rust. In C it would read:
//!
//! ```c
//! struct { __uint(type, BPF_MAP_TYPE_XSKMAP); __u32 key, value; } xsks SEC(".maps");
//! struct { __uint(type, BPF_MAP_TYPE_HASH); __u8 key[16]; __u8 value; } addrs SEC(".maps");
//!
//! SEC("xdp") int tunneld_xdp(struct xdp_md *ctx)
//! {
//!     void *data = (void *)(long)ctx->data, *end = (void *)(long)ctx->data_end;
//!     __u8 key[16];                                     // the destination, as IPv6
//!     if (data + 14 > end) return XDP_PASS;             // no Ethernet header
//!     __u16 proto = *(__u16 *)(data + 12);              // ethertype; VLAN tags: pass
//!     if (proto == htons(0x0800)) {                     // IPv4
//!         if (data + 14 + 20 + 8 > end) return XDP_PASS;
//!         if (*(__u8 *)(data + 14) != 0x45) return XDP_PASS;         // version 4, IHL 5
//!         if (*(__u16 *)(data + 20) & htons(0x3fff)) return XDP_PASS; // MF or an offset
//!         if (*(__u8 *)(data + 23) != IPPROTO_UDP) return XDP_PASS;
//!         if (*(__u16 *)(data + 36) != htons(PORT)) return XDP_PASS;
//!         *(__u64 *)key = 0;                                          // ::ffff:a.b.c.d
//!         *(__u32 *)(key + 8) = htonl(0xffff);
//!         *(__u32 *)(key + 12) = *(__u32 *)(data + 30);
//!     } else if (proto == htons(0x86dd)) {              // IPv6
//!         if (data + 14 + 40 + 8 > end) return XDP_PASS;
//!         if ((*(__u8 *)(data + 14) & 0xf0) != 0x60) return XDP_PASS; // version 6
//!         if (*(__u8 *)(data + 20) != IPPROTO_UDP) return XDP_PASS;   // no extension headers
//!         if (*(__u16 *)(data + 56) != htons(PORT)) return XDP_PASS;
//!         *(__u64 *)key = *(__u64 *)(data + 38);
//!         *(__u64 *)(key + 8) = *(__u64 *)(data + 46);
//!     } else {
//!         return XDP_PASS;                              // ARP, VLAN, everything else
//!     }
//!     if (!bpf_map_lookup_elem(&addrs, key)) return XDP_PASS;         // not our address
//!     // The socket of the receiving queue; with none there, XDP_PASS (the flags argument).
//!     return bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS);
//! }
//! ```
//!
//! [`assemble`] emits exactly that, instruction by instruction, with the assembly beside it.
//! Every packet read is below a `data + N > data_end` check the verifier tracks, and every
//! access is naturally aligned (given the kernel's 2-byte `NET_IP_ALIGN` for the IP header).
//!
//! [`XdpProgram::attach`] uses a bpf_link (BPF_LINK_CREATE), so the program goes away with the
//! link's file descriptor, also when the process is killed. A program an older tunneld left
//! attached the netlink way is replaced; anyone else's is not touched.

use super::bpf::{self, Asm, Cond, Map, Size, R0, R1, R10, R2, R3, R4, R5, R6, R7, R8};
use crate::netlink::{Failure, Netlink};
use std::io;
use std::net::IpAddr;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

/// The program's name, as the kernel shows it (`bpftool prog`, `ip link`). A program of this
/// name attached to an interface is taken to be tunneld's and is replaced by [`XdpProgram::attach`].
pub const PROGRAM_NAME: &str = "tunneld_xdp";
/// The licence the program declares. Neither helper it calls is GPL-only (it loads as "MIT"
/// too on 6.18); the declaration is GPL-compatible so that GPL-only helpers stay usable
/// (`bpf_trace_printk` while debugging), and MIT, one of tunneld's licences, is one of its two.
const LICENSE: &std::ffi::CStr = c"Dual MIT/GPL";
/// At most this many local addresses in the address map.
pub const MAX_ADDRESSES: u32 = 64;

/// XDP verdicts.
pub const XDP_ABORTED: u32 = 0;
pub const XDP_DROP: u32 = 1;
pub const XDP_PASS: u32 = 2;
pub const XDP_TX: u32 = 3;
pub const XDP_REDIRECT: u32 = 4;

/// Helper function numbers (`enum bpf_func_id`).
const HELPER_MAP_LOOKUP_ELEM: i32 = 1;
const HELPER_REDIRECT_MAP: i32 = 51;

/// `struct xdp_md` field offsets.
const MD_DATA: i16 = 0;
const MD_DATA_END: i16 = 4;
const MD_RX_QUEUE_INDEX: i16 = 16;

// XDP attach flags (linux/if_link.h).
const XDP_FLAGS_SKB_MODE: u32 = 1 << 1;
const XDP_FLAGS_DRV_MODE: u32 = 1 << 2;
const XDP_FLAGS_HW_MODE: u32 = 1 << 3;
const XDP_FLAGS_REPLACE: u32 = 1 << 4;

/// How the program runs on an interface.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachMode {
    /// In the driver, before an skb exists (`XDP_FLAGS_DRV_MODE`, "native").
    Driver,
    /// In the generic receive path, on any interface (`XDP_FLAGS_SKB_MODE`).
    Generic,
}

impl AttachMode {
    fn flags(self) -> u32 {
        match self {
            AttachMode::Driver => XDP_FLAGS_DRV_MODE,
            AttachMode::Generic => XDP_FLAGS_SKB_MODE,
        }
    }
}

/// A 16-bit constant as the program reads it from the packet: network byte order in memory,
/// loaded in host order.
fn net16(x: u16) -> i32 {
    i32::from(u16::from_ne_bytes(x.to_be_bytes()))
}

/// The program for UDP `port`, steering to the sockets in `xsks` when the destination is in
/// `addrs`. See the module's documentation for the same in C.
pub fn assemble(
    port: u16,
    xsks: BorrowedFd<'_>,
    addrs: BorrowedFd<'_>,
) -> io::Result<Vec<bpf::Insn>> {
    use bpf::{add_imm, and_imm, call, exit, load, load_map_fd, mov_imm, mov_reg, store};
    const ETH: i16 = 14;
    const KEY: i16 = -16; // the 16-byte key at fp-16
    let mut a = Asm::new();
    let pass = a.label();
    let ipv6 = a.label();
    let lookup = a.label();
    let udp = i32::from(libc::IPPROTO_UDP as u8);

    a.emit([
        mov_reg(R6, R1),                    // r6 = ctx
        load(Size::W, R7, R6, MD_DATA),     // r7 = ctx->data
        load(Size::W, R8, R6, MD_DATA_END), // r8 = ctx->data_end
        mov_reg(R4, R7),                    // r4 = r7
        add_imm(R4, ETH.into()),            // r4 += 14
    ]);
    a.jump(Cond::GtReg(R4, R8), pass); //      if r4 > r8 goto pass
    a.emit([load(Size::H, R5, R7, 12)]); //    r5 = *(u16 *)(r7 + 12)  ethertype
    a.jump(Cond::EqImm(R5, net16(0x86dd)), ipv6); // if r5 == htons(0x86dd) goto ipv6
    a.jump(Cond::NeImm(R5, net16(0x0800)), pass); // if r5 != htons(0x0800) goto pass

    // IPv4: 20 bytes of header (no options), then UDP.
    a.emit([
        mov_reg(R4, R7),                    // r4 = r7
        add_imm(R4, (ETH + 20 + 8).into()), // r4 += 42
    ]);
    a.jump(Cond::GtReg(R4, R8), pass); //         if r4 > r8 goto pass
    a.emit([load(Size::B, R5, R7, ETH)]); //      r5 = *(u8 *)(r7 + 14)   version, IHL
    a.jump(Cond::NeImm(R5, 0x45), pass); //       if r5 != 0x45 goto pass
    a.emit([
        load(Size::H, R5, R7, ETH + 6), // r5 = *(u16 *)(r7 + 20)  flags, offset
        and_imm(R5, net16(0x3fff)),     // r5 &= htons(0x3fff)     MF | offset
    ]);
    a.jump(Cond::NeImm(R5, 0), pass); //          if r5 != 0 goto pass
    a.emit([load(Size::B, R5, R7, ETH + 9)]); //  r5 = *(u8 *)(r7 + 23)   protocol
    a.jump(Cond::NeImm(R5, udp), pass); //        if r5 != 17 goto pass
    a.emit([load(Size::H, R5, R7, ETH + 22)]); // r5 = *(u16 *)(r7 + 36)  UDP dest. port
    a.jump(Cond::NeImm(R5, net16(port)), pass); // if r5 != htons(PORT) goto pass
    a.emit([
        mov_imm(R5, 0),                                             // r5 = 0
        store(Size::DW, R10, KEY, R5),                              // *(u64 *)(r10 - 16) = r5
        mov_imm(R5, u32::from_ne_bytes([0, 0, 0xff, 0xff]) as i32), // r5 = htonl(0xffff)
        store(Size::W, R10, KEY + 8, R5),                           // *(u32 *)(r10 - 8) = r5
        load(Size::W, R5, R7, ETH + 16),                            // r5 = *(u32 *)(r7 + 30)
        store(Size::W, R10, KEY + 12, R5),                          // *(u32 *)(r10 - 4) = r5
    ]);
    a.jump(Cond::Always, lookup); //              goto lookup

    // IPv6: the fixed header (40 bytes) directly followed by UDP.
    a.bind(ipv6); //                              ipv6:
    a.emit([
        mov_reg(R4, R7),                    // r4 = r7
        add_imm(R4, (ETH + 40 + 8).into()), // r4 += 62
    ]);
    a.jump(Cond::GtReg(R4, R8), pass); //         if r4 > r8 goto pass
    a.emit([
        load(Size::B, R5, R7, ETH), // r5 = *(u8 *)(r7 + 14)   version, class
        and_imm(R5, 0xf0),          // r5 &= 0xf0
    ]);
    a.jump(Cond::NeImm(R5, 0x60), pass); //       if r5 != 0x60 goto pass
    a.emit([load(Size::B, R5, R7, ETH + 6)]); //  r5 = *(u8 *)(r7 + 20)   next header
    a.jump(Cond::NeImm(R5, udp), pass); //        if r5 != 17 goto pass
    a.emit([load(Size::H, R5, R7, ETH + 42)]); // r5 = *(u16 *)(r7 + 56)  UDP dest. port
    a.jump(Cond::NeImm(R5, net16(port)), pass); // if r5 != htons(PORT) goto pass
    a.emit([
        load(Size::DW, R5, R7, ETH + 24), // r5 = *(u64 *)(r7 + 38)  destination
        store(Size::DW, R10, KEY, R5),    // *(u64 *)(r10 - 16) = r5
        load(Size::DW, R5, R7, ETH + 32), // r5 = *(u64 *)(r7 + 46)
        store(Size::DW, R10, KEY + 8, R5), // *(u64 *)(r10 - 8) = r5
    ]);

    a.bind(lookup); //                            lookup:
    a.emit(load_map_fd(R1, addrs)); //            r1 = &addrs  (ld_imm64, two slots)
    a.emit([
        mov_reg(R2, R10),             // r2 = r10
        add_imm(R2, KEY.into()),      // r2 += -16
        call(HELPER_MAP_LOOKUP_ELEM), // call bpf_map_lookup_elem
    ]);
    a.jump(Cond::EqImm(R0, 0), pass); //          if r0 == 0 goto pass
    a.emit(load_map_fd(R1, xsks)); //             r1 = &xsks
    a.emit([
        load(Size::W, R2, R6, MD_RX_QUEUE_INDEX), // r2 = ctx->rx_queue_index
        mov_imm(R3, XDP_PASS as i32),             // r3 = XDP_PASS  (no socket: the kernel)
        call(HELPER_REDIRECT_MAP),                // call bpf_redirect_map
        exit(),                                   // exit
    ]);

    a.bind(pass); //                              pass:
    a.emit([
        mov_imm(R0, XDP_PASS as i32), // r0 = XDP_PASS
        exit(),                       // exit
    ]);
    a.finish()
}

/// The loaded program, its maps and, once attached, the link that holds it on an interface.
#[derive(Debug)]
pub struct XdpProgram {
    /// Closed first (see `Drop`): it detaches the program.
    link: Option<OwnedFd>,
    attached: Option<(u32, AttachMode)>,
    prog: OwnedFd,
    xsks: Map,
    addrs: Map,
    id: u32,
    port: u16,
}

impl XdpProgram {
    /// Loads the program steering UDP datagrams to `port` on the addresses in its address
    /// map (empty at first: nothing is steered until [`set_addresses`](Self::set_addresses))
    /// into the AF_XDP socket registered for the receiving queue; `queues` sockets at most
    /// (queues `0..queues`). Needs CAP_BPF and CAP_NET_ADMIN; the error says which is missing,
    /// or carries the verifier's log when the kernel refuses the program.
    pub fn load(port: u16, queues: u32) -> io::Result<XdpProgram> {
        if queues == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "an XSKMAP of 0 queues",
            ));
        }
        let xsks = Map::create(bpf::MAP_TYPE_XSKMAP, 4, 4, queues, 0, "tunneld_xsks")?;
        let addrs = Map::create(
            bpf::MAP_TYPE_HASH,
            16,
            1,
            MAX_ADDRESSES,
            bpf::F_RDONLY_PROG,
            "tunneld_addrs",
        )?;
        let insns = assemble(port, xsks.fd(), addrs.fd())?;
        let prog = bpf::prog_load(bpf::PROG_TYPE_XDP, &insns, LICENSE, PROGRAM_NAME)?;
        let id = bpf::prog_info(prog.as_fd())?.id;
        Ok(XdpProgram {
            link: None,
            attached: None,
            prog,
            xsks,
            addrs,
            id,
            port,
        })
    }

    /// The program's id (as `bpftool prog` and [`attached_program`] show it).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The UDP port it steers.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The program's file descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.prog.as_fd()
    }

    /// Replaces the set of local addresses datagrams must be addressed to (IPv4 and IPv6, at
    /// most [`MAX_ADDRESSES`]). New addresses are added before old ones are removed, so an
    /// address in both sets is steered throughout.
    pub fn set_addresses(&self, addrs: &[IpAddr]) -> io::Result<()> {
        let mut keys: Vec<[u8; 16]> = addrs.iter().map(address_key).collect();
        keys.sort_unstable();
        keys.dedup();
        if keys.len() > MAX_ADDRESSES as usize {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{} local addresses for the XDP program, at most {MAX_ADDRESSES}",
                    keys.len()
                ),
            ));
        }
        for key in &keys {
            self.addrs.update(key, &[1], bpf::ANY)?;
        }
        for old in self.addrs.keys()? {
            if !keys.iter().any(|k| k[..] == old[..]) {
                self.addrs.delete(&old)?;
            }
        }
        Ok(())
    }

    /// The addresses in the address map now (IPv4 ones as IPv4).
    pub fn addresses(&self) -> io::Result<Vec<IpAddr>> {
        let mut out: Vec<IpAddr> = self
            .addrs
            .keys()?
            .into_iter()
            .filter_map(|k| <[u8; 16]>::try_from(k.as_slice()).ok())
            .map(|k| std::net::Ipv6Addr::from(k).to_canonical())
            .collect();
        out.sort_unstable();
        Ok(out)
    }

    /// Puts AF_XDP socket `xsk` in the XSKMAP at `queue`: datagrams received on that queue go
    /// to it. A socket already there is replaced.
    pub fn register_socket(&self, queue: u32, xsk: BorrowedFd<'_>) -> io::Result<()> {
        let fd = xsk.as_raw_fd() as u32;
        self.xsks
            .update(&queue.to_ne_bytes(), &fd.to_ne_bytes(), bpf::ANY)
            .map_err(|e| {
                io::Error::new(
                    e.kind(),
                    format!("cannot register the AF_XDP socket for queue {queue}: {e}"),
                )
            })
    }

    /// Takes the socket of `queue` out of the XSKMAP (its datagrams go to the kernel again).
    /// Nothing when there was none (the kernel does not tell an empty slot apart).
    pub fn unregister_socket(&self, queue: u32) -> io::Result<()> {
        self.xsks.delete(&queue.to_ne_bytes()).map(drop)
    }

    /// Attaches to interface `ifindex` in `mode` with a bpf_link (BPF_LINK_CREATE), so the
    /// program is detached when the link closes: on drop, and also when the process is killed.
    ///
    /// A program already attached the netlink way and named [`PROGRAM_NAME`] (left by an
    /// older tunneld) is detached first. Anyone else's program, or a live link holding the
    /// interface (another tunneld running), is an error (`EBUSY`) saying so. `ifindex` is
    /// looked up in the calling thread's network namespace.
    pub fn attach(&mut self, ifindex: u32, mode: AttachMode) -> io::Result<()> {
        if let Some((at, _)) = self.attached {
            return Err(io::Error::new(
                io::ErrorKind::ResourceBusy,
                format!("the XDP program is already attached (interface {at})"),
            ));
        }
        for old in attached_programs(ifindex)? {
            if old.name != PROGRAM_NAME {
                return Err(io::Error::new(
                    io::ErrorKind::ResourceBusy,
                    format!(
                        "interface {ifindex} already has XDP program {} ({:?}, {} mode), which \
                         is not tunneld's; remove it (`ip link set dev <if> xdp off`) or use \
                         another interface",
                        old.id,
                        old.name,
                        old.mode.as_str()
                    ),
                ));
            }
            detach_left_behind(ifindex, &old)?;
        }
        let link = bpf::xdp_link_create(self.prog.as_fd(), ifindex, mode.flags())
            .map_err(|e| attach_error(e, ifindex, mode))?;
        self.link = Some(link);
        self.attached = Some((ifindex, mode));
        Ok(())
    }

    /// Detaches from the interface (closes the link); nothing when not attached.
    pub fn detach(&mut self) {
        self.link = None;
        self.attached = None;
    }

    /// The mode it is attached in, if it is.
    pub fn mode(&self) -> Option<AttachMode> {
        self.attached.map(|(_, mode)| mode)
    }

    /// The interface it is attached to, if it is.
    pub fn ifindex(&self) -> Option<u32> {
        self.attached.map(|(ifindex, _)| ifindex)
    }

    /// Runs the program on `frame` as if received on `queue` of the loopback interface
    /// (BPF_PROG_TEST_RUN; it works without attaching) and returns its verdict
    /// ([`XDP_PASS`], [`XDP_REDIRECT`], ...). The redirect itself is not carried out. The
    /// kernel refuses frames shorter than an Ethernet header (EINVAL), and loopback has only
    /// queue 0: for other queues, [`test_run_on`](Self::test_run_on) an interface that has them.
    pub fn test_run(&self, frame: &[u8], queue: u32) -> io::Result<u32> {
        if queue == 0 {
            bpf::prog_test_run(self.prog.as_fd(), frame, None)
        } else {
            self.test_run_on(frame, 1, queue)
        }
    }

    /// [`test_run`](Self::test_run) as if received on `queue` of interface `ifindex` (of this
    /// thread's network namespace).
    pub fn test_run_on(&self, frame: &[u8], ifindex: u32, queue: u32) -> io::Result<u32> {
        // struct xdp_md: data, data_end, data_meta, ingress_ifindex, rx_queue_index,
        // egress_ifindex. data is the metadata length (none) and data_end the frame's.
        let fields = [0, frame.len() as u32, 0, ifindex, queue, 0];
        let ctx: Vec<u8> = fields.iter().flat_map(|f| f.to_ne_bytes()).collect();
        bpf::prog_test_run(self.prog.as_fd(), frame, Some(&ctx))
    }
}

impl Drop for XdpProgram {
    fn drop(&mut self) {
        // The link first: the program leaves the interface before its maps and it close.
        self.link = None;
    }
}

/// The address map's key for `addr`: IPv6 as is, IPv4 as ::ffff:a.b.c.d.
fn address_key(addr: &IpAddr) -> [u8; 16] {
    match addr {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

fn attach_error(e: io::Error, ifindex: u32, mode: AttachMode) -> io::Error {
    let why = match e.raw_os_error() {
        Some(libc::EBUSY) => {
            "another XDP program or bpf_link holds it (another tunneld running?)".to_string()
        }
        Some(libc::EEXIST) => {
            "an XDP program is attached in the other mode (native and generic cannot mix)".into()
        }
        Some(libc::EOPNOTSUPP) if mode == AttachMode::Driver => {
            "its driver has no native XDP (generic mode works on any interface)".into()
        }
        Some(libc::ENODEV) => "no such interface".into(),
        Some(libc::EPERM) => {
            let missing = bpf::missing_capabilities("CAP_BPF and CAP_NET_ADMIN");
            if missing.is_empty() {
                "needs CAP_NET_ADMIN and CAP_BPF".into()
            } else {
                format!(
                    "needs CAP_NET_ADMIN and CAP_BPF; this process lacks {}",
                    missing.join(" and ")
                )
            }
        }
        _ => e.to_string(),
    };
    io::Error::new(
        e.kind(),
        format!(
            "cannot attach the XDP program to interface {ifindex} in {} mode: {why} ({e})",
            AttachedMode::from(mode).as_str()
        ),
    )
}

/// Detaches a tunneld program left attached the netlink way, only if it still is the one
/// seen (XDP_FLAGS_REPLACE with its fd as the expected program).
fn detach_left_behind(ifindex: u32, old: &AttachedProgram) -> io::Result<()> {
    let fd = match bpf::prog_fd_by_id(old.id) {
        Ok(fd) => fd,
        Err(e) if e.raw_os_error() == Some(libc::ENOENT) => return Ok(()), // gone meanwhile
        Err(e) => return Err(e),
    };
    match netlink_set_xdp(
        ifindex,
        None,
        old.mode.flags() | XDP_FLAGS_REPLACE,
        Some(fd.as_fd()),
    ) {
        Ok(()) => {
            tracing::info!(
                ifindex,
                id = old.id,
                "replacing an XDP program a previous tunneld left on the interface"
            );
            Ok(())
        }
        Err(e) if e.kind() == io::ErrorKind::ResourceBusy => Err(io::Error::new(
            io::ErrorKind::ResourceBusy,
            format!(
                "interface {ifindex}: tunneld's XDP program {} is held by a live bpf_link; is \
                 another tunneld running on this interface?",
                old.id
            ),
        )),
        Err(e) => Err(io::Error::new(
            e.kind(),
            format!(
                "cannot detach the XDP program {} left on interface {ifindex}: {e}",
                old.id
            ),
        )),
    }
}

/// Attaches `prog` to `ifindex` the old-fashioned way (netlink IFLA_XDP), with no link: it
/// stays on the interface after the process exits. tunneld never does this; tests use it to
/// leave a program behind as a killed older version would have.
pub fn attach_legacy(ifindex: u32, prog: BorrowedFd<'_>, mode: AttachMode) -> io::Result<()> {
    netlink_set_xdp(ifindex, Some(prog), mode.flags(), None)
}

/// Where an attached program runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AttachedMode {
    Driver,
    Generic,
    Offload,
}

impl AttachedMode {
    pub fn as_str(self) -> &'static str {
        match self {
            AttachedMode::Driver => "driver",
            AttachedMode::Generic => "generic",
            AttachedMode::Offload => "offload",
        }
    }

    fn flags(self) -> u32 {
        match self {
            AttachedMode::Driver => XDP_FLAGS_DRV_MODE,
            AttachedMode::Generic => XDP_FLAGS_SKB_MODE,
            AttachedMode::Offload => XDP_FLAGS_HW_MODE,
        }
    }
}

impl From<AttachMode> for AttachedMode {
    fn from(mode: AttachMode) -> AttachedMode {
        match mode {
            AttachMode::Driver => AttachedMode::Driver,
            AttachMode::Generic => AttachedMode::Generic,
        }
    }
}

/// An XDP program attached to an interface, by link or by netlink.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct AttachedProgram {
    pub id: u32,
    pub name: String,
    pub mode: AttachedMode,
}

/// The XDP program attached to interface `ifindex` (of this thread's network namespace), if
/// any (with an offloaded one too, the non-offloaded one).
pub fn attached_program(ifindex: u32) -> io::Result<Option<AttachedProgram>> {
    Ok(attached_programs(ifindex)?.into_iter().next())
}

/// Every XDP program attached to interface `ifindex`: none, one, or (with hardware offload)
/// one offloaded and one not. From RTM_GETLINK's IFLA_XDP; names from the programs' info.
pub fn attached_programs(ifindex: u32) -> io::Result<Vec<AttachedProgram>> {
    let programs = rtnetlink()?
        .xdp_programs(ifindex)
        .map_err(Failure::into_io)?;
    let ids = [
        (AttachedMode::Driver, programs.driver),
        (AttachedMode::Generic, programs.generic),
        (AttachedMode::Offload, programs.offload),
    ];
    let mut out = Vec::new();
    for (mode, id) in ids {
        let Some(id) = id.filter(|&id| id != 0) else {
            continue;
        };
        let name = match bpf::prog_fd_by_id(id) {
            Ok(fd) => bpf::prog_info(fd.as_fd())?.name,
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue, // detached meanwhile
            Err(e) => return Err(e),
        };
        out.push(AttachedProgram { id, name, mode });
    }
    Ok(out)
}

/// An rtnetlink socket of this thread's network namespace, for one question or change.
fn rtnetlink() -> io::Result<Netlink> {
    Netlink::open_query()
}

/// Sets (or, with no `prog`, clears) the XDP program of `ifindex` over netlink; a refusal
/// reads `{errno text}[: {kernel's reason}]`.
fn netlink_set_xdp(
    ifindex: u32,
    prog: Option<BorrowedFd<'_>>,
    flags: u32,
    expected: Option<BorrowedFd<'_>>,
) -> io::Result<()> {
    let fd = prog.map_or(-1, |p| p.as_raw_fd());
    rtnetlink()?
        .set_xdp(ifindex, fd, flags, expected.map(|e| e.as_raw_fd()))
        .map_err(Failure::into_io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xdp_ipv4_addresses_are_keyed_as_mapped_ipv6() {
        let key = address_key(&"192.0.2.7".parse().unwrap());
        assert_eq!(
            key,
            [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 7]
        );
        let v6: IpAddr = "2001:db8::1".parse().unwrap();
        assert_eq!(
            address_key(&v6),
            "2001:db8::1"
                .parse::<std::net::Ipv6Addr>()
                .unwrap()
                .octets()
        );
    }
}
