//! The AF_XDP backend: the XDP program that steers the tunnel's datagrams to AF_XDP sockets
//! and its loader (`program`, on the bpf(2) calls and eBPF encoder in `bpf`).

pub mod bpf;
pub mod program;
