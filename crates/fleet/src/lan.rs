//! The site's LAN side: its virtual addresses (`lan_addresses` on `lan_interface`), held by
//! this gateway only while it is its site's active gateway *and* its lease is known to live.
//!
//! A thread of its own holds them, apart from the member loop, which can wait on the store
//! for seconds: the fence must fall on time whatever the store does. It takes the addresses
//! when the reconcile says this gateway is active, announces them (gratuitous ARP,
//! unsolicited neighbour advertisement, a few times), and releases them when it stands by,
//! leaves, loses its lease, or when no keep-alive has been answered for `lease_ttl` minus
//! [`FENCE_MARGIN`] (counted from when the last answered one was *sent*: etcd renewed the
//! lease after that, so it cannot expire before that send plus the TTL). A standby takes
//! the addresses only once etcd has expired or revoked this gateway's keys, after that.
//!
//! The kernel fences too: each address is added with a lifetime that ends no later than the
//! fence, renewed with every keep-alive answered, so a gateway that is killed, crashes or
//! freezes loses its addresses by the kernel's hand before its lease can expire. On start,
//! addresses left on the interface by an earlier run are removed (this run is not active
//! yet).

use crate::status::Shared;
use std::net::IpAddr;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tunneld::IpNet;
use tunneld_dataplane::announce::Announcer;
use tunneld_dataplane::netlink::{Link, Netlink};

/// How long before the lease could expire in etcd the addresses go: room for this thread to
/// be late (a loaded host) and for the kernel's lifetime check, which runs up to a quarter
/// second late and whose lifetimes are whole seconds (the kernel's own fence lies below
/// this one). etcd itself removes an expired lease's keys only after the expiry, up to half
/// a second later, and the standby hears of it through its watch after that.
pub const FENCE_MARGIN: Duration = Duration::from_millis(500);
/// The shortest lifetime the kernel takes (whole seconds): with less left before the fence,
/// the addresses are not taken until the next keep-alive is answered.
const MIN_LIFETIME: Duration = Duration::from_secs(1);
/// When the announcements are sent, after taking the addresses: at once, and again for
/// hosts and switches that missed the first (keepalived repeats its gratuitous ARP too).
const ANNOUNCE_AT: [Duration; 4] = [
    Duration::ZERO,
    Duration::from_millis(250),
    Duration::from_secs(1),
    Duration::from_secs(3),
];
/// How soon a take that failed (no such interface yet, say) is tried again.
const RETRY: Duration = Duration::from_secs(1);
/// How long [`LanSide::release_now`] waits for the thread.
const RELEASE_WAIT: Duration = Duration::from_secs(1);

/// What the member loop wants; the thread makes it so.
#[derive(Debug, Default)]
struct Want {
    /// The reconcile's reading: this gateway is its site's active one.
    active: bool,
    /// Until when the lease surely lives in etcd, less [`FENCE_MARGIN`].
    fence: Option<Instant>,
    /// Leaving the fleet, or stopping: release and hold no more.
    leaving: bool,
    /// Take nothing before this: after a takeover, the dead gateway's addresses may live
    /// on in its kernel until their lifetime ends.
    not_before: Option<Instant>,
    /// Stop the thread (after releasing).
    stop: bool,
    /// Whether the addresses are held now (the thread's answer).
    held: bool,
}

struct Inner {
    want: Mutex<Want>,
    changed: Condvar,
}

impl Inner {
    fn lock(&self) -> std::sync::MutexGuard<'_, Want> {
        self.want.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The LAN side's handle in the member loop. Dropping it releases the addresses.
pub(crate) struct LanSide {
    inner: Arc<Inner>,
    ttl: Duration,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl LanSide {
    /// Starts the thread that holds `addresses` on `interface`, in the calling thread's
    /// network namespace. It first removes what an earlier run left there.
    pub fn start(
        interface: String,
        addresses: Vec<IpNet>,
        ttl: Duration,
        announcer: Arc<Announcer>,
        shared: Arc<Shared>,
        name: String,
    ) -> std::io::Result<LanSide> {
        let inner = Arc::new(Inner {
            want: Mutex::new(Want::default()),
            changed: Condvar::new(),
        });
        let holder = Holder {
            inner: inner.clone(),
            interface,
            addresses,
            announcer,
            shared,
            name,
            netlink: None,
            link: None,
            held: false,
            announce_at: Vec::new(),
            retry_at: None,
            failing: false,
        };
        let thread = std::thread::Builder::new()
            .name("fleet-lan".into())
            .spawn(move || holder.run())?;
        Ok(LanSide {
            inner,
            ttl,
            thread: Some(thread),
        })
    }

    /// The reconcile's reading of the election.
    pub fn set_active(&self, active: bool) {
        let mut want = self.inner.lock();
        if want.active != active {
            want.active = active;
            self.inner.changed.notify_all();
        }
    }

    /// A keep-alive (or the grant) sent at `sent` was answered: the lease lives in etcd
    /// until at least `sent` plus the TTL.
    pub fn renewed(&self, sent: Instant) {
        let mut want = self.inner.lock();
        let fence = sent + self.ttl.saturating_sub(FENCE_MARGIN);
        if want.fence.is_none_or(|f| fence > f) {
            want.fence = Some(fence);
            self.inner.changed.notify_all();
        }
    }

    /// Takes nothing before `until` (see `Want::not_before`).
    pub fn hold_off(&self, until: Instant) {
        let mut want = self.inner.lock();
        want.not_before = Some(want.not_before.map_or(until, |t| t.max(until)));
        self.inner.changed.notify_all();
    }

    /// The lease is gone (expired in etcd, or a new one taken): hold nothing until the
    /// reconcile says this gateway is active under the new one.
    pub fn lease_lost(&self) {
        let mut want = self.inner.lock();
        want.active = false;
        want.fence = None;
        self.inner.changed.notify_all();
    }

    /// Releases the addresses and waits (bounded) until they are gone: before resigning, so
    /// that the next gateway can take them at once.
    pub fn release_now(&self) {
        let mut want = self.inner.lock();
        want.leaving = true;
        self.inner.changed.notify_all();
        let deadline = Instant::now() + RELEASE_WAIT;
        while want.held {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            want = self
                .inner
                .changed
                .wait_timeout(want, left)
                .map_or_else(|p| p.into_inner().0, |(w, _)| w);
        }
    }
}

impl Drop for LanSide {
    fn drop(&mut self) {
        {
            let mut want = self.inner.lock();
            want.leaving = true;
            want.stop = true;
            self.inner.changed.notify_all();
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// The thread's state.
struct Holder {
    inner: Arc<Inner>,
    interface: String,
    addresses: Vec<IpNet>,
    announcer: Arc<Announcer>,
    shared: Arc<Shared>,
    name: String,
    netlink: Option<Netlink>,
    /// The interface's index and MAC (`None`: no MAC, nothing announced) when last taken.
    link: Option<(u32, Option<[u8; 6]>)>,
    held: bool,
    /// Announcements still to send, soonest last.
    announce_at: Vec<Instant>,
    retry_at: Option<Instant>,
    /// A take failed and was said; said again only after one succeeded.
    failing: bool,
}

/// Why the addresses go.
enum Release {
    StandingBy,
    LeaseLost,
    Leaving,
    Fenced(Duration),
}

impl Holder {
    fn run(mut self) {
        self.remove_leftovers();
        let mut want = self.inner.lock();
        loop {
            let now = Instant::now();
            let fence = want.fence;
            let (active, leaving, stop) = (want.active, want.leaving, want.stop);
            let not_before = want.not_before;
            let held_off = not_before.is_some_and(|t| now < t);
            drop(want);

            let live = fence.is_some_and(|f| now < f);
            if self.held {
                if leaving {
                    self.release(Release::Leaving);
                } else if fence.is_none() {
                    self.release(Release::LeaseLost);
                } else if !active {
                    self.release(Release::StandingBy);
                } else if !live {
                    self.release(Release::Fenced(self.silent_for(fence, now)));
                } else if let Some(fence) = fence {
                    self.renew(fence, now);
                }
            } else if active && !leaving && !stop && !held_off {
                match fence {
                    Some(f)
                        if f.saturating_duration_since(now) >= MIN_LIFETIME
                            && self.retry_at.is_none_or(|at| now >= at) =>
                    {
                        self.take(f, now);
                    }
                    _ => {}
                }
            }
            if self.held {
                self.announce_due(now);
            }

            want = self.inner.lock();
            want.held = self.held;
            self.inner.changed.notify_all();
            if want.stop && !self.held {
                return;
            }
            // Sleep until the fence, the next announcement or retry, or a change.
            let mut wake: Option<Instant> = None;
            let mut at = |t: Instant| wake = Some(wake.map_or(t, |w| w.min(t)));
            if self.held {
                if let Some(f) = want.fence {
                    at(f);
                }
                if let Some(&next) = self.announce_at.last() {
                    at(next);
                }
            } else if want.active {
                if let Some(r) = self.retry_at {
                    at(r);
                }
                if let Some(t) = not_before.filter(|_| held_off) {
                    at(t);
                }
            }
            let unchanged = |w: &Want| {
                w.active == active
                    && w.fence == fence
                    && w.leaving == leaving
                    && w.stop == stop
                    && w.not_before == not_before
            };
            if !unchanged(&want) {
                continue;
            }
            want = match wake {
                Some(t) => {
                    let left = t.saturating_duration_since(Instant::now());
                    self.inner
                        .changed
                        .wait_timeout_while(want, left, |w| unchanged(w))
                        .map_or_else(|p| p.into_inner().0, |(w, _)| w)
                }
                None => self
                    .inner
                    .changed
                    .wait_while(want, |w| unchanged(w))
                    .unwrap_or_else(|p| p.into_inner()),
            };
        }
    }

    /// How long no keep-alive has been answered, as of `now`, from the fence.
    fn silent_for(&self, fence: Option<Instant>, now: Instant) -> Duration {
        fence.map_or(Duration::ZERO, |f| now.saturating_duration_since(f))
    }

    fn netlink(&mut self) -> std::io::Result<&mut Netlink> {
        if self.netlink.is_none() {
            self.netlink = Some(Netlink::open()?);
        }
        self.netlink
            .as_mut()
            .ok_or_else(|| std::io::Error::other("netlink"))
    }

    fn shown(&self) -> String {
        let list: Vec<String> = self.addresses.iter().map(ToString::to_string).collect();
        format!("{} on {}", list.join(", "), self.interface)
    }

    /// Removes the addresses an earlier run left on the interface (it died holding them).
    fn remove_leftovers(&mut self) {
        let interface = self.interface.clone();
        let addresses = self.addresses.clone();
        let result = (|| -> std::io::Result<Vec<IpNet>> {
            let netlink = self.netlink()?;
            let index = netlink.link_index(&interface)?;
            let present = netlink
                .addresses(index)
                .map_err(|f| f.named("netlink: list addresses"))?;
            let mut removed = Vec::new();
            for addr in addresses.iter().filter(|a| present.contains(&a.addr())) {
                netlink.del_address(index, *addr)?;
                removed.push(*addr);
            }
            Ok(removed)
        })();
        match result {
            Ok(removed) if !removed.is_empty() => {
                let list: Vec<String> = removed.iter().map(ToString::to_string).collect();
                tracing::warn!(
                    "{}: removed the LAN address(es) {} from {interface}, left there by an earlier run (this one is not active yet)",
                    self.name,
                    list.join(", ")
                );
            }
            Ok(_) => {}
            // Said when it is taken, if it still fails then.
            Err(e) => tracing::debug!("{}: LAN side at start: {e}", self.name),
        }
    }

    /// Whole seconds of lifetime that end no later than `fence`.
    fn lifetime(fence: Instant, now: Instant) -> u32 {
        fence
            .saturating_duration_since(now)
            .as_secs()
            .min(u64::from(u32::MAX)) as u32
    }

    fn take(&mut self, fence: Instant, now: Instant) {
        let interface = self.interface.clone();
        let addresses = self.addresses.clone();
        let lifetime = Self::lifetime(fence, now);
        let result = (|| -> std::io::Result<(u32, Option<[u8; 6]>)> {
            let netlink = self.netlink()?;
            let index = netlink.link_index(&interface)?;
            let mac = match netlink
                .link(index)
                .map_err(|f| f.named(&format!("netlink: link {interface}")))?
            {
                Link::Ethernet(mac) => Some(mac),
                Link::NotEthernet => None,
            };
            for addr in &addresses {
                netlink.hold_address(index, *addr, lifetime)?;
            }
            Ok((index, mac))
        })();
        match result {
            Ok((index, mac)) => {
                self.held = true;
                self.failing = false;
                self.retry_at = None;
                self.link = Some((index, mac));
                let start = Instant::now();
                self.announce_at = ANNOUNCE_AT.iter().rev().map(|d| start + *d).collect();
                self.shared
                    .counters
                    .lan_takes
                    .fetch_add(1, Ordering::Relaxed);
                self.shared.state().lan_held = Some(true);
                let announced = if mac.is_some() {
                    "announcing them (gratuitous ARP, unsolicited neighbour advertisement)"
                } else {
                    "not announced: the interface has no MAC or does no ARP"
                };
                tracing::info!(
                    "{}: took the LAN addresses {} (active for the site); {announced}",
                    self.name,
                    self.shown()
                );
                self.announce_due(Instant::now());
            }
            Err(e) => {
                // Nothing half-held: what was added goes (each add is separate).
                self.drop_addresses();
                self.retry_at = Some(Instant::now() + RETRY);
                if !self.failing {
                    self.failing = true;
                    tracing::warn!(
                        "{}: cannot take the LAN addresses {}: {e}; retrying every {} s while active",
                        self.name,
                        self.shown(),
                        RETRY.as_secs()
                    );
                }
            }
        }
    }

    /// Renews the addresses' lifetime up to the fence, after a keep-alive was answered.
    fn renew(&mut self, fence: Instant, now: Instant) {
        let lifetime = Self::lifetime(fence, now);
        if lifetime == 0 {
            // Less than a second to the fence: the lifetime set before ends earlier still.
            return;
        }
        let Some((index, _)) = self.link else {
            return;
        };
        let addresses = self.addresses.clone();
        let result = self.netlink().and_then(|netlink| {
            addresses
                .iter()
                .try_for_each(|addr| netlink.hold_address(index, *addr, lifetime))
        });
        if let Err(e) = result {
            // The interface went, or an address was removed by hand: held no more, as far as
            // the kernel goes; taken again after RETRY.
            tracing::warn!(
                "{}: cannot renew the LAN addresses {}: {e}; taking them again",
                self.name,
                self.shown()
            );
            self.drop_addresses();
            self.held = false;
            self.shared.state().lan_held = Some(false);
            self.retry_at = Some(Instant::now() + RETRY);
        }
    }

    fn announce_due(&mut self, now: Instant) {
        let Some((index, Some(mac))) = self.link else {
            self.announce_at.clear();
            return;
        };
        if self.announce_at.last().is_none_or(|t| *t > now) {
            return;
        }
        while self.announce_at.last().is_some_and(|t| *t <= now) {
            self.announce_at.pop();
        }
        let ips: Vec<IpAddr> = self.addresses.iter().map(IpNet::addr).collect();
        if let Err(e) = self.announcer.announce(index, mac, &ips) {
            tracing::debug!("{}: announcing the LAN addresses: {e}", self.name);
        }
    }

    /// Removes every address, errors logged.
    fn drop_addresses(&mut self) {
        let interface = self.interface.clone();
        let addresses = self.addresses.clone();
        let index = match self.link {
            Some((index, _)) => Ok(index),
            None => self.netlink().and_then(|n| n.link_index(&interface)),
        };
        let Ok(index) = index else {
            return;
        };
        for addr in addresses {
            if let Err(e) = self.netlink().and_then(|n| n.del_address(index, addr)) {
                tracing::warn!("{}: cannot remove the LAN address {addr}: {e}", self.name);
            }
        }
    }

    fn release(&mut self, why: Release) {
        self.drop_addresses();
        self.held = false;
        self.announce_at.clear();
        self.shared.state().lan_held = Some(false);
        let why = match why {
            Release::StandingBy => "standing by".to_string(),
            Release::LeaseLost => "the lease is lost".to_string(),
            Release::Leaving => "leaving the fleet".to_string(),
            Release::Fenced(late) => {
                self.shared
                    .counters
                    .lan_fenced
                    .fetch_add(1, Ordering::Relaxed);
                format!(
                    "fenced: no lease keep-alive answered for lease_ttl - {} ms{}, so the lease may expire in etcd and another gateway take the site",
                    FENCE_MARGIN.as_millis(),
                    if late > Duration::from_millis(100) {
                        format!(" (released {} ms late)", late.as_millis())
                    } else {
                        String::new()
                    }
                )
            }
        };
        tracing::info!(
            "{}: released the LAN addresses {}: {why}",
            self.name,
            self.shown()
        );
    }
}
