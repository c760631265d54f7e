//! The AF_XDP backend: the tunnel's datagrams bypass the kernel's UDP stack (issue 28).

pub mod frame;
pub mod nexthop;
