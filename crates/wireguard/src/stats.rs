//! Counters of the data path. The data path returns no errors: a packet it cannot handle is
//! dropped and counted here by reason.

use std::fmt;

macro_rules! drop_reasons {
    ($($name:ident => $text:literal,)*) => {
        /// Why a packet or datagram was dropped.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum DropReason { $($name,)* }

        impl DropReason {
            pub const ALL: &'static [DropReason] = &[$(DropReason::$name,)*];
            /// A short stable name, used in logs and metrics.
            pub fn name(self) -> &'static str {
                match self { $(DropReason::$name => $text,)* }
            }
        }
    };
}

drop_reasons! {
    NotIp => "not_ip",
    NoRoute => "no_route",
    NoEndpoint => "no_endpoint",
    NetworkBatchFull => "network_batch_full",
    TunnelBatchFull => "tunnel_batch_full",
    Malformed => "malformed",
    UnknownPeer => "unknown_peer",
    UnknownIndex => "unknown_index",
    SourceNotAllowed => "source_not_allowed",
    InvalidMac => "invalid_mac",
    HandshakeRejected => "handshake_rejected",
    DecryptFailed => "decrypt_failed",
    Replay => "replay",
    NoSession => "no_session",
    Expired => "expired",
    UnderLoad => "under_load",
    RateLimited => "rate_limited",
    NotSent => "not_sent",
    HandOffFull => "handoff_full",
    Other => "other",
}

impl fmt::Display for DropReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Counters of one worker (its device and its hand-offs).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub rx_packets: u64,
    pub rx_bytes: u64,
    pub handshakes_sent: u64,
    pub cookie_replies_sent: u64,
    /// TCP SYNs whose MSS was lowered (`clamp_mss`).
    pub mss_clamped: u64,
    /// Packets and initiations passed to / taken from other workers (see `Disposition`).
    pub handoffs_out: u64,
    pub handoffs_in: u64,
    drops: [u64; DropReason::ALL.len()],
}

impl Stats {
    #[inline]
    pub fn drop(&mut self, reason: DropReason) {
        self.drops[reason as usize] += 1;
    }

    /// Counts `n` drops at once (what the kernel did not take of a batch).
    pub fn drop_many(&mut self, reason: DropReason, n: u64) {
        self.drops[reason as usize] += n;
    }

    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops[reason as usize]
    }

    pub fn total_drops(&self) -> u64 {
        self.drops.iter().sum()
    }

    /// Non-zero drop counters, by reason.
    pub fn nonzero_drops(&self) -> impl Iterator<Item = (DropReason, u64)> + '_ {
        DropReason::ALL
            .iter()
            .map(|r| (*r, self.drops[*r as usize]))
            .filter(|(_, n)| *n > 0)
    }

    /// Adds another set of counters (for summing workers).
    pub fn add(&mut self, other: &Stats) {
        self.tx_packets += other.tx_packets;
        self.tx_bytes += other.tx_bytes;
        self.rx_packets += other.rx_packets;
        self.rx_bytes += other.rx_bytes;
        self.handshakes_sent += other.handshakes_sent;
        self.cookie_replies_sent += other.cookie_replies_sent;
        self.mss_clamped += other.mss_clamped;
        self.handoffs_out += other.handoffs_out;
        self.handoffs_in += other.handoffs_in;
        for (a, b) in self.drops.iter_mut().zip(other.drops.iter()) {
            *a += b;
        }
    }
}
