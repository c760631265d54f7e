//! Pieces shared by the UDP backend tests (`udp_loopback.rs`, `uring.rs`).

use std::os::fd::RawFd;

/// Makes the kernel refuse UDP GSO sends on `fd`: with transmit checksums off
/// (`SO_NO_CHECK`) a `UDP_SEGMENT` send fails with EINVAL, as on a route through IPsec it
/// fails with EIO.
pub fn refuse_gso(fd: RawFd) {
    let on: libc::c_int = 1;
    // SAFETY: `on` is a valid int for the duration of the call.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_NO_CHECK,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    };
    assert_eq!(rc, 0, "SO_NO_CHECK");
}
