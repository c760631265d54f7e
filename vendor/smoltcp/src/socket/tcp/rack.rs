//! Time-based loss detection, after RACK (RFC 8985): a segment is lost once a segment sent
//! after it has been delivered and a round trip (plus a reordering allowance) has passed
//! since it was sent. Unlike counting duplicate ACKs or SACKed octets, this finds a loss
//! with a single later segment delivered, which a small window may not have three of.
//!
//! The socket keeps no per-segment record, so the send times of original transmissions
//! are kept per burst: the sequence number where each burst began and its time (in a
//! sequence stream, original transmissions are sent in order). Retransmissions carry their
//! own time (the socket's list of retransmissions in recovery).

use crate::time::{Duration, Instant};
use crate::wire::TcpSeqNumber;

/// How many bursts of original transmissions are remembered. Past that, what is sent
/// later has no known time (and is left to the other loss detection) until the older
/// bursts are acknowledged.
pub(super) const SEND_TIMES: usize = 64;

/// When the original transmissions not yet acknowledged were sent, by burst.
#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(super) struct SendTimes {
    /// In sending order: where each burst began, and when it was sent.
    items: [(TcpSeqNumber, Instant); SEND_TIMES],
    len: usize,
    /// Octets from here on were sent when the table was full: their time is not known.
    horizon: Option<TcpSeqNumber>,
}

impl SendTimes {
    pub(super) const fn new() -> Self {
        SendTimes {
            items: [(TcpSeqNumber(0), Instant::from_micros_const(0)); SEND_TIMES],
            len: 0,
            horizon: None,
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
        self.horizon = None;
    }

    /// Records that new data starting at `seq` (above everything sent before) went out at
    /// `now`.
    pub(super) fn on_send(&mut self, seq: TcpSeqNumber, now: Instant) {
        if self.horizon.is_some() {
            return;
        }
        if let Some(&(last_seq, last_time)) = self.items[..self.len].last()
            && (last_time == now || seq <= last_seq)
        {
            return; // the same burst
        }
        if self.len == SEND_TIMES {
            self.horizon = Some(seq);
            return;
        }
        self.items[self.len] = (seq, now);
        self.len += 1;
    }

    /// Forgets the bursts wholly below `una`, the cumulative acknowledgement.
    pub(super) fn advance(&mut self, una: TcpSeqNumber) {
        if self.horizon.is_some_and(|h| una >= h) {
            self.clear();
            return;
        }
        let mut gone = 0;
        while gone + 1 < self.len && self.items[gone + 1].0 <= una {
            gone += 1;
        }
        self.items.copy_within(gone..self.len, 0);
        self.len -= gone;
    }

    /// When the original transmission of the octet `seq` was sent, if known.
    pub(super) fn time_of(&self, seq: TcpSeqNumber) -> Option<Instant> {
        if self.horizon.is_some_and(|h| seq >= h) {
            return None;
        }
        self.items[..self.len]
            .iter()
            .rev()
            .find(|&&(start, _)| start <= seq)
            .map(|&(_, time)| time)
    }

    /// The bursts in sending order, as (start, end, time); the last one ends at `snd_max`
    /// (or where times stop being known).
    pub(super) fn bursts(
        &self,
        snd_max: TcpSeqNumber,
    ) -> impl Iterator<Item = (TcpSeqNumber, TcpSeqNumber, Instant)> + '_ {
        let last_end = self.horizon.unwrap_or(snd_max);
        (0..self.len).map(move |i| {
            let end = self.items.get(i + 1).filter(|_| i + 1 < self.len);
            let end = end.map_or(last_end, |&(next, _)| next);
            (self.items[i].0, end, self.items[i].1)
        })
    }
}

/// What RACK knows: the most recently sent segment known delivered, and the round trips.
#[derive(Debug, Clone, Copy, Default)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(super) struct Rack {
    /// When the most recently sent segment known delivered was sent (RACK.xmit_ts) ...
    pub(super) xmit_ts: Option<Instant>,
    /// ... and an octet of it (RACK.end_seq, for segments sent at the same time).
    pub(super) seq: TcpSeqNumber,
    /// Its round trip (RACK.rtt).
    pub(super) rtt: Duration,
    /// The smallest round trip measured (for the reordering window and to tell the
    /// delivery of an earlier copy from that of a retransmission).
    pub(super) min_rtt: Option<Duration>,
    /// Original transmissions below this that are not SACKed are lost.
    pub(super) lost_before: Option<TcpSeqNumber>,
    /// When a segment sent before the delivered one is due to be found lost, if not
    /// acknowledged by then (RACK's reordering timer).
    pub(super) deadline: Option<Instant>,
}

impl Rack {
    pub(super) fn clear(&mut self) {
        let min_rtt = self.min_rtt;
        *self = Rack {
            min_rtt,
            ..Rack::default()
        };
    }

    /// Takes in the delivery of the octet `seq`, sent at `sent` (RFC 8985 section 6.2,
    /// steps 2 and 3). A retransmission acknowledged sooner than the smallest round trip
    /// was the earlier copy arriving, and tells nothing of when it was sent.
    pub(super) fn on_delivered(
        &mut self,
        now: Instant,
        sent: Instant,
        seq: TcpSeqNumber,
        retransmitted: bool,
    ) {
        if sent > now {
            return;
        }
        let rtt = now - sent;
        if retransmitted && self.min_rtt.is_some_and(|min| rtt < min) {
            return;
        }
        self.min_rtt = Some(self.min_rtt.map_or(rtt, |min| min.min(rtt)));
        let newer = match self.xmit_ts {
            None => true,
            Some(ts) => sent > ts || (sent == ts && seq > self.seq),
        };
        if newer {
            self.xmit_ts = Some(sent);
            self.seq = seq;
            self.rtt = rtt;
        }
    }

    /// RACK.reo_wnd: a quarter of the smallest round trip.
    pub(super) fn reordering_window(&self) -> Duration {
        Duration::from_micros(self.min_rtt.unwrap_or_default().total_micros() / 4)
    }

    /// Whether what was sent at `sent` (its octet `seq`) was sent before the most recently
    /// sent segment known delivered, and if so from when it counts as lost.
    pub(super) fn lost_from(&self, sent: Instant, seq: TcpSeqNumber) -> Option<Instant> {
        let ts = self.xmit_ts?;
        let before = sent < ts || (sent == ts && seq < self.seq);
        before.then(|| sent + self.rtt + self.reordering_window())
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn s(n: i32) -> TcpSeqNumber {
        TcpSeqNumber(n)
    }

    fn ms(n: i64) -> Instant {
        Instant::from_millis(n)
    }

    #[test]
    fn send_times_by_burst() {
        let mut t = SendTimes::new();
        t.on_send(s(100), ms(0));
        t.on_send(s(200), ms(0)); // same burst
        t.on_send(s(300), ms(5));
        t.on_send(s(300), ms(6)); // not new data
        assert_eq!(t.time_of(s(50)), None);
        assert_eq!(t.time_of(s(250)), Some(ms(0)));
        assert_eq!(t.time_of(s(350)), Some(ms(5)));
        let bursts: Vec<_> = t.bursts(s(400)).collect();
        assert_eq!(
            bursts,
            vec![(s(100), s(300), ms(0)), (s(300), s(400), ms(5))]
        );
        t.advance(s(299));
        assert_eq!(t.time_of(s(299)), Some(ms(0)));
        t.advance(s(300));
        assert_eq!(t.bursts(s(400)).count(), 1);
        // The last burst stays, however far the acknowledgement goes.
        t.advance(s(400));
        assert_eq!(t.time_of(s(450)), Some(ms(5)));
    }

    #[test]
    fn send_times_full_table_stops_at_a_horizon() {
        let mut t = SendTimes::new();
        for i in 0..SEND_TIMES as i32 {
            t.on_send(s(i * 10), ms(i as i64));
        }
        t.on_send(s(SEND_TIMES as i32 * 10), ms(1000));
        assert_eq!(t.time_of(s(SEND_TIMES as i32 * 10 + 5)), None);
        assert_eq!(t.time_of(s(15)), Some(ms(1)));
        // Once everything up to the horizon is acknowledged, times are kept again.
        t.advance(s(SEND_TIMES as i32 * 10));
        t.on_send(s(SEND_TIMES as i32 * 10 + 100), ms(2000));
        assert_eq!(t.time_of(s(SEND_TIMES as i32 * 10 + 150)), Some(ms(2000)));
    }

    #[test]
    fn rack_keeps_the_latest_sent_delivery() {
        let mut r = Rack::default();
        r.on_delivered(ms(40), ms(10), s(500), false);
        assert_eq!(
            (r.xmit_ts, r.rtt),
            (Some(ms(10)), Duration::from_millis(30))
        );
        // An older segment delivered later changes nothing but the smallest round trip.
        r.on_delivered(ms(45), ms(20), s(100), false);
        assert_eq!(r.xmit_ts, Some(ms(20)));
        r.on_delivered(ms(46), ms(5), s(50), false);
        assert_eq!(r.xmit_ts, Some(ms(20)));
        assert_eq!(r.min_rtt, Some(Duration::from_millis(25)));
        // A retransmission acknowledged too soon was the earlier copy.
        r.on_delivered(ms(50), ms(45), s(10), true);
        assert_eq!(r.xmit_ts, Some(ms(20)));
        // Lost: sent before, a round trip and a quarter of the smallest one after.
        assert_eq!(
            r.lost_from(ms(15), s(900)),
            Some(ms(15 + 25) + Duration::from_micros(6250))
        );
        assert_eq!(
            r.lost_from(ms(20), s(99)),
            Some(ms(20 + 25) + Duration::from_micros(6250))
        );
        assert_eq!(r.lost_from(ms(20), s(100)), None);
        assert_eq!(r.lost_from(ms(21), s(0)), None);
    }
}
