//! One WireGuard session: the two transport keys a handshake derived, the send counter and
//! the receive side's replay window. Data messages are sealed and opened here.

use super::replay::{ReplayWindow, REJECT_AFTER_MESSAGES};
use crate::stats::DropReason;
use crate::wire::{self, Data, DATA_HEADER_LEN};
use std::time::Instant;
use tunneld_crypto::aead::{TransportKey, TAG_LEN};

#[derive(Debug)]
pub struct Session {
    /// Our index: data messages to us name it.
    pub local_index: u32,
    /// The peer's index, written into every data message we send.
    pub peer_index: u32,
    sending: TransportKey,
    receiving: TransportKey,
    next_counter: u64,
    replay: ReplayWindow,
    /// When the handshake that made it finished.
    pub born: Instant,
    /// Whether we sent the initiation: only the initiator rekeys by age.
    pub initiator: bool,
}

impl Session {
    pub fn new(
        local_index: u32,
        peer_index: u32,
        sending: &[u8; 32],
        receiving: &[u8; 32],
        born: Instant,
        initiator: bool,
    ) -> Self {
        Self {
            local_index,
            peer_index,
            sending: TransportKey::new(sending),
            receiving: TransportKey::new(receiving),
            next_counter: 0,
            replay: ReplayWindow::default(),
            born,
            initiator,
        }
    }

    /// Messages sent so far.
    pub fn sent(&self) -> u64 {
        self.next_counter
    }

    /// Writes `packet` (already padded) as a data message into `out`, which must hold
    /// `packet.len() + 32` bytes. `None` when the counter is used up (the session must end)
    /// or `out` is too small.
    pub fn seal(&mut self, packet: &[u8], out: &mut [u8]) -> Option<usize> {
        let len = DATA_HEADER_LEN + packet.len() + TAG_LEN;
        if self.next_counter >= REJECT_AFTER_MESSAGES {
            return None;
        }
        let (header, sealed) = out.get_mut(..len)?.split_first_chunk_mut()?;
        let counter = self.next_counter;
        self.next_counter += 1;
        wire::write_data_header(self.peer_index, counter, header);
        let (body, tag) = sealed.split_at_mut(packet.len());
        tag.copy_from_slice(&self.sending.seal_into(counter, packet, body));
        Some(len)
    }

    /// Opens data message `data` (addressed to this session) into `out`: the plaintext's
    /// length, or why it was dropped. Nothing changes unless it authenticates.
    pub fn open(&mut self, data: Data<'_>, out: &mut [u8]) -> Result<usize, DropReason> {
        let counter = data.counter();
        if !self.replay.fresh(counter) {
            return Err(DropReason::Replay);
        }
        let sealed = data.sealed();
        let Some(buf) = out.get_mut(..sealed.len()) else {
            return Err(DropReason::Other);
        };
        let len = self
            .receiving
            .open_into(counter, sealed, buf)
            .map_err(|_| DropReason::DecryptFailed)?;
        self.replay.accept(counter);
        Ok(len)
    }
}
