//! The receive side's defence against replayed data messages: a sliding bitmap of the
//! counters seen, as wide as the kernel's (8192 bits, so reordering by a few thousand
//! packets on a fast path still gets through; boringtun's 1024 dropped some under GRO).

/// Counters at or above this are never accepted: the sender must rekey well before.
pub const REJECT_AFTER_MESSAGES: u64 = u64::MAX - (1 << 13);

const WORD_BITS: u64 = 64;
const WORDS: usize = 128;
const BITS: u64 = WORDS as u64 * WORD_BITS;
/// How far behind the greatest counter seen a counter may be. One word less than the
/// bitmap, because the word holding the greatest counter is only partly in the window.
const WINDOW: u64 = BITS - WORD_BITS;

#[derive(Clone)]
pub struct ReplayWindow {
    /// Bit `c % BITS` is set when counter `c` (within the window) was accepted.
    bitmap: [u64; WORDS],
    /// The next counter above the greatest accepted (0: none accepted yet).
    next: u64,
}

impl std::fmt::Debug for ReplayWindow {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplayWindow")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl Default for ReplayWindow {
    fn default() -> Self {
        Self {
            bitmap: [0; WORDS],
            next: 0,
        }
    }
}

impl ReplayWindow {
    /// Whether `counter` may be accepted: not too old, not seen. Check before decrypting,
    /// and [`ReplayWindow::accept`] only after the message authenticated.
    pub fn fresh(&self, counter: u64) -> bool {
        if counter >= REJECT_AFTER_MESSAGES {
            return false;
        }
        if counter >= self.next {
            return true;
        }
        if self.next - 1 - counter >= WINDOW {
            return false;
        }
        let (word, bit) = Self::place(counter);
        self.bitmap[word] & bit == 0
    }

    /// Records `counter` as seen; false (and nothing recorded) if it was not fresh.
    pub fn accept(&mut self, counter: u64) -> bool {
        if !self.fresh(counter) {
            return false;
        }
        if counter >= self.next {
            // Clear the words the window slides over, at most the whole bitmap.
            let top = counter / WORD_BITS;
            let old_top = self.next.saturating_sub(1) / WORD_BITS;
            let first = if self.next == 0 { 0 } else { old_top + 1 };
            let clear = (top + 1).saturating_sub(first).min(WORDS as u64);
            for w in 0..clear {
                self.bitmap[((top - w) % WORDS as u64) as usize] = 0;
            }
            self.next = counter + 1;
        }
        let (word, bit) = Self::place(counter);
        self.bitmap[word] |= bit;
        true
    }

    fn place(counter: u64) -> (usize, u64) {
        let index = counter % BITS;
        ((index / WORD_BITS) as usize, 1 << (index % WORD_BITS))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_order_counters_are_accepted_once() {
        let mut w = ReplayWindow::default();
        for c in 0..20_000 {
            assert!(w.accept(c), "{c}");
            assert!(!w.accept(c), "{c} twice");
        }
    }

    #[test]
    fn reordering_within_the_window_is_accepted_and_duplicates_are_not() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(10_000));
        assert!(w.accept(10_000 - WINDOW + 1), "oldest in the window");
        assert!(!w.accept(10_000 - WINDOW), "just outside the window");
        assert!(w.accept(9_999));
        assert!(!w.accept(9_999));
        assert!(w.accept(3_000));
        assert!(!w.fresh(3_000));
        assert!(w.fresh(3_001));
    }

    #[test]
    fn a_jump_forward_forgets_what_the_window_slid_over() {
        let mut w = ReplayWindow::default();
        for c in 0..100 {
            assert!(w.accept(c));
        }
        // Counter c + BITS maps onto the same bit as c: it must not look seen.
        assert!(w.accept(50 + BITS));
        assert!(w.accept(51 + BITS));
        assert!(!w.accept(50 + BITS));
        assert!(!w.fresh(99), "far behind now");
        // A jump of less than the bitmap clears only the words passed over.
        let mut w = ReplayWindow::default();
        assert!(w.accept(0));
        assert!(w.accept(64 * 3 + 5));
        assert!(!w.accept(0));
        assert!(w.accept(1));
        assert!(w.accept(64 * 3 + 4));
        assert!(w.accept(64 * 5));
        assert!(!w.accept(64 * 3 + 4));
    }

    #[test]
    fn counters_near_the_limit_are_refused() {
        let mut w = ReplayWindow::default();
        assert!(w.accept(REJECT_AFTER_MESSAGES - 1));
        assert!(!w.accept(REJECT_AFTER_MESSAGES));
        assert!(!w.accept(u64::MAX));
    }

    #[test]
    fn matches_a_plain_set_on_random_counters() {
        // A reference model: every counter seen, and the greatest.
        let mut w = ReplayWindow::default();
        let mut seen = std::collections::HashSet::new();
        let mut greatest: Option<u64> = None;
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut base = 0u64;
        for _ in 0..200_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            base += x % 3;
            let c = base + x % 9000 - (x % 9000).min(base).min(4500);
            let expected = match greatest {
                _ if seen.contains(&c) => false,
                Some(g) if c < g && g - c >= WINDOW => false,
                _ => true,
            };
            assert_eq!(w.accept(c), expected, "counter {c}, greatest {greatest:?}");
            if expected {
                seen.insert(c);
                greatest = Some(greatest.map_or(c, |g| g.max(c)));
            }
        }
    }
}
