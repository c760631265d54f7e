//! How long a worker keeps polling after sparse traffic before it sleeps.
//!
//! A sleeping worker takes microseconds to wake, and on a virtual machine a sleeping CPU
//! takes tens. Request/response traffic pays that at every hop unless the worker is still
//! polling when the next packet comes. The window starts at the configured `busy_poll_us`.
//! When the traffic comes back only a little after the window ran out, the window grows to
//! cover that gap next time, up to [`GROWTH`] times the configured one. When the gap was
//! longer than that, it halves back towards the configured one. So a steady request/response
//! exchange whose round trip is a little longer than the window stops paying wake-ups, and
//! sparse, irregular traffic keeps the short window. Without the growth such an exchange
//! stays slow: every hop waits for a wake-up, which is what makes the round trip too long.
//!
//! A worker carrying bulk traffic does not poll at all. Its short turns are the tails of
//! bursts (the last datagrams of a super-packet, a lone TCP ACK), and what follows them is
//! the next burst, which nobody waits on: polling for it only burns the core. Measured on a
//! single TCP stream, the receiving gateway's worker spent a fifth of its time polling that
//! way. So a short turn within [`GROWTH`] windows of a bulk one starts no window.

use std::time::{Duration, Instant};

/// The window grows to at most this many times the configured one.
pub const GROWTH: u32 = 4;

#[derive(Debug, Clone)]
pub struct BusyPoll {
    configured: Duration,
    window: Duration,
    /// When the last sparse turn ended: the window counts from there.
    last_sparse: Option<Instant>,
    /// Set while the window has run out with no traffic: the worker sleeps.
    expired: bool,
    /// When the last bulk turn ended: short turns soon after it are a burst's tail.
    last_bulk: Option<Instant>,
}

impl BusyPoll {
    /// `window` zero turns busy polling off.
    pub fn new(window: Duration) -> BusyPoll {
        BusyPoll {
            configured: window,
            window,
            last_sparse: None,
            expired: false,
            last_bulk: None,
        }
    }

    /// The window now in force.
    #[cfg(test)]
    pub fn window(&self) -> Duration {
        self.window
    }

    /// Whether the worker should poll without sleeping at `now`.
    pub fn polling(&mut self, now: Instant) -> bool {
        match self.last_sparse {
            Some(at) if !self.expired => {
                if now < at + self.window {
                    return true;
                }
                self.expired = true;
                false
            }
            _ => false,
        }
    }

    /// A turn at `now` moved `moved` packets; `sparse` says whether that was few enough to
    /// expect the next packet soon.
    pub fn turned(&mut self, now: Instant, moved: usize, sparse: bool) {
        if moved == 0 || self.configured.is_zero() {
            return;
        }
        if self.expired {
            if let Some(at) = self.last_sparse {
                let gap = now.saturating_duration_since(at);
                let most = self.configured * GROWTH;
                self.window = if gap <= most {
                    // A quarter more than the gap, so the next one is still caught if it
                    // runs a little late.
                    (gap + gap / 4).clamp(self.configured, most)
                } else {
                    (self.window / 2).max(self.configured)
                };
            }
        }
        self.expired = false;
        if !sparse {
            self.last_bulk = Some(now);
        }
        let after_bulk = self
            .last_bulk
            .is_some_and(|at| now.saturating_duration_since(at) < self.configured * GROWTH);
        self.last_sparse = (sparse && !after_bulk).then_some(now);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    /// Runs one sparse turn at `t` µs after `start` and says whether the worker was still
    /// polling just before it.
    fn packet_at(b: &mut BusyPoll, start: Instant, t: u64) -> bool {
        let now = start + US * t as u32;
        let polling = b.polling(now);
        b.turned(now, 1, true);
        polling
    }

    #[test]
    fn traffic_inside_the_window_keeps_it() {
        let start = Instant::now();
        let mut b = BusyPoll::new(50 * US);
        packet_at(&mut b, start, 0);
        for t in (30..600).step_by(30) {
            assert!(packet_at(&mut b, start, t), "at {t} µs");
        }
        assert_eq!(b.window(), 50 * US);
    }

    #[test]
    fn a_round_trip_a_little_longer_than_the_window_is_learned() {
        let start = Instant::now();
        let mut b = BusyPoll::new(50 * US);
        packet_at(&mut b, start, 0);
        // The next packet comes 120 µs later: the window ran out at 50.
        assert!(!b.polling(start + 60 * US));
        assert!(!packet_at(&mut b, start, 120));
        assert_eq!(b.window(), 150 * US);
        // From then on a 120 µs rhythm finds the worker polling.
        for k in 2..10 {
            assert!(packet_at(&mut b, start, 120 * k), "packet {k}");
        }
        assert_eq!(b.window(), 150 * US);
    }

    #[test]
    fn the_window_never_grows_past_its_bound_and_shrinks_after_long_gaps() {
        let start = Instant::now();
        let mut b = BusyPoll::new(50 * US);
        packet_at(&mut b, start, 0);
        b.polling(start + 100 * US);
        packet_at(&mut b, start, 190);
        assert_eq!(
            b.window(),
            50 * US * GROWTH,
            "190 µs + 25 % is capped at 200"
        );
        // Idle for a millisecond: the worker slept long, so the window halves.
        b.polling(start + 500 * US);
        packet_at(&mut b, start, 1190);
        assert_eq!(b.window(), 100 * US);
        b.polling(start + 1400 * US);
        packet_at(&mut b, start, 5000);
        assert_eq!(b.window(), 50 * US);
        b.polling(start + 5100 * US);
        packet_at(&mut b, start, 9000);
        assert_eq!(b.window(), 50 * US, "never below the configured window");
    }

    #[test]
    fn short_turns_between_bulk_ones_start_no_window() {
        let start = Instant::now();
        let mut b = BusyPoll::new(50 * US);
        // A super-packet every 90 µs, each followed by its tail and an ACK.
        for k in 0..10u32 {
            let burst = start + 90 * US * k;
            b.turned(burst, 44, false);
            b.turned(burst + 5 * US, 3, true);
            assert!(!b.polling(burst + 6 * US), "after the tail of burst {k}");
            b.turned(burst + 12 * US, 1, true);
            assert!(!b.polling(burst + 13 * US), "after the ACK of burst {k}");
        }
        // Once the bulk traffic has stopped for longer than the largest window, request and
        // response traffic is polled for again.
        let later = start + 90 * US * 10 + 50 * US * GROWTH;
        assert!(!packet_at(&mut b, later, 0));
        assert!(b.polling(later + 10 * US));
        assert!(packet_at(&mut b, later, 30));
    }

    #[test]
    fn bulk_turns_do_not_start_a_window_and_zero_means_off() {
        let start = Instant::now();
        let mut b = BusyPoll::new(50 * US);
        b.turned(start, 64, false);
        assert!(!b.polling(start + US));
        let mut off = BusyPoll::new(Duration::ZERO);
        packet_at(&mut off, start, 0);
        assert!(!off.polling(start));
        assert!(!packet_at(&mut off, start, 10));
        assert_eq!(off.window(), Duration::ZERO);
    }
}
