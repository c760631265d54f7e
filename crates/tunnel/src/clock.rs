//! The one place where the core's `now` meets boringtun's clock.
//!
//! boringtun's `Tunn` reads a monotonic clock itself. In the daemon that clock and the `now`
//! the dataplane passes in agree, so nothing is done here. With the `virtual-time` feature
//! (tests only), boringtun reads a thread-local mock clock instead, and every call into a
//! `Tunn` is preceded by [`Clock::sync`], which sets that mock clock to `now`. Each `Device`
//! measures from its own epoch, so two devices on one thread stay consistent.

use std::time::{Duration, Instant};

/// Whether this build drives boringtun from virtual time. The daemon refuses to start if so.
pub const VIRTUAL_TIME: bool = cfg!(feature = "virtual-time");

#[derive(Debug, Clone, Copy)]
pub struct Clock {
    epoch: Instant,
}

impl Clock {
    pub fn new(now: Instant) -> Self {
        let clock = Self { epoch: now };
        clock.sync(now);
        clock
    }

    /// Time since this clock's epoch.
    pub fn elapsed(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.epoch)
    }

    /// Makes boringtun's view of time equal to `now` (virtual time only).
    #[inline]
    pub fn sync(&self, now: Instant) {
        #[cfg(feature = "virtual-time")]
        mock_instant::MockClock::set_time(self.elapsed(now));
        #[cfg(not(feature = "virtual-time"))]
        let _ = now;
    }
}
