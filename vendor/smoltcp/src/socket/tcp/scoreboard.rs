//! The sender's SACK scoreboard (RFC 6675 section 3): which octets above the cumulative
//! acknowledgement the remote has reported holding, from the SACK blocks of its ACKs.
//!
//! The scoreboard only ever holds what the remote said; what is lost and what may be sent
//! next is decided by the socket from it.

use crate::wire::TcpSeqNumber;

/// How many disjoint SACKed ranges are remembered. A remote reports at most 3 or 4 per ACK,
/// but keeps many more; each hole between two ranges costs one entry. When full, the highest
/// range is forgotten: the lowest ones tell where the holes that block the cumulative ACK are.
pub(super) const SCOREBOARD_RANGES: usize = 32;

#[derive(Debug, Clone, Copy)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub(super) struct Scoreboard {
    /// Sorted, disjoint and not adjacent: `ranges[i].1 < ranges[i + 1].0`. Each is
    /// `[left, right)`.
    ranges: [(TcpSeqNumber, TcpSeqNumber); SCOREBOARD_RANGES],
    len: usize,
}

impl Default for Scoreboard {
    fn default() -> Self {
        Self::new()
    }
}

impl Scoreboard {
    pub(super) const fn new() -> Self {
        Scoreboard {
            ranges: [(TcpSeqNumber(0), TcpSeqNumber(0)); SCOREBOARD_RANGES],
            len: 0,
        }
    }

    pub(super) fn clear(&mut self) {
        self.len = 0;
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub(super) fn ranges(&self) -> &[(TcpSeqNumber, TcpSeqNumber)] {
        &self.ranges[..self.len]
    }

    /// Records `[left, right)` as SACKed. The caller has checked that it is not empty and
    /// lies within what was sent and not yet cumulatively acknowledged. Returns whether the
    /// scoreboard learned something (octets not SACKed before).
    pub(super) fn insert(&mut self, left: TcpSeqNumber, right: TcpSeqNumber) -> bool {
        if left >= right {
            return false;
        }
        // The first range that ends at or after `left` (can merge or follows).
        let mut first = 0;
        while first < self.len && self.ranges[first].1 < left {
            first += 1;
        }
        // The ranges from `first` up to `last` (exclusive) overlap or touch the new one.
        let mut last = first;
        while last < self.len && self.ranges[last].0 <= right {
            last += 1;
        }
        if last > first {
            let (lo, hi) = (self.ranges[first].0, self.ranges[last - 1].1);
            if lo <= left && hi >= right && last - first == 1 {
                return false; // already known
            }
            let merged = (lo.min(left), hi.max(right));
            self.ranges[first] = merged;
            // Close the gap left by the ranges merged into `first`.
            let removed = last - first - 1;
            self.ranges.copy_within(last..self.len, first + 1);
            self.len -= removed;
            return true;
        }
        // A new range at `first`. When full, the highest range makes room (or the new one is
        // dropped if it would be the highest).
        if self.len == SCOREBOARD_RANGES {
            if first == SCOREBOARD_RANGES {
                return false;
            }
            self.len -= 1;
        }
        self.ranges.copy_within(first..self.len, first + 1);
        self.ranges[first] = (left, right);
        self.len += 1;
        true
    }

    /// Forgets everything below `una`, the new cumulative acknowledgement.
    pub(super) fn advance(&mut self, una: TcpSeqNumber) {
        let mut gone = 0;
        while gone < self.len && self.ranges[gone].1 <= una {
            gone += 1;
        }
        self.ranges.copy_within(gone..self.len, 0);
        self.len -= gone;
        if self.len > 0 && self.ranges[0].0 < una {
            self.ranges[0].0 = una;
        }
    }

    /// The end of the highest SACKed range.
    pub(super) fn highest(&self) -> Option<TcpSeqNumber> {
        self.ranges().last().map(|r| r.1)
    }

    /// Octets SACKed at or above `seq`, and in how many ranges.
    pub(super) fn sacked_above(&self, seq: TcpSeqNumber) -> (usize, usize) {
        let mut octets = 0;
        let mut count = 0;
        for &(left, right) in self.ranges() {
            if right > seq {
                octets += right - left.max(seq);
                count += 1;
            }
        }
        (octets, count)
    }

    /// Octets SACKed in `[from, to)`.
    pub(super) fn sacked_between(&self, from: TcpSeqNumber, to: TcpSeqNumber) -> usize {
        let mut octets = 0;
        for &(left, right) in self.ranges() {
            let (l, r) = (left.max(from), right.min(to));
            if l < r {
                octets += r - l;
            }
        }
        octets
    }

    /// If `seq` lies in a SACKed range, that range's end.
    pub(super) fn covering(&self, seq: TcpSeqNumber) -> Option<TcpSeqNumber> {
        self.ranges()
            .iter()
            .find(|&&(left, right)| left <= seq && seq < right)
            .map(|r| r.1)
    }

    /// The start of the first SACKed range above `seq`.
    pub(super) fn next_above(&self, seq: TcpSeqNumber) -> Option<TcpSeqNumber> {
        self.ranges()
            .iter()
            .find(|&&(left, _)| left > seq)
            .map(|r| r.0)
    }

    /// The holes: what was not SACKed between `una` and the highest SACKed octet, in order.
    pub(super) fn holes(
        &self,
        una: TcpSeqNumber,
    ) -> impl Iterator<Item = (TcpSeqNumber, TcpSeqNumber)> + '_ {
        let mut prev = una;
        self.ranges().iter().filter_map(move |&(left, right)| {
            let hole = (prev < left).then_some((prev, left));
            prev = prev.max(right);
            hole
        })
    }
}

#[cfg(test)]
mod test {
    use super::*;

    fn s(n: i32) -> TcpSeqNumber {
        TcpSeqNumber(n)
    }

    fn ranges(board: &Scoreboard) -> Vec<(i32, i32)> {
        board.ranges().iter().map(|r| (r.0.0, r.1.0)).collect()
    }

    #[test]
    fn insert_merges_and_keeps_order() {
        let mut b = Scoreboard::new();
        assert!(b.insert(s(300), s(400)));
        assert!(b.insert(s(100), s(200)));
        assert!(b.insert(s(500), s(600)));
        assert_eq!(ranges(&b), vec![(100, 200), (300, 400), (500, 600)]);
        assert!(!b.insert(s(320), s(380)), "inside a known range");
        assert!(
            b.insert(s(200), s(300)),
            "touching both neighbours merges them"
        );
        assert_eq!(ranges(&b), vec![(100, 400), (500, 600)]);
        assert!(b.insert(s(50), s(700)));
        assert_eq!(ranges(&b), vec![(50, 700)]);
        assert!(!b.insert(s(10), s(10)), "empty range");
    }

    #[test]
    fn advance_forgets_acknowledged() {
        let mut b = Scoreboard::new();
        b.insert(s(100), s(200));
        b.insert(s(300), s(400));
        b.advance(s(150));
        assert_eq!(ranges(&b), vec![(150, 200), (300, 400)]);
        b.advance(s(250));
        assert_eq!(ranges(&b), vec![(300, 400)]);
        b.advance(s(400));
        assert!(b.is_empty());
    }

    #[test]
    fn holes_and_counts() {
        let mut b = Scoreboard::new();
        b.insert(s(200), s(300));
        b.insert(s(400), s(600));
        assert_eq!(
            b.holes(s(100)).map(|h| (h.0.0, h.1.0)).collect::<Vec<_>>(),
            vec![(100, 200), (300, 400)]
        );
        assert_eq!(b.sacked_above(s(100)), (300, 2));
        assert_eq!(b.sacked_above(s(450)), (150, 1));
        assert_eq!(b.sacked_between(s(250), s(500)), 150);
        assert_eq!(b.covering(s(250)).map(|x| x.0), Some(300));
        assert_eq!(b.covering(s(300)), None);
        assert_eq!(b.next_above(s(300)).map(|x| x.0), Some(400));
        assert_eq!(b.highest().map(|x| x.0), Some(600));
    }

    #[test]
    fn full_scoreboard_drops_the_highest() {
        let mut b = Scoreboard::new();
        for i in 0..SCOREBOARD_RANGES as i32 {
            assert!(b.insert(s(1000 + i * 100), s(1050 + i * 100)));
        }
        let top = b.highest().unwrap();
        assert!(
            !b.insert(s(top.0 + 100), s(top.0 + 150)),
            "would be the highest"
        );
        assert!(b.insert(s(0), s(50)), "a lower range evicts the highest");
        assert_eq!(b.ranges().len(), SCOREBOARD_RANGES);
        assert_eq!(b.ranges()[0].0.0, 0);
        assert!(b.highest().unwrap() < top);
    }

    #[test]
    fn wraps_around_sequence_space() {
        let mut b = Scoreboard::new();
        b.insert(s(i32::MAX - 50), s(i32::MAX));
        b.insert(s(i32::MIN + 10), s(i32::MIN + 60));
        assert_eq!(b.ranges().len(), 2);
        assert_eq!(b.sacked_above(s(i32::MAX - 100)), (100, 2));
        b.advance(s(i32::MIN + 20));
        assert_eq!(ranges(&b), vec![(i32::MIN + 20, i32::MIN + 60)]);
    }
}
