//! The bytes of netlink, each way once: [`Request`] writes a request, [`Exchange::scan`] reads
//! the replies to it, [`Attributes`] reads the attributes of one reply, and [`Failure`] says
//! why a request failed.
//!
//! Headers and attributes are read through netlink-packet-core's checked buffers
//! (`NetlinkBuffer::new_checked`, `NlasIterator`), which refuse a length that points past
//! the bytes there are; every fixed-offset field is read with `get`, so a short or lying
//! reply is an error or a `None`, never a panic.

use netlink_packet_core::{
    NetlinkBuffer, NlaBuffer, NlasIterator, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CAPPED, NLM_F_DUMP,
    NLM_F_DUMP_INTR, NLM_F_REQUEST,
};
use std::fmt;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `struct nlmsghdr`.
pub const HEADER_LEN: usize = 16;
/// Room for any request made here: a header, a family header and a few small attributes.
pub const REQUEST_MAX: usize = 128;

const NLMSG_NOOP: u16 = 1;
const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
const NLMSG_OVERRUN: u16 = 4;
/// `NLMSGERR_ATTR_MSG`: the kernel's text in an extended ACK.
const NLMSGERR_ATTR_MSG: u16 = 1;
const AF_INET: u8 = libc::AF_INET as u8;
const AF_INET6: u8 = libc::AF_INET6 as u8;

/// Netlink messages and attributes are 4-byte aligned.
pub fn align4(len: usize) -> usize {
    len.saturating_add(3) & !3
}

/// Why a netlink request failed, before the operation is named ([`Failure::named`]).
#[derive(Debug)]
pub enum Failure {
    /// The kernel answered with this errno, and with its reason in words when it gave one
    /// (an extended ACK).
    Refused { errno: i32, reason: Option<String> },
    /// A dump was cut short by a concurrent change (`NLM_F_DUMP_INTR`) every time it was
    /// asked.
    Interrupted,
    /// The socket failed, or the reply could not be read.
    Io(io::Error),
}

impl Failure {
    /// The kernel's errno, when the kernel refused.
    pub fn errno(&self) -> Option<i32> {
        match self {
            Failure::Refused { errno, .. } => Some(*errno),
            _ => None,
        }
    }

    /// One line: `{what}: {why}`, of the kind the errno maps to.
    pub fn named(self, what: &str) -> io::Error {
        let kind = self.kind();
        io::Error::new(kind, format!("{what}: {self}"))
    }

    /// As an `io::Error` without naming the operation: a bare refusal keeps its raw errno.
    pub fn into_io(self) -> io::Error {
        match self {
            Failure::Refused {
                errno,
                reason: None,
            } => io::Error::from_raw_os_error(errno),
            Failure::Io(e) => e,
            other => io::Error::new(other.kind(), other.to_string()),
        }
    }

    fn kind(&self) -> io::ErrorKind {
        match self {
            Failure::Refused { errno, .. } => io::Error::from_raw_os_error(*errno).kind(),
            Failure::Interrupted => io::ErrorKind::Interrupted,
            Failure::Io(e) => e.kind(),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Failure::Refused { errno, reason } => {
                write!(f, "{}", io::Error::from_raw_os_error(*errno))?;
                match reason {
                    Some(reason) => write!(f, ": {reason}"),
                    None => Ok(()),
                }
            }
            Failure::Interrupted => {
                write!(f, "the dump was interrupted by a concurrent change")
            }
            Failure::Io(e) => write!(f, "{e}"),
        }
    }
}

impl From<io::Error> for Failure {
    fn from(e: io::Error) -> Failure {
        Failure::Io(e)
    }
}

/// A reply that cannot be read.
pub fn malformed(what: &str) -> Failure {
    Failure::Io(io::Error::new(
        io::ErrorKind::InvalidData,
        format!("malformed reply from the kernel: {what}"),
    ))
}

/// One netlink request, built in place (no allocation): header, family header, attributes.
#[derive(Debug)]
pub struct Request {
    bytes: [u8; REQUEST_MAX],
    len: usize,
    /// Something did not fit: [`Request::finish`] refuses rather than send it cut short.
    overflow: bool,
}

/// Where a nested attribute begins ([`Request::begin_nested`]).
#[must_use]
#[derive(Debug)]
pub struct Nest(usize);

impl Request {
    /// A request of type `kind` (`NLM_F_REQUEST` and `flags`), starting with the family's
    /// header (`struct rtmsg`, `ifinfomsg`, `genlmsghdr`, ...).
    pub fn new(kind: u16, flags: u16, family_header: &[u8]) -> Request {
        let mut request = Request {
            bytes: [0; REQUEST_MAX],
            len: HEADER_LEN,
            overflow: false,
        };
        let mut header = NetlinkBuffer::new(&mut request.bytes[..]);
        header.set_message_type(kind);
        header.set_flags(NLM_F_REQUEST | flags);
        request.push(family_header);
        request
    }

    /// A question with one answer (`RTM_GET*` of one object): no ACK is asked, the answer
    /// ends it.
    pub fn get(kind: u16, family_header: &[u8]) -> Request {
        Request::new(kind, 0, family_header)
    }

    /// A dump: every object of a kind, in replies that end with `NLMSG_DONE`.
    pub fn dump(kind: u16, family_header: &[u8]) -> Request {
        Request::new(kind, NLM_F_DUMP, family_header)
    }

    /// A change (`flags` such as `NLM_F_CREATE`), answered by an ACK or a refusal.
    pub fn change(kind: u16, flags: u16, family_header: &[u8]) -> Request {
        Request::new(kind, NLM_F_ACK | flags, family_header)
    }

    /// The header's flags.
    pub fn flags(&self) -> u16 {
        NetlinkBuffer::new(&self.bytes[..]).flags()
    }

    /// Appends `bytes`, padded to 4 bytes.
    fn push(&mut self, bytes: &[u8]) {
        let end = self.len + bytes.len();
        match self.bytes.get_mut(self.len..end) {
            Some(room) if align4(end) <= REQUEST_MAX => {
                room.copy_from_slice(bytes);
                self.len = align4(end);
            }
            _ => self.overflow = true,
        }
    }

    /// Appends the attribute `kind` with `value`.
    pub fn attribute(&mut self, kind: u16, value: &[u8]) {
        self.attribute_flagged(kind, false, value);
    }

    fn attribute_flagged(&mut self, kind: u16, nested: bool, value: &[u8]) {
        let Ok(len) = u16::try_from(4 + value.len()) else {
            self.overflow = true;
            return;
        };
        if self.len + align4(usize::from(len)) > REQUEST_MAX {
            self.overflow = true;
            return;
        }
        let mut header = [0u8; 4];
        let mut nla = NlaBuffer::new(&mut header[..]);
        nla.set_length(len);
        nla.set_kind(kind);
        if nested {
            nla.set_nested_flag();
        }
        self.push(&header);
        self.push(value);
    }

    /// Starts a nested attribute `kind`; the attributes added until [`Request::end_nested`]
    /// are inside it.
    pub fn begin_nested(&mut self, kind: u16) -> Nest {
        let at = self.len;
        self.attribute_flagged(kind, true, &[]);
        Nest(at)
    }

    /// Ends a nested attribute: its length covers what was added since it began.
    pub fn end_nested(&mut self, nest: Nest) {
        let Ok(len) = u16::try_from(self.len - nest.0) else {
            self.overflow = true;
            return;
        };
        if let Some(header) = self.bytes.get_mut(nest.0..nest.0 + 4) {
            NlaBuffer::new(header).set_length(len);
        }
    }

    /// The finished message with its length and sequence number; a request that did not
    /// fit is refused, never sent cut short.
    pub fn finish(&mut self, sequence: u32) -> Result<&[u8], Failure> {
        if self.overflow {
            return Err(Failure::Io(io::Error::new(
                io::ErrorKind::InvalidInput,
                "netlink request too large",
            )));
        }
        let mut header = NetlinkBuffer::new(&mut self.bytes[..]);
        header.set_length(self.len as u32);
        header.set_sequence_number(sequence);
        Ok(&self.bytes[..self.len])
    }
}

/// What an answer is: how a request's replies end.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    /// A get: the first reply (or a refusal).
    First,
    /// A change: the ACK (or a refusal).
    Ack,
    /// A dump: every reply until `NLMSG_DONE`.
    Dump,
}

/// The replies to one request being read: which are its own, and when they end.
#[derive(Debug)]
pub struct Exchange {
    sequence: u32,
    answer: Answer,
    interrupted: bool,
}

impl Exchange {
    /// Reads the replies to the request of `sequence` sent with `flags` (a dump ends with
    /// `NLMSG_DONE`, a request with `NLM_F_ACK` with its ACK, any other with its first
    /// reply).
    pub fn new(sequence: u32, flags: u16) -> Exchange {
        let answer = if flags & NLM_F_DUMP == NLM_F_DUMP {
            Answer::Dump
        } else if flags & NLM_F_ACK != 0 {
            Answer::Ack
        } else {
            Answer::First
        };
        Exchange {
            sequence,
            answer,
            interrupted: false,
        }
    }

    /// Walks the messages of one datagram, handing each reply's type and payload to
    /// `on_reply`. `None`: not finished, read another datagram. Messages for other requests
    /// (late answers to one that failed half-way) are skipped; a dump that a concurrent
    /// change cut short ends as [`Failure::Interrupted`], for the caller to ask again.
    pub fn scan(
        &mut self,
        mut datagram: &[u8],
        on_reply: &mut impl FnMut(u16, &[u8]),
    ) -> Option<Result<(), Failure>> {
        while !datagram.is_empty() {
            let Ok(message) = NetlinkBuffer::new_checked(datagram) else {
                return Some(Err(malformed("bad message length")));
            };
            let len = message.length() as usize;
            if message.sequence_number() == self.sequence {
                let payload = message.payload();
                match message.message_type() {
                    NLMSG_ERROR => return Some(ack_result(message.flags(), payload)),
                    NLMSG_DONE => return Some(self.done_result(payload)),
                    NLMSG_OVERRUN => return Some(Err(malformed("data lost (overrun)"))),
                    NLMSG_NOOP => {}
                    kind => {
                        if message.flags() & NLM_F_DUMP_INTR != 0 {
                            self.interrupted = true;
                        }
                        on_reply(kind, payload);
                        if self.answer == Answer::First {
                            return Some(Ok(()));
                        }
                    }
                }
            }
            // The last message's padding may be missing.
            datagram = datagram.get(align4(len)..).unwrap_or(&[]);
        }
        None
    }

    /// The outcome of an NLMSG_DONE message, which ends a dump; newer kernels put an error
    /// code in it.
    fn done_result(&self, payload: &[u8]) -> Result<(), Failure> {
        match error_code(payload) {
            Some(code) if code != 0 => ack_result(0, payload),
            _ if self.interrupted => Err(Failure::Interrupted),
            _ => Ok(()),
        }
    }
}

fn error_code(payload: &[u8]) -> Option<i32> {
    payload
        .get(..4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_ne_bytes)
}

/// The outcome of an NLMSG_ERROR message: an ACK when its code is 0.
fn ack_result(flags: u16, payload: &[u8]) -> Result<(), Failure> {
    match error_code(payload) {
        None => Err(malformed("short error message")),
        Some(0) => Ok(()),
        Some(code) => Err(Failure::Refused {
            errno: i32::try_from(code.unsigned_abs()).unwrap_or(i32::MAX),
            reason: kernel_reason(flags, payload),
        }),
    }
}

/// The kernel's reason in words, from an extended ACK (after the error code comes the
/// request's header, or all of the request when not capped, then attributes).
fn kernel_reason(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    let request = payload.get(4..)?;
    let request_len = if flags & NLM_F_CAPPED != 0 {
        HEADER_LEN
    } else {
        NetlinkBuffer::new_checked(request).ok()?.length() as usize
    };
    let text = find_attribute(request.get(align4(request_len)..)?, NLMSGERR_ATTR_MSG)?;
    let text = text.split(|&b| b == 0).next().unwrap_or(&[]);
    // One line, whatever the kernel wrote.
    let text: String = String::from_utf8_lossy(text)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let text = text.trim();
    (!text.is_empty()).then(|| text.to_string())
}

/// An attribute whose length points past the bytes there are: the rest cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MalformedAttribute;

/// The attributes in `bytes`, each as (type without the nested/byte-order flags, value);
/// a malformed one ends the walk with an error.
#[derive(Debug)]
pub struct Attributes<'a>(NlasIterator<&'a [u8]>);

impl<'a> Attributes<'a> {
    pub fn new(bytes: &'a [u8]) -> Attributes<'a> {
        Attributes(NlasIterator::new(bytes))
    }

    /// The attributes after a family header of `header_len` bytes in a reply's payload
    /// (none when the payload is shorter).
    pub fn after(payload: &'a [u8], header_len: usize) -> Attributes<'a> {
        Attributes::new(payload.get(header_len..).unwrap_or(&[]))
    }
}

impl<'a> Iterator for Attributes<'a> {
    type Item = Result<(u16, &'a [u8]), MalformedAttribute>;

    fn next(&mut self) -> Option<Self::Item> {
        let Ok(nla) = self.0.next()? else {
            return Some(Err(MalformedAttribute));
        };
        // The checked buffer's length lies within the bytes; the value is after the header.
        let (kind, len) = (nla.kind(), usize::from(nla.length()));
        Some(
            nla.into_inner()
                .get(4..len)
                .map(|value| (kind, value))
                .ok_or(MalformedAttribute),
        )
    }
}

/// The value of the first attribute `kind` in `bytes`, unless a malformed one comes first.
pub fn find_attribute(bytes: &[u8], kind: u16) -> Option<&[u8]> {
    for attribute in Attributes::new(bytes) {
        let (this, value) = attribute.ok()?;
        if this == kind {
            return Some(value);
        }
    }
    None
}

/// A `u16` field at `at` of a family header.
pub fn u16_at(bytes: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(bytes.get(at..at + 2)?.try_into().ok()?))
}

/// A `u32` field at `at` of a family header.
pub fn u32_at(bytes: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(bytes.get(at..at + 4)?.try_into().ok()?))
}

/// An attribute's value as a `u32` (exactly four bytes).
pub fn u32_value(value: &[u8]) -> Option<u32> {
    Some(u32::from_ne_bytes(value.try_into().ok()?))
}

/// An attribute's value as an address of `family` (`AF_INET`, `AF_INET6`).
pub fn ip_value(family: u8, value: &[u8]) -> Option<IpAddr> {
    match family {
        AF_INET => Some(IpAddr::V4(Ipv4Addr::from(<[u8; 4]>::try_from(value).ok()?))),
        AF_INET6 => Some(IpAddr::V6(Ipv6Addr::from(
            <[u8; 16]>::try_from(value).ok()?,
        ))),
        _ => None,
    }
}

/// The address family of `addr`.
pub fn family_of(addr: IpAddr) -> u8 {
    match addr {
        IpAddr::V4(_) => AF_INET,
        IpAddr::V6(_) => AF_INET6,
    }
}

/// The bytes of `addr` (4 or 16), without allocating.
pub fn octets(addr: &IpAddr) -> ([u8; 16], usize) {
    match addr {
        IpAddr::V4(a) => {
            let mut out = [0; 16];
            out[..4].copy_from_slice(&a.octets());
            (out, 4)
        }
        IpAddr::V6(a) => (a.octets(), 16),
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use netlink_packet_core::{NLA_F_NESTED, NLM_F_MULTIPART};

    /// One netlink attribute, padded as the kernel pads it.
    pub(crate) fn attribute(kind: u16, value: &[u8]) -> Vec<u8> {
        let mut out = ((4 + value.len()) as u16).to_ne_bytes().to_vec();
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(value);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    /// One netlink message in a datagram.
    pub(crate) fn message(kind: u16, flags: u16, sequence: u32, payload: &[u8]) -> Vec<u8> {
        let len = (HEADER_LEN + payload.len()) as u32;
        let mut out = Vec::new();
        out.extend_from_slice(&len.to_ne_bytes());
        out.extend_from_slice(&kind.to_ne_bytes());
        out.extend_from_slice(&flags.to_ne_bytes());
        out.extend_from_slice(&sequence.to_ne_bytes());
        out.extend_from_slice(&0u32.to_ne_bytes());
        out.extend_from_slice(payload);
        while !out.len().is_multiple_of(4) {
            out.push(0);
        }
        out
    }

    fn run_scan(
        datagram: &[u8],
        sequence: u32,
        flags: u16,
    ) -> (Option<Result<(), Failure>>, Vec<u16>) {
        let mut seen = Vec::new();
        let mut exchange = Exchange::new(sequence, flags);
        let scan = exchange.scan(datagram, &mut |kind, _| seen.push(kind));
        (scan, seen)
    }

    /// The kind of a local (not kernel-refused) failure that ended a scan.
    fn io_kind(scan: &Option<Result<(), Failure>>) -> Option<io::ErrorKind> {
        match scan {
            Some(Err(Failure::Io(e))) => Some(e.kind()),
            _ => None,
        }
    }

    fn error_payload(code: i32, request: &[u8], attributes: &[u8]) -> Vec<u8> {
        let mut p = code.to_ne_bytes().to_vec();
        p.extend_from_slice(request);
        p.extend_from_slice(attributes);
        p
    }

    const RTM_NEWLINK: u16 = libc::RTM_NEWLINK;
    const RTM_NEWROUTE: u16 = libc::RTM_NEWROUTE;
    const RTM_NEWNEIGH: u16 = libc::RTM_NEWNEIGH;
    const RTM_NEWADDR: u16 = libc::RTM_NEWADDR;
    const RTM_GETROUTE: u16 = libc::RTM_GETROUTE;
    const RTA_DST: u16 = libc::RTA_DST;
    const RTA_MARK: u16 = libc::RTA_MARK;

    #[test]
    fn requests_are_well_formed_netlink() {
        let mut request = Request::get(RTM_GETROUTE, &[AF_INET, 32, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        request.attribute(RTA_DST, &[192, 0, 2, 7]);
        request.attribute(RTA_MARK, &7u32.to_ne_bytes());
        let bytes = request.finish(42).unwrap().to_vec();
        let message = NetlinkBuffer::new_checked(&bytes[..]).unwrap();
        assert_eq!(message.length() as usize, bytes.len());
        assert_eq!(message.message_type(), RTM_GETROUTE);
        assert_eq!(message.flags(), NLM_F_REQUEST);
        assert_eq!(message.sequence_number(), 42);
        let attributes: Vec<_> = Attributes::after(message.payload(), 12)
            .map(|a| {
                let (kind, value) = a.unwrap();
                (kind, value.to_vec())
            })
            .collect();
        assert_eq!(
            attributes,
            [
                (RTA_DST, vec![192, 0, 2, 7]),
                (RTA_MARK, 7u32.to_ne_bytes().to_vec())
            ]
        );
        // A request that would not fit is refused, never sent cut short nor a panic.
        let mut big = Request::get(RTM_GETROUTE, &[0; 12]);
        for _ in 0..10 {
            big.attribute(RTA_DST, &[0; 16]);
        }
        assert!(big.finish(1).is_err());
        assert!(big.len <= REQUEST_MAX);
        // Changes ask for an ACK, dumps for every object.
        assert_eq!(
            Request::change(RTM_GETROUTE, 0, &[]).flags(),
            NLM_F_REQUEST | NLM_F_ACK
        );
        assert_eq!(
            Request::dump(RTM_GETROUTE, &[]).flags(),
            NLM_F_REQUEST | NLM_F_DUMP
        );
    }

    #[test]
    fn attributes_are_padded_nested_and_found() {
        // As the XDP attach sends them: IFLA_XDP nesting the program's fd and flags.
        let mut request = Request::change(19, 0, &[0; 16]);
        request.attribute(3, &[1, 2, 3]);
        let nest = request.begin_nested(43);
        request.attribute(1, &(-1i32).to_ne_bytes());
        request.attribute(2, &[2]);
        request.end_nested(nest);
        let bytes = request.finish(1).unwrap().to_vec();
        let attrs = &bytes[HEADER_LEN + 16..];
        assert_eq!(&attrs[..8], &attribute(3, &[1, 2, 3])[..]);
        let nested = u16::from_ne_bytes([attrs[10], attrs[11]]);
        assert_eq!(nested, 43 | NLA_F_NESTED);
        let xdp = find_attribute(attrs, 43).unwrap();
        assert_eq!(xdp.len(), 8 + 8);
        assert_eq!(find_attribute(xdp, 2), Some(&[2u8][..]));
        assert_eq!(find_attribute(xdp, 1), Some(&(-1i32).to_ne_bytes()[..]));
        assert_eq!(find_attribute(attrs, 3), Some(&[1u8, 2, 3][..]));
        assert_eq!(find_attribute(attrs, 9), None);
        assert_eq!(find_attribute(&[8, 0, 1, 0], 1), None); // longer than what is there
    }

    #[test]
    fn replies_are_matched_to_their_request() {
        let ack = NLM_F_ACK;
        // A late ACK for another request is skipped; ours ends the exchange.
        let mut datagram = message(NLMSG_ERROR, 0, 6, &error_payload(0, &[0; 16], &[]));
        datagram.extend(message(RTM_NEWLINK, 0, 7, &[0; 16]));
        datagram.extend(message(NLMSG_ERROR, 0, 7, &error_payload(0, &[0; 16], &[])));
        let (scan, seen) = run_scan(&datagram, 7, ack);
        assert!(matches!(scan, Some(Ok(()))), "{scan:?}");
        assert_eq!(seen, [RTM_NEWLINK]);

        // A get's answer is its first reply; a late answer to an earlier question is skipped.
        let mut datagram = message(RTM_NEWROUTE, 0, 4, &[0; 12]);
        datagram.extend(message(RTM_NEWNEIGH, 0, 5, &[0; 12]));
        let (scan, seen) = run_scan(&datagram, 5, 0);
        assert!(matches!(scan, Some(Ok(()))));
        assert_eq!(seen, [RTM_NEWNEIGH]);

        // A multipart dump goes on across datagrams until DONE.
        for dump in [NLM_F_DUMP, NLM_F_DUMP | ack] {
            let mut exchange = Exchange::new(7, dump);
            let mut seen = Vec::new();
            let part = message(RTM_NEWROUTE, NLM_F_MULTIPART, 7, &[0; 12]);
            let scan = exchange.scan(&part, &mut |kind, _| seen.push(kind));
            assert!(scan.is_none());
            assert_eq!(seen, [RTM_NEWROUTE]);
            let done = message(NLMSG_DONE, NLM_F_MULTIPART, 7, &0i32.to_ne_bytes());
            let scan = exchange.scan(&done, &mut |_, _| {});
            assert!(matches!(scan, Some(Ok(()))), "{scan:?}");
        }
        let (scan, _) = run_scan(&message(RTM_NEWADDR, 2, 5, &[0; 8]), 5, NLM_F_DUMP);
        assert!(scan.is_none());

        // A dump cut short by a change is to be tried again: across datagrams, and within one.
        let mut exchange = Exchange::new(7, NLM_F_DUMP);
        let intr = message(RTM_NEWROUTE, 2 | NLM_F_DUMP_INTR, 7, &[0; 12]);
        let _ = exchange.scan(&intr, &mut |_, _| {});
        let done = message(NLMSG_DONE, 2, 7, &0i32.to_ne_bytes());
        let end = exchange.scan(&done, &mut |_, _| {});
        assert!(matches!(end, Some(Err(Failure::Interrupted))), "{end:?}");
        assert_eq!(
            Failure::Interrupted.named("x").kind(),
            io::ErrorKind::Interrupted
        );
        let mut datagram = message(RTM_NEWADDR, 2 | NLM_F_DUMP_INTR, 5, &[0; 8]);
        datagram.extend(message(NLMSG_DONE, 2, 5, &0i32.to_ne_bytes()));
        assert!(matches!(
            run_scan(&datagram, 5, NLM_F_DUMP).0,
            Some(Err(Failure::Interrupted))
        ));
        // An error code in DONE is a refusal; an overrun is data lost.
        let done = message(NLMSG_DONE, 2, 5, &(-libc::EBUSY).to_ne_bytes());
        assert_eq!(
            run_scan(&done, 5, NLM_F_DUMP)
                .0
                .unwrap()
                .unwrap_err()
                .errno(),
            Some(libc::EBUSY)
        );
        let overrun = message(NLMSG_OVERRUN, 0, 5, &[]);
        assert_eq!(
            io_kind(&run_scan(&overrun, 5, 0).0),
            Some(io::ErrorKind::InvalidData)
        );
    }

    #[test]
    fn refusals_carry_the_errno_and_the_kernel_reason() {
        let mut attribute = Vec::new();
        let text = b"Nexthop device is not up\0";
        attribute.extend_from_slice(&((4 + text.len()) as u16).to_ne_bytes());
        attribute.extend_from_slice(&NLMSGERR_ATTR_MSG.to_ne_bytes());
        attribute.extend_from_slice(text);
        while attribute.len() % 4 != 0 {
            attribute.push(0);
        }
        let request = message(RTM_NEWROUTE, 0, 3, &[0; 12]);
        let capped = error_payload(-libc::ENETDOWN, &request[..16], &attribute);
        let uncapped = error_payload(-libc::ENETDOWN, &request, &attribute);
        for (flags, payload) in [
            (NLM_F_ACK_TLVS | NLM_F_CAPPED, capped),
            (NLM_F_ACK_TLVS, uncapped),
        ] {
            let (scan, _) = run_scan(&message(NLMSG_ERROR, flags, 3, &payload), 3, NLM_F_ACK);
            let Some(Err(failure)) = scan else {
                panic!("not a refusal: {scan:?}");
            };
            assert_eq!(
                failure
                    .named("netlink: add route 10.20.0.0/16 via link 7")
                    .to_string(),
                "netlink: add route 10.20.0.0/16 via link 7: Network is down (os error 100): \
                 Nexthop device is not up"
            );
        }
        // Without the extended ACK: the errno alone (and a bare one keeps its raw errno).
        let plain = error_payload(-libc::ENETUNREACH, &[0; 16], &[]);
        let (scan, _) = run_scan(&message(NLMSG_ERROR, 0, 3, &plain), 3, NLM_F_ACK);
        let Some(Err(failure)) = scan else {
            panic!("not a refusal: {scan:?}");
        };
        assert!(matches!(
            failure,
            Failure::Refused {
                errno: libc::ENETUNREACH,
                reason: None
            }
        ));
        assert_eq!(
            failure
                .named("netlink: add route 10.20.0.0/16 via link 7")
                .to_string(),
            "netlink: add route 10.20.0.0/16 via link 7: Network is unreachable (os error 101)"
        );
        let (scan, _) = run_scan(&message(NLMSG_ERROR, 0, 3, &plain), 3, NLM_F_ACK);
        let Some(Err(failure)) = scan else {
            panic!("not a refusal: {scan:?}");
        };
        assert_eq!(failure.into_io().raw_os_error(), Some(libc::ENETUNREACH));
        // A refusal answers a get too.
        let refusal = message(NLMSG_ERROR, 0, 5, &(-libc::ENOENT).to_ne_bytes());
        let (scan, _) = run_scan(&refusal, 5, 0);
        assert!(matches!(
            scan,
            Some(Err(Failure::Refused {
                errno: libc::ENOENT,
                reason: None
            }))
        ));
    }

    #[test]
    fn garbage_from_the_kernel_is_an_error_not_a_panic() {
        let short_error = message(NLMSG_ERROR, 0, 1, &[1, 2]);
        let mut bad_length = message(NLMSG_ERROR, 0, 1, &error_payload(0, &[], &[]));
        bad_length[..4].copy_from_slice(&4000u32.to_ne_bytes());
        let mut tiny_length = bad_length.clone();
        tiny_length[..4].copy_from_slice(&3u32.to_ne_bytes());
        for datagram in [&short_error[..], &bad_length, &tiny_length, &[1, 2, 3]] {
            let (scan, _) = run_scan(datagram, 1, NLM_F_ACK);
            assert_eq!(io_kind(&scan), Some(io::ErrorKind::InvalidData), "{scan:?}");
        }
        // Odd codes and bogus extended ACKs still give one clear line.
        let mut newline = Vec::new();
        newline.extend(attribute(NLMSGERR_ATTR_MSG, b"two\nlines\0"));
        for (code, attributes) in [
            (i32::MIN, &[0xff; 7][..]),
            (-1, &[0xff; 7]),
            (5, &[0xff; 7]),
            (i32::MAX, &[0xff; 7]),
            (-1, &newline),
        ] {
            let payload = error_payload(code, &[0xff; 16], attributes);
            let (scan, _) = run_scan(&message(NLMSG_ERROR, !0, 1, &payload), 1, NLM_F_ACK);
            let Some(Err(failure)) = scan else {
                panic!("not a refusal: {scan:?}");
            };
            assert!(!failure.named("x").to_string().contains('\n'));
        }
    }
}
