//! The eventfd that wakes a worker blocked in `poll`: rung by the control plane
//! (`WorkerHandle`) and by other workers that hand it packets (`handoff.rs`).

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

/// Wakes a worker blocked in `poll`.
#[derive(Debug)]
pub(crate) struct Waker {
    fd: OwnedFd,
}

impl Waker {
    pub(crate) fn new() -> io::Result<Self> {
        // SAFETY: eventfd takes no pointers; a negative return is an error.
        let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: fd is a freshly created descriptor that nothing else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    pub(crate) fn wake(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a valid u64 to an eventfd we own. A full counter
        // (EAGAIN) still leaves the worker woken, so the result needs no handling.
        unsafe { libc::write(self.fd.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    pub(crate) fn reset(&self) {
        let mut value: u64 = 0;
        // SAFETY: reads 8 bytes into a valid u64; EAGAIN (not woken) is fine.
        unsafe { libc::read(self.fd.as_raw_fd(), (&mut value as *mut u64).cast(), 8) };
    }
}

impl AsRawFd for Waker {
    /// The descriptor to `poll` for readability (woken).
    fn as_raw_fd(&self) -> std::os::fd::RawFd {
        self.fd.as_raw_fd()
    }
}
