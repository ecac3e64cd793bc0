//! memcached's UDP frame header: reading a request datagram and splitting a reply into
//! datagrams. No I/O.
//!
//! Every datagram, either way, starts with an 8-byte header of four big-endian `u16`s:
//! request id, sequence number, datagram count, reserved (0). The payload is text- or
//! binary-protocol bytes, as on TCP (its first byte picks the protocol, per datagram).
//!
//! # memcached's rules (1.6.18 and the newest agree)
//!
//! - A request is one datagram of more than 8 bytes whose count is exactly 1 (byte 4 is 0,
//!   byte 5 is 1); anything else is dropped silently ([`parse_frame`] returns `None`). The
//!   sequence number and the reserved field are ignored. A request split across datagrams is
//!   never reassembled: each datagram's payload is parsed on its own, and a command left
//!   incomplete at its end is lost.
//! - Each reply *message* is framed on its own: its datagrams carry the request's id, sequence
//!   numbers from 0, and the message's datagram count, `ceil(len / 1392)` (saturating at
//!   65,535; the `u16` sequence then wraps). Every datagram but the last is exactly
//!   [`MAX_DATAGRAM`] (1,400) bytes, header included.
//! - What a message is: one per reply of the text protocol, except that a multi-key `get`
//!   sends one message per key (a hit's `VALUE` block, or nothing for a miss) with `END`
//!   appended to the last key's message; one per binary response packet, except that a whole
//!   binary `stat` listing is one message.
//! - An empty message (a missed key that is not the last of a multi-key `get`, a silent
//!   binary reply) is sent as a bare 8-byte header with count 0 ([`Datagrams`] yields it)
//!   only when no other message of memcached's reply queue went out before it; otherwise
//!   memcached consumes it with the previous send. Silent text replies are no message.

/// Length of the frame header.
pub const HEADER_LEN: usize = 8;

/// Largest reply datagram memcached sends, header included.
pub const MAX_DATAGRAM: usize = 1400;

/// Largest reply payload per datagram.
pub const MAX_PAYLOAD: usize = MAX_DATAGRAM - HEADER_LEN;

/// The four fields of a frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct FrameHeader {
    pub request_id: u16,
    pub sequence: u16,
    pub count: u16,
    pub reserved: u16,
}

impl FrameHeader {
    /// Splits any datagram of at least 8 bytes into its header and payload (no checks of the
    /// fields; for clients reading replies).
    pub fn decode(datagram: &[u8]) -> Option<(FrameHeader, &[u8])> {
        let (head, payload) = datagram.split_first_chunk::<HEADER_LEN>()?;
        let [r0, r1, s0, s1, c0, c1, x0, x1] = *head;
        let header = FrameHeader {
            request_id: u16::from_be_bytes([r0, r1]),
            sequence: u16::from_be_bytes([s0, s1]),
            count: u16::from_be_bytes([c0, c1]),
            reserved: u16::from_be_bytes([x0, x1]),
        };
        Some((header, payload))
    }

    /// The header's 8 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let [r0, r1] = self.request_id.to_be_bytes();
        let [s0, s1] = self.sequence.to_be_bytes();
        let [c0, c1] = self.count.to_be_bytes();
        let [x0, x1] = self.reserved.to_be_bytes();
        [r0, r1, s0, s1, c0, c1, x0, x1]
    }
}

/// A request datagram as memcached accepts it: more than 8 bytes and a datagram count of
/// exactly 1. Returns the header (for its request id) and the payload; `None` means drop it
/// without a reply.
pub fn parse_frame(datagram: &[u8]) -> Option<(FrameHeader, &[u8])> {
    let (header, payload) = FrameHeader::decode(datagram)?;
    if payload.is_empty() || header.count != 1 {
        return None;
    }
    Some((header, payload))
}

/// The datagram count memcached puts in every datagram of a `len`-byte message.
pub fn datagram_count(len: usize) -> u16 {
    let count = len.div_ceil(MAX_PAYLOAD);
    u16::try_from(count).unwrap_or(u16::MAX)
}

/// One reply datagram: a header and a slice of the message. Send it as two pieces
/// (`sendmsg` with two `iovec`s) or copy it out with [`Datagram::write_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Datagram<'a> {
    pub header: [u8; HEADER_LEN],
    pub payload: &'a [u8],
}

impl Datagram<'_> {
    /// Length on the wire: at most [`MAX_DATAGRAM`].
    pub fn len(&self) -> usize {
        HEADER_LEN + self.payload.len()
    }

    /// Always false: a datagram has at least its header.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Appends the whole datagram to `out`.
    pub fn write_to(&self, out: &mut Vec<u8>) {
        out.reserve(self.len());
        out.extend_from_slice(&self.header);
        out.extend_from_slice(self.payload);
    }

    /// Copies the whole datagram to the front of `buf` and returns its length.
    pub fn copy_into(&self, buf: &mut [u8; MAX_DATAGRAM]) -> usize {
        let (head, rest) = buf.split_at_mut(HEADER_LEN);
        head.copy_from_slice(&self.header);
        let n = self.payload.len().min(rest.len());
        if let (Some(dst), Some(src)) = (rest.get_mut(..n), self.payload.get(..n)) {
            dst.copy_from_slice(src);
        }
        HEADER_LEN + n
    }
}

/// The datagrams of one reply message, in order, without copying or allocating.
#[derive(Debug, Clone)]
pub struct Datagrams<'a> {
    request_id: u16,
    count: u16,
    sequence: u16,
    rest: &'a [u8],
    /// An empty message still yields one header-only datagram.
    pending_empty: bool,
}

impl<'a> Datagrams<'a> {
    /// Frames `message` as the reply to the request with id `request_id`.
    pub fn new(request_id: u16, message: &'a [u8]) -> Self {
        Datagrams {
            request_id,
            count: datagram_count(message.len()),
            sequence: 0,
            rest: message,
            pending_empty: message.is_empty(),
        }
    }

    /// The datagram count in every header (0 for an empty message).
    pub fn total(&self) -> u16 {
        self.count
    }
}

impl<'a> Iterator for Datagrams<'a> {
    type Item = Datagram<'a>;

    fn next(&mut self) -> Option<Datagram<'a>> {
        if self.rest.is_empty() && !self.pending_empty {
            return None;
        }
        self.pending_empty = false;
        let n = self.rest.len().min(MAX_PAYLOAD);
        let (payload, rest) = self.rest.split_at_checked(n)?;
        self.rest = rest;
        let header = FrameHeader {
            request_id: self.request_id,
            sequence: self.sequence,
            count: self.count,
            reserved: 0,
        }
        .encode();
        self.sequence = self.sequence.wrapping_add(1);
        Some(Datagram { header, payload })
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = if self.pending_empty {
            1
        } else {
            self.rest.len().div_ceil(MAX_PAYLOAD)
        };
        (n, Some(n))
    }
}

impl ExactSizeIterator for Datagrams<'_> {}

#[cfg(test)]
mod tests;
