//! The dataplane of tunneld: batches, batch I/O backends and the worker loop.

// Input from the network, config files and the UAPI socket must never panic: no unwrap or
// expect outside tests (an invariant that cannot fail says so with an `allow` and a reason).
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used))]

pub mod announce;
pub mod batch;
mod busy_poll;
mod handoff;
pub mod io;
pub mod netlink;
pub mod offload;
pub mod sim;
pub mod steering;
pub mod tun;
pub mod udp;
pub mod uring;
mod waker;
pub mod worker;
pub mod xdp;

pub use batch::{Batch, BATCH_SIZE, FRAME_PAYLOAD, HEADROOM};
pub use io::{DatagramIo, PacketIo};

/// What a real device takes from outside the protocol core: the operating system's random
/// numbers and the wall clock now (the core reads neither itself). Pass it with
/// `Instant::now()` to `Device::new` or `Device::for_worker`.
pub fn system_environment() -> tunneld_wireguard::Environment {
    let unix_now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    tunneld_wireguard::Environment::new(rand_core::OsRng, unix_now)
}

/// A cookie secret from the operating system's random numbers, for all the workers of one
/// interface (`Environment::with_cookie_secret`).
pub fn system_cookie_secret() -> tunneld_wireguard::CookieSecret {
    tunneld_wireguard::CookieSecret::new(&mut rand_core::OsRng)
}
