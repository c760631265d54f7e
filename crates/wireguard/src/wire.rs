//! WireGuard's four messages as they cross the network, in one place: the layout of every
//! field, and [`parse`], which turns a datagram into a typed [`Message`] or says why it is
//! not one. The rest of the core (the device, the handshake, cookies, sessions) takes these
//! types, never raw bytes, so each field is cut here once; the kernel's steering program,
//! which cannot call `parse`, reads the receiver index where [`receiver_offset`] says.
//!
//! The views borrow the datagram: parsing copies nothing, and a data message's sealed body
//! is opened straight from the receive buffer.

use crate::stats::DropReason;

pub const MSG_INITIATION: u8 = 1;
pub const MSG_RESPONSE: u8 = 2;
pub const MSG_COOKIE_REPLY: u8 = 3;
pub const MSG_DATA: u8 = 4;

/// Handshake initiation: type, reserved, sender, ephemeral, static, timestamp, mac1, mac2.
pub const INITIATION_LEN: usize = 148;
/// Handshake response: type, reserved, sender, receiver, ephemeral, empty, mac1, mac2.
pub const RESPONSE_LEN: usize = 92;
/// Cookie reply: type, reserved, receiver, nonce, cookie.
pub const COOKIE_REPLY_LEN: usize = 64;
/// Data message header: type, reserved, receiver, counter; the sealed packet follows.
pub const DATA_HEADER_LEN: usize = 16;
/// The AEAD tag every sealed field ends with.
pub const TAG_LEN: usize = 16;
/// The shortest data message: a header and the tag of an empty packet (a keepalive).
pub const DATA_MIN_LEN: usize = DATA_HEADER_LEN + TAG_LEN;
/// mac1 and mac2, which end both handshake messages.
pub const MACS_LEN: usize = 32;

/// Field offsets of the initiation (each field runs to the next one).
pub mod initiation {
    pub const SENDER: usize = 4;
    pub const EPHEMERAL: usize = 8;
    pub const STATIC: usize = 40;
    pub const TIMESTAMP: usize = 88;
    pub const MAC1: usize = 116;
    pub const MAC2: usize = 132;
}

/// Field offsets of the response.
pub mod response {
    pub const SENDER: usize = 4;
    pub const RECEIVER: usize = 8;
    pub const EPHEMERAL: usize = 12;
    pub const EMPTY: usize = 44;
    pub const MAC1: usize = 60;
    pub const MAC2: usize = 76;
}

/// Field offsets of the cookie reply.
pub mod cookie_reply {
    pub const RECEIVER: usize = 4;
    pub const NONCE: usize = 8;
    pub const COOKIE: usize = 32;
}

/// Field offsets of the data message.
pub mod data {
    pub const RECEIVER: usize = 4;
    pub const COUNTER: usize = 8;
}

/// Where the receiver index (little-endian, 4 bytes) sits in a message of type `kind`, for
/// the messages that name a session of ours (a response, a cookie reply, a data message);
/// `None` for an initiation or an unknown type. For code that cannot call [`parse`]: the
/// kernel's steering program reads the index there.
pub fn receiver_offset(kind: u8) -> Option<usize> {
    match kind {
        MSG_RESPONSE => Some(response::RECEIVER),
        MSG_COOKIE_REPLY => Some(cookie_reply::RECEIVER),
        MSG_DATA => Some(data::RECEIVER),
        _ => None,
    }
}

/// Why a datagram is not a WireGuard message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("shorter than a message header")]
    TooShort,
    #[error("reserved header bytes are not zero")]
    ReservedNotZero,
    #[error("unknown message type {0}")]
    UnknownType(u8),
    #[error("message type {found} where type {expected} was expected")]
    WrongType { expected: u8, found: u8 },
    #[error("a message of type {kind} cannot be {len} bytes long")]
    WrongLength { kind: u8, len: usize },
}

impl From<ParseError> for DropReason {
    fn from(_: ParseError) -> Self {
        DropReason::Malformed
    }
}

/// A datagram from the network, parsed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Message<'a> {
    Initiation(Initiation<'a>),
    Response(Response<'a>),
    CookieReply(CookieReply<'a>),
    Data(Data<'a>),
}

/// Parses a datagram: its header (type, three zero bytes) and the length its type has.
/// Nothing is decrypted or authenticated here.
#[inline]
pub fn parse(datagram: &[u8]) -> Result<Message<'_>, ParseError> {
    match header(datagram)? {
        MSG_INITIATION => Initiation::parse(datagram).map(Message::Initiation),
        MSG_RESPONSE => Response::parse(datagram).map(Message::Response),
        MSG_COOKIE_REPLY => CookieReply::parse(datagram).map(Message::CookieReply),
        MSG_DATA => Data::parse(datagram).map(Message::Data),
        other => Err(ParseError::UnknownType(other)),
    }
}

impl<'a> Message<'a> {
    /// The receiver index: which of our sessions (or handshakes) the message is for. An
    /// initiation names none.
    pub fn receiver(&self) -> Option<u32> {
        match self {
            Message::Initiation(_) => None,
            Message::Response(r) => Some(r.receiver()),
            Message::CookieReply(c) => Some(c.receiver()),
            Message::Data(d) => Some(d.receiver()),
        }
    }

    /// Its length on the wire.
    pub fn len(&self) -> usize {
        match self {
            Message::Initiation(_) => INITIATION_LEN,
            Message::Response(_) => RESPONSE_LEN,
            Message::CookieReply(_) => COOKIE_REPLY_LEN,
            Message::Data(d) => d.len(),
        }
    }

    /// Never: every message has a header. (Clippy asks for it beside `len`.)
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Writes the message from its fields into `out`: its length, or `None` when `out` is
    /// too short. Parsing what it writes gives the message back.
    pub fn write(&self, out: &mut [u8]) -> Option<usize> {
        let out = out.get_mut(..self.len())?;
        match self {
            Message::Initiation(m) => {
                use initiation::*;
                write_header(MSG_INITIATION, out);
                out[SENDER..EPHEMERAL].copy_from_slice(&m.sender().to_le_bytes());
                out[EPHEMERAL..STATIC].copy_from_slice(m.ephemeral());
                out[STATIC..TIMESTAMP].copy_from_slice(m.encrypted_static());
                out[TIMESTAMP..MAC1].copy_from_slice(m.encrypted_timestamp());
                out[MAC1..MAC2].copy_from_slice(m.mac1());
                out[MAC2..].copy_from_slice(m.mac2());
            }
            Message::Response(m) => {
                use response::*;
                write_header(MSG_RESPONSE, out);
                out[SENDER..RECEIVER].copy_from_slice(&m.sender().to_le_bytes());
                out[RECEIVER..EPHEMERAL].copy_from_slice(&m.receiver().to_le_bytes());
                out[EPHEMERAL..EMPTY].copy_from_slice(m.ephemeral());
                out[EMPTY..MAC1].copy_from_slice(m.encrypted_empty());
                out[MAC1..MAC2].copy_from_slice(m.mac1());
                out[MAC2..].copy_from_slice(m.mac2());
            }
            Message::CookieReply(m) => {
                use cookie_reply::*;
                write_header(MSG_COOKIE_REPLY, out);
                out[RECEIVER..NONCE].copy_from_slice(&m.receiver().to_le_bytes());
                out[NONCE..COOKIE].copy_from_slice(m.nonce());
                out[COOKIE..].copy_from_slice(m.encrypted_cookie());
            }
            Message::Data(m) => {
                let (header, body) = out.split_at_mut(DATA_HEADER_LEN);
                let header: &mut [u8; DATA_HEADER_LEN] = header.try_into().ok()?;
                write_data_header(m.receiver(), m.counter(), header);
                body.copy_from_slice(m.sealed());
            }
        }
        Some(self.len())
    }
}

/// Writes a message header: the type and three zero bytes. `out` is at least 4 bytes long
/// (every caller's buffer is a whole message).
#[inline]
pub(crate) fn write_header(kind: u8, out: &mut [u8]) {
    if let Some(head) = out.get_mut(..4) {
        head.copy_from_slice(&[kind, 0, 0, 0]);
    }
}

/// Writes a data message's header.
#[inline]
pub fn write_data_header(receiver: u32, counter: u64, out: &mut [u8; DATA_HEADER_LEN]) {
    write_header(MSG_DATA, out);
    out[data::RECEIVER..data::COUNTER].copy_from_slice(&receiver.to_le_bytes());
    out[data::COUNTER..].copy_from_slice(&counter.to_le_bytes());
}

/// The type of a message whose header is well formed.
#[inline]
fn header(datagram: &[u8]) -> Result<u8, ParseError> {
    match datagram {
        [kind, 0, 0, 0, ..] => Ok(*kind),
        [_, _, _, _, ..] => Err(ParseError::ReservedNotZero),
        _ => Err(ParseError::TooShort),
    }
}

/// `datagram` as a message of type `kind` and fixed length `N`.
fn fixed<const N: usize>(datagram: &[u8], kind: u8) -> Result<&[u8; N], ParseError> {
    let found = header(datagram)?;
    if found != kind {
        return Err(ParseError::WrongType {
            expected: kind,
            found,
        });
    }
    datagram.try_into().map_err(|_| ParseError::WrongLength {
        kind,
        len: datagram.len(),
    })
}

/// The `N` bytes at `at` of a message already checked to be long enough.
#[inline]
fn field<const N: usize>(bytes: &[u8], at: usize) -> &[u8; N] {
    // The offsets are constants inside the checked length (`layouts_tile_each_message`
    // tests every one), so this never falls back; the fallback keeps panics out.
    bytes
        .get(at..)
        .and_then(<[u8]>::first_chunk::<N>)
        .unwrap_or(&[0; N])
}

fn index(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(*field::<4>(bytes, at))
}

/// A handshake initiation (not yet authenticated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Initiation<'a> {
    bytes: &'a [u8; INITIATION_LEN],
}

impl<'a> Initiation<'a> {
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        fixed(datagram, MSG_INITIATION).map(|bytes| Self { bytes })
    }
    pub fn as_bytes(&self) -> &'a [u8; INITIATION_LEN] {
        self.bytes
    }
    /// The initiator's index: the response and our data messages name it.
    pub fn sender(&self) -> u32 {
        index(self.bytes, initiation::SENDER)
    }
    pub fn ephemeral(&self) -> &'a [u8; 32] {
        field(self.bytes, initiation::EPHEMERAL)
    }
    /// The initiator's static public key, sealed.
    pub fn encrypted_static(&self) -> &'a [u8; 32 + TAG_LEN] {
        field(self.bytes, initiation::STATIC)
    }
    /// Its TAI64N timestamp, sealed.
    pub fn encrypted_timestamp(&self) -> &'a [u8; 12 + TAG_LEN] {
        field(self.bytes, initiation::TIMESTAMP)
    }
    pub fn mac1(&self) -> &'a [u8; 16] {
        field(self.bytes, initiation::MAC1)
    }
    pub fn mac2(&self) -> &'a [u8; 16] {
        field(self.bytes, initiation::MAC2)
    }
}

/// A handshake response (not yet authenticated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Response<'a> {
    bytes: &'a [u8; RESPONSE_LEN],
}

impl<'a> Response<'a> {
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        fixed(datagram, MSG_RESPONSE).map(|bytes| Self { bytes })
    }
    pub fn as_bytes(&self) -> &'a [u8; RESPONSE_LEN] {
        self.bytes
    }
    /// The responder's index: our data messages name it.
    pub fn sender(&self) -> u32 {
        index(self.bytes, response::SENDER)
    }
    /// Our index, from the initiation this answers.
    pub fn receiver(&self) -> u32 {
        index(self.bytes, response::RECEIVER)
    }
    pub fn ephemeral(&self) -> &'a [u8; 32] {
        field(self.bytes, response::EPHEMERAL)
    }
    /// The empty payload's tag.
    pub fn encrypted_empty(&self) -> &'a [u8; TAG_LEN] {
        field(self.bytes, response::EMPTY)
    }
    pub fn mac1(&self) -> &'a [u8; 16] {
        field(self.bytes, response::MAC1)
    }
    pub fn mac2(&self) -> &'a [u8; 16] {
        field(self.bytes, response::MAC2)
    }
}

/// A cookie reply (not yet authenticated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CookieReply<'a> {
    bytes: &'a [u8; COOKIE_REPLY_LEN],
}

impl<'a> CookieReply<'a> {
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        fixed(datagram, MSG_COOKIE_REPLY).map(|bytes| Self { bytes })
    }
    /// The sender index of the handshake message it answers.
    pub fn receiver(&self) -> u32 {
        index(self.bytes, cookie_reply::RECEIVER)
    }
    pub fn nonce(&self) -> &'a [u8; 24] {
        field(self.bytes, cookie_reply::NONCE)
    }
    /// The cookie and its tag.
    pub fn encrypted_cookie(&self) -> &'a [u8; 16 + TAG_LEN] {
        field(self.bytes, cookie_reply::COOKIE)
    }
}

/// A data message: its header's fields and the sealed packet, borrowed (not yet
/// authenticated).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Data<'a> {
    receiver: u32,
    counter: u64,
    sealed: &'a [u8],
}

impl<'a> Data<'a> {
    #[inline]
    pub fn parse(datagram: &'a [u8]) -> Result<Self, ParseError> {
        let found = header(datagram)?;
        if found != MSG_DATA {
            return Err(ParseError::WrongType {
                expected: MSG_DATA,
                found,
            });
        }
        let wrong_length = ParseError::WrongLength {
            kind: MSG_DATA,
            len: datagram.len(),
        };
        if datagram.len() < DATA_MIN_LEN {
            return Err(wrong_length);
        }
        let (header, sealed) = datagram.split_at(DATA_HEADER_LEN);
        Ok(Self {
            receiver: index(header, data::RECEIVER),
            counter: u64::from_le_bytes(*field::<8>(header, data::COUNTER)),
            sealed,
        })
    }
    /// Our index: the session it was sealed for.
    pub fn receiver(&self) -> u32 {
        self.receiver
    }
    /// The sender's message counter: the nonce, and the replay window's input.
    pub fn counter(&self) -> u64 {
        self.counter
    }
    /// The sealed packet and its tag (at least the tag).
    pub fn sealed(&self) -> &'a [u8] {
        self.sealed
    }
    pub fn len(&self) -> usize {
        DATA_HEADER_LEN + self.sealed.len()
    }
    /// Never: a data message holds at least a header and a tag.
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A handshake message, the two that carry macs and may be answered with a cookie reply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Handshake<'a> {
    Initiation(Initiation<'a>),
    Response(Response<'a>),
}

impl<'a> Handshake<'a> {
    pub fn as_bytes(&self) -> &'a [u8] {
        match self {
            Handshake::Initiation(m) => m.as_bytes(),
            Handshake::Response(m) => m.as_bytes(),
        }
    }
    /// The sender's index: a cookie reply names it.
    pub fn sender(&self) -> u32 {
        match self {
            Handshake::Initiation(m) => m.sender(),
            Handshake::Response(m) => m.sender(),
        }
    }
    pub fn mac1(&self) -> &'a [u8; 16] {
        match self {
            Handshake::Initiation(m) => m.mac1(),
            Handshake::Response(m) => m.mac1(),
        }
    }
    pub fn mac2(&self) -> &'a [u8; 16] {
        match self {
            Handshake::Initiation(m) => m.mac2(),
            Handshake::Response(m) => m.mac2(),
        }
    }
    /// What mac1 is computed over: the message up to mac1.
    pub fn before_mac1(&self) -> &'a [u8] {
        let bytes = self.as_bytes();
        &bytes[..bytes.len() - MACS_LEN]
    }
    /// What mac2 is computed over: the message up to mac2.
    pub fn before_mac2(&self) -> &'a [u8] {
        let bytes = self.as_bytes();
        &bytes[..bytes.len() - MACS_LEN / 2]
    }
}

impl<'a> From<Initiation<'a>> for Handshake<'a> {
    fn from(m: Initiation<'a>) -> Self {
        Handshake::Initiation(m)
    }
}

impl<'a> From<Response<'a>> for Handshake<'a> {
    fn from(m: Response<'a>) -> Self {
        Handshake::Response(m)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each layout's fields follow one another from the header to the message's end, so
    /// `field` never reads past a checked length.
    #[test]
    fn layouts_tile_each_message() {
        use initiation as i;
        let init = [
            0,
            i::SENDER,
            i::EPHEMERAL,
            i::STATIC,
            i::TIMESTAMP,
            i::MAC1,
            i::MAC2,
        ];
        let init_sizes = [4, 4, 32, 48, 28, 16, 16];
        use response as r;
        let resp = [
            0,
            r::SENDER,
            r::RECEIVER,
            r::EPHEMERAL,
            r::EMPTY,
            r::MAC1,
            r::MAC2,
        ];
        let resp_sizes = [4, 4, 4, 32, 16, 16, 16];
        use cookie_reply as c;
        let cookie = [0, c::RECEIVER, c::NONCE, c::COOKIE];
        let cookie_sizes = [4, 4, 24, 32];
        let data = [0, data::RECEIVER, data::COUNTER];
        let data_sizes = [4, 4, 8];
        for (starts, sizes, len) in [
            (&init[..], &init_sizes[..], INITIATION_LEN),
            (&resp[..], &resp_sizes[..], RESPONSE_LEN),
            (&cookie[..], &cookie_sizes[..], COOKIE_REPLY_LEN),
            (&data[..], &data_sizes[..], DATA_HEADER_LEN),
        ] {
            // The header (4 bytes) first; each field ends where the next starts.
            for (k, w) in starts.windows(2).enumerate() {
                assert_eq!(w[0] + sizes[k], w[1], "{starts:?}");
            }
            assert_eq!(starts[starts.len() - 1] + sizes[sizes.len() - 1], len);
        }
        assert_eq!(INITIATION_LEN - MACS_LEN, initiation::MAC1);
        assert_eq!(RESPONSE_LEN - MACS_LEN, response::MAC1);
    }

    fn message(kind: u8, len: usize) -> Vec<u8> {
        let mut m: Vec<u8> = (0..len).map(|i| (i * 7 + 3) as u8).collect();
        if len >= 4 {
            m[..4].copy_from_slice(&[kind, 0, 0, 0]);
        }
        m
    }

    #[test]
    fn each_type_parses_at_its_length_and_names_its_fields() {
        let m = message(MSG_INITIATION, INITIATION_LEN);
        let Ok(Message::Initiation(i)) = parse(&m) else {
            panic!("{:?}", parse(&m))
        };
        assert_eq!(i.sender(), u32::from_le_bytes([m[4], m[5], m[6], m[7]]));
        assert_eq!(&i.ephemeral()[..], &m[8..40]);
        assert_eq!(&i.mac2()[..], &m[132..]);

        let mut m = message(MSG_RESPONSE, RESPONSE_LEN);
        m[8..12].copy_from_slice(&0x0102_0304u32.to_le_bytes());
        let Ok(Message::Response(r)) = parse(&m) else {
            panic!("{:?}", parse(&m))
        };
        assert_eq!(r.receiver(), 0x0102_0304);
        assert_eq!(parse(&m).map(|m| m.receiver()), Ok(Some(0x0102_0304)));
        assert_eq!(&r.encrypted_empty()[..], &m[44..60]);

        let m = message(MSG_COOKIE_REPLY, COOKIE_REPLY_LEN);
        let Ok(Message::CookieReply(c)) = parse(&m) else {
            panic!("{:?}", parse(&m))
        };
        assert_eq!(&c.nonce()[..], &m[8..32]);
        assert_eq!(&c.encrypted_cookie()[..], &m[32..]);

        for len in [DATA_MIN_LEN, 100, 1452] {
            let mut m = message(MSG_DATA, len);
            m[8..16].copy_from_slice(&0xdead_beef_0000_0001u64.to_le_bytes());
            let Ok(Message::Data(d)) = parse(&m) else {
                panic!("{:?}", parse(&m))
            };
            assert_eq!(d.counter(), 0xdead_beef_0000_0001);
            assert_eq!(d.sealed(), &m[16..]);
            assert_eq!(d.len(), len);
            // Zero-copy: the body is the datagram's own bytes.
            assert!(std::ptr::eq(d.sealed().as_ptr(), m[16..].as_ptr()));
        }
    }

    #[test]
    fn what_does_not_parse_says_why() {
        assert_eq!(parse(&[]), Err(ParseError::TooShort));
        assert_eq!(parse(&[4, 0, 0]), Err(ParseError::TooShort));
        assert_eq!(parse(&[4, 0, 1, 0]), Err(ParseError::ReservedNotZero));
        assert_eq!(parse(&[0, 0, 0, 0]), Err(ParseError::UnknownType(0)));
        assert_eq!(parse(&[5, 0, 0, 0]), Err(ParseError::UnknownType(5)));
        for (kind, len) in [
            (MSG_INITIATION, INITIATION_LEN),
            (MSG_RESPONSE, RESPONSE_LEN),
            (MSG_COOKIE_REPLY, COOKIE_REPLY_LEN),
        ] {
            for n in [4, len - 1, len + 1] {
                assert_eq!(
                    parse(&message(kind, n)),
                    Err(ParseError::WrongLength { kind, len: n })
                );
            }
        }
        assert_eq!(
            parse(&message(MSG_DATA, DATA_MIN_LEN - 1)),
            Err(ParseError::WrongLength {
                kind: MSG_DATA,
                len: DATA_MIN_LEN - 1
            })
        );
        // The per-type parsers refuse another type's message of their length.
        let init = message(MSG_INITIATION, INITIATION_LEN);
        assert_eq!(
            Response::parse(&init[..RESPONSE_LEN]),
            Err(ParseError::WrongType {
                expected: MSG_RESPONSE,
                found: MSG_INITIATION
            })
        );
        assert_eq!(
            DropReason::from(ParseError::TooShort),
            DropReason::Malformed
        );
    }

    #[test]
    fn receiver_offsets_agree_with_the_parser() {
        for (kind, len) in [
            (MSG_RESPONSE, RESPONSE_LEN),
            (MSG_COOKIE_REPLY, COOKIE_REPLY_LEN),
            (MSG_DATA, 40),
        ] {
            let mut m = message(kind, len);
            let at = receiver_offset(kind).unwrap();
            m[at..at + 4].copy_from_slice(&0x0a0b_0c0du32.to_le_bytes());
            assert_eq!(parse(&m).unwrap().receiver(), Some(0x0a0b_0c0d));
        }
        assert_eq!(receiver_offset(MSG_INITIATION), None);
        assert_eq!(receiver_offset(0), None);
    }

    /// Every input: no panic, and what parses writes back as the same bytes.
    #[test]
    fn every_input_parses_or_is_refused_and_round_trips() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut parsed = [0usize; 5];
        for round in 0..20_000 {
            let len = match round % 4 {
                0 => [INITIATION_LEN, RESPONSE_LEN, COOKIE_REPLY_LEN, DATA_MIN_LEN][round / 4 % 4],
                _ => (next() % 200) as usize,
            };
            let mut m: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            if len >= 4 && round % 3 != 0 {
                m[0] = (next() % 6) as u8;
                m[1..4].fill(0);
            }
            check_round_trip(&m);
            // Counts what parsed by type (0: refused), to show every kind was reached.
            match parse(&m) {
                Ok(_) => parsed[usize::from(m[0])] += 1,
                Err(_) => parsed[0] += 1,
            }
        }
        assert!(parsed.iter().all(|&n| n > 0), "{parsed:?}");
    }

    fn check_round_trip(m: &[u8]) {
        if let Ok(msg) = parse(m) {
            let mut out = vec![0u8; m.len() + 8];
            assert_eq!(msg.write(&mut out), Some(m.len()));
            assert_eq!(&out[..m.len()], m);
            assert_eq!(msg.len(), m.len());
            assert_eq!(msg.write(&mut out[..m.len() - 1]), None);
        }
    }
}
