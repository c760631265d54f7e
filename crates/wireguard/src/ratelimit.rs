//! The handshake budget of one source address: a token bucket per IPv4 address or IPv6 /64,
//! as the kernel's and wireguard-go's rate limiters keep. It bounds what one address can make
//! the device do under load, once the address has proved with a cookie (mac2) that it is
//! its own; addresses do not share a budget, so a flood from some does not turn away the
//! rest. Before that, when the device is not under load, [`FairShare`] gives each source its
//! share of what the device can handle in a retransmission time: a source past it needs a
//! cookie though the rest do not. Time comes in as `now`.

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Handshake messages a second one source may have handled under load, and how many at
/// once after a quiet spell (the kernel's and wireguard-go's figures).
const PER_SECOND: u64 = 20;
const BURST: u64 = 5;
/// A token is a nanosecond: one message costs a twentieth of a second's worth.
const COST: u64 = 1_000_000_000 / PER_SECOND;
const MAX_TOKENS: u64 = COST * BURST;
/// A source idle this long starts again with a full bucket, so its entry can go.
const IDLE: Duration = Duration::from_secs(1);
/// Most sources remembered at once; past that a new source is refused until `sweep` makes
/// room (the kernel's table is bounded the same way), so memory stays bounded under a flood
/// of spoofed addresses. (A spoofed address cannot pass the cookie check in front of this.)
const MAX_SOURCES: usize = 1 << 16;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Source {
    V4([u8; 4]),
    /// The /64: one host usually has a whole one.
    V6([u8; 8]),
}

impl Source {
    fn of(ip: IpAddr) -> Source {
        match ip.to_canonical() {
            IpAddr::V4(ip) => Source::V4(ip.octets()),
            IpAddr::V6(ip) => {
                let o = ip.octets();
                Source::V6([o[0], o[1], o[2], o[3], o[4], o[5], o[6], o[7]])
            }
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: u64,
    last: Instant,
}

/// The per-source token buckets of one device.
#[derive(Debug, Default)]
pub struct RateLimiter {
    buckets: HashMap<Source, Bucket>,
    last_sweep: Option<Instant>,
}

impl RateLimiter {
    /// Whether `ip` may have one more handshake message handled at `now` (and, if so, that
    /// one is counted).
    pub fn allow(&mut self, ip: IpAddr, now: Instant) -> bool {
        let source = Source::of(ip);
        if let Some(bucket) = self.buckets.get_mut(&source) {
            let earned = now.saturating_duration_since(bucket.last).as_nanos();
            let earned = u64::try_from(earned).unwrap_or(u64::MAX);
            bucket.tokens = bucket.tokens.saturating_add(earned).min(MAX_TOKENS);
            bucket.last = now;
            if bucket.tokens >= COST {
                bucket.tokens -= COST;
                return true;
            }
            return false;
        }
        if self.buckets.len() >= MAX_SOURCES {
            return false;
        }
        self.buckets.insert(
            source,
            Bucket {
                tokens: MAX_TOKENS - COST,
                last: now,
            },
        );
        true
    }

    /// Forgets sources idle for a second or more (they would start full again anyway); at
    /// most once a second, from the device's timers.
    pub fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|last| now.saturating_duration_since(last) < IDLE)
        {
            return;
        }
        self.last_sweep = Some(now);
        self.buckets
            .retain(|_, b| now.saturating_duration_since(b.last) < IDLE);
        if self.buckets.is_empty() && self.buckets.capacity() > 64 {
            self.buckets.shrink_to(64);
        }
    }

    /// How many sources are remembered.
    pub fn sources(&self) -> usize {
        self.buckets.len()
    }
}

/// How long a source's fair share lasts: the initiator's retransmission time, within which
/// the device's answers are worth anything to it.
const SHARE_WINDOW: Duration = crate::noise::sessions::REKEY_TIMEOUT;

#[derive(Debug, Clone, Copy)]
struct Share {
    /// Handshake messages charged to the source, less what the time since has paid off.
    used: f64,
    last: Instant,
}

/// Each source's share of the handshake messages the device can handle in `SHARE_WINDOW`
/// when it is not under load: that many over the sources seen in the window, but never
/// fewer than a burst. Many spokes behind one address (a NAT, a site) fit it while the
/// device keeps up; one address sending far more than the others does not.
#[derive(Debug, Default)]
pub struct FairShare {
    sources: HashMap<Source, Share>,
    last_sweep: Option<Instant>,
}

impl FairShare {
    /// Whether `ip` is within its share of `capacity` (messages the device can handle in a
    /// retransmission time) with one more at `now` (and, if so, that one is charged).
    pub fn allow(&mut self, ip: IpAddr, now: Instant, capacity: f64) -> bool {
        let source = Source::of(ip);
        let known = self.sources.contains_key(&source);
        if !known && self.sources.len() >= MAX_SOURCES {
            return false;
        }
        let active = self.sources.len() + usize::from(!known);
        let share = (capacity / active as f64).max(BURST as f64);
        let entry = self.sources.entry(source).or_insert(Share {
            used: 0.0,
            last: now,
        });
        let elapsed = now.saturating_duration_since(entry.last).as_secs_f64();
        entry.used = (entry.used - share * elapsed / SHARE_WINDOW.as_secs_f64()).max(0.0);
        entry.last = now;
        if entry.used + 1.0 > share {
            return false;
        }
        entry.used += 1.0;
        true
    }

    /// Forgets sources idle for a window (their share would be paid off by then); at most
    /// once a second, from the device's timers.
    pub fn sweep(&mut self, now: Instant) {
        if self
            .last_sweep
            .is_some_and(|last| now.saturating_duration_since(last) < IDLE)
        {
            return;
        }
        self.last_sweep = Some(now);
        self.sources
            .retain(|_, s| now.saturating_duration_since(s.last) < SHARE_WINDOW);
        if self.sources.is_empty() && self.sources.capacity() > 64 {
            self.sources.shrink_to(64);
        }
    }

    /// How many sources are remembered.
    pub fn sources(&self) -> usize {
        self.sources.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[test]
    fn a_source_gets_its_burst_then_twenty_a_second() {
        let mut limiter = RateLimiter::default();
        let now = Instant::now();
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        let allowed = (0..100).filter(|_| limiter.allow(a, now)).count();
        assert_eq!(allowed as u64, BURST);
        // Another address has a budget of its own.
        let b = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 2));
        assert!(limiter.allow(b, now));
        // One second later: twenty more, not a full burst on top.
        let later = now + Duration::from_secs(1);
        let allowed = (0..100).filter(|_| limiter.allow(a, later)).count();
        assert_eq!(allowed as u64, BURST, "the bucket holds at most a burst");
        let mut allowed = 0;
        for ms in 1..=1000u64 {
            if limiter.allow(a, later + Duration::from_millis(ms)) {
                allowed += 1;
            }
        }
        assert_eq!(allowed, PER_SECOND);
    }

    #[test]
    fn ipv6_sources_are_their_64_and_mapped_ipv4_is_ipv4() {
        let mut limiter = RateLimiter::default();
        let now = Instant::now();
        let one: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let same_64: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..BURST {
            assert!(limiter.allow(one, now));
        }
        assert!(!limiter.allow(same_64, now), "one /64, one budget");
        assert!(limiter.allow("2001:db8:1:3::1".parse().unwrap(), now));
        let v4 = Ipv4Addr::new(198, 51, 100, 1);
        for _ in 0..BURST {
            assert!(limiter.allow(IpAddr::V4(v4), now));
        }
        assert!(!limiter.allow(IpAddr::V6(v4.to_ipv6_mapped()), now));
    }

    #[test]
    fn memory_is_bounded_and_idle_sources_are_forgotten() {
        let mut limiter = RateLimiter::default();
        let now = Instant::now();
        for i in 0..(MAX_SOURCES as u32 + 10) {
            let _ = limiter.allow(IpAddr::V4(Ipv4Addr::from(i)), now);
        }
        assert_eq!(limiter.sources(), MAX_SOURCES);
        assert!(!limiter.allow(IpAddr::V4(Ipv4Addr::from(u32::MAX)), now));
        limiter.sweep(now + IDLE);
        assert_eq!(limiter.sources(), 0);
        assert!(limiter.allow(IpAddr::V4(Ipv4Addr::from(u32::MAX)), now + IDLE));
    }

    #[test]
    fn many_spokes_behind_one_address_fit_its_share_and_one_loud_address_does_not() {
        let mut share = FairShare::default();
        let now = Instant::now();
        // 20 000 messages in a window, 256 addresses: 78 each.
        let capacity = 20_000.0;
        let ip = |i: u32| IpAddr::V4(Ipv4Addr::from(0xc633_6400 + i));
        for i in 0..256 {
            let allowed = (0..39)
                .filter(|_| share.allow(ip(i), now, capacity))
                .count();
            assert_eq!(allowed, 39, "a storm's 39 spokes per address fit");
        }
        let loud = (0..1000)
            .filter(|_| share.allow(ip(7), now, capacity))
            .count();
        assert_eq!(loud, 78 - 39, "past its share an address is refused");
        assert!(share.allow(ip(8), now, capacity), "the others are not");
        // Its share comes back over a window.
        let later = now + SHARE_WINDOW;
        let again = (0..1000)
            .filter(|_| share.allow(ip(7), later, capacity))
            .count();
        assert_eq!(again, 78);
        share.sweep(later + SHARE_WINDOW);
        assert_eq!(share.sources(), 0);
    }

    #[test]
    fn alone_a_source_has_the_whole_capacity_and_never_less_than_a_burst() {
        let mut share = FairShare::default();
        let now = Instant::now();
        let a = IpAddr::V4(Ipv4Addr::new(192, 0, 2, 1));
        assert_eq!((0..500).filter(|_| share.allow(a, now, 300.0)).count(), 300);
        let mut tiny = FairShare::default();
        assert_eq!(
            (0..50).filter(|_| tiny.allow(a, now, 0.5)).count() as u64,
            BURST
        );
    }
}
