//! The AF_XDP backend: the XDP program that steers the tunnel's datagrams to AF_XDP sockets
//! and its loader (`program`, on the bpf(2) calls and eBPF encoder in `bpf`); Ethernet, IP
//! and UDP headers (`frame`); next hops from the kernel's tables (`nexthop`).

pub mod bpf;
pub mod frame;
pub mod nexthop;
pub mod program;
