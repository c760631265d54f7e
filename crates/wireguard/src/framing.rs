//! WireGuard datagrams on a byte stream (a peer with `transport = "tls"`): each datagram is a
//! 2-byte big-endian length followed by that many bytes. The WireGuard messages themselves
//! are unchanged; the stream only replaces UDP's datagram boundaries.

/// The largest datagram a frame can carry (the length field's range).
pub const MAX_DATAGRAM: usize = u16::MAX as usize;
/// Bytes in front of every datagram.
pub const LENGTH_BYTES: usize = 2;

/// The length prefix of a datagram of `len` bytes; `None` if it is too long to frame.
pub fn length_prefix(len: usize) -> Option<[u8; LENGTH_BYTES]> {
    u16::try_from(len).ok().map(u16::to_be_bytes)
}

/// Reassembles datagrams from stream bytes that arrive in pieces of any size. Holds at most
/// two frames' worth of bytes: the caller reads into `space()` only while it is not empty.
#[derive(Debug)]
pub struct Deframer {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
}

impl Default for Deframer {
    fn default() -> Self {
        Deframer::new()
    }
}

impl Deframer {
    pub fn new() -> Deframer {
        Deframer {
            buf: vec![0; 2 * (LENGTH_BYTES + MAX_DATAGRAM)].into_boxed_slice(),
            start: 0,
            end: 0,
        }
    }

    /// Where the next stream bytes go (then `filled`). Never empty while a whole frame fits
    /// behind the bytes held, which `next_datagram` guarantees once it returns `None`.
    pub fn space(&mut self) -> &mut [u8] {
        if self.buf.len() - self.end < LENGTH_BYTES + MAX_DATAGRAM {
            // Move the partial frame to the front to make room for a whole one after it.
            self.buf.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        &mut self.buf[self.end..]
    }

    /// Records that `n` bytes were written at the start of `space()`.
    pub fn filled(&mut self, n: usize) {
        self.end = (self.end + n).min(self.buf.len());
    }

    /// The next complete datagram, if one has arrived.
    pub fn next_datagram(&mut self) -> Option<&[u8]> {
        let held = &self.buf[self.start..self.end];
        let prefix: [u8; LENGTH_BYTES] = held.get(..LENGTH_BYTES)?.try_into().ok()?;
        let len = usize::from(u16::from_be_bytes(prefix));
        let frame = LENGTH_BYTES + len;
        if held.len() < frame {
            return None;
        }
        let at = self.start + LENGTH_BYTES;
        self.start += frame;
        if self.start == self.end {
            // Nothing partial is left: start over at the front (no copy needed later).
            self.start = 0;
            self.end = 0;
        }
        self.buf.get(at..at + len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(data: &[u8]) -> Vec<u8> {
        let mut out = length_prefix(data.len()).unwrap().to_vec();
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn datagrams_come_back_whatever_the_piece_sizes() {
        let datagrams: Vec<Vec<u8>> = (0..200)
            .map(|i| vec![i as u8; [0, 1, 32, 148, 1452, 65535][i % 6]])
            .collect();
        let stream: Vec<u8> = datagrams.iter().flat_map(|d| frame(d)).collect();
        for piece in [1, 2, 3, 1000, 4096, 70_000, stream.len()] {
            let mut d = Deframer::new();
            let mut got = Vec::new();
            let mut at = 0;
            while at < stream.len() {
                let space = d.space();
                assert!(!space.is_empty());
                let n = piece.min(space.len()).min(stream.len() - at);
                space[..n].copy_from_slice(&stream[at..at + n]);
                d.filled(n);
                at += n;
                while let Some(dg) = d.next_datagram() {
                    got.push(dg.to_vec());
                }
            }
            assert_eq!(got, datagrams, "pieces of {piece}");
        }
    }

    #[test]
    fn too_long_datagrams_cannot_be_framed() {
        assert_eq!(length_prefix(65535), Some([0xff, 0xff]));
        assert_eq!(length_prefix(65536), None);
    }
}
