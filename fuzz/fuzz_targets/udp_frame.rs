//! Feeds an arbitrary datagram to the UDP frame parser and, when memcached would accept it,
//! the payload to the protocol parser its first byte picks (as memcached does per datagram);
//! frames the rest of the input as a reply and checks the framing: every datagram is at most
//! 1,400 bytes, headers carry the request id, consecutive sequence numbers and the count, and
//! the payloads join back into the message.
#![no_main]

use kvproto::udp::{self, Datagrams, FrameHeader, MAX_DATAGRAM};
use kvproto::{binary, text};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|input: &[u8]| {
    // A 2-byte length splits the input into a request datagram and a reply message.
    let (split, input) = match input.split_first_chunk::<2>() {
        Some((n, rest)) => (usize::from(u16::from_be_bytes(*n)), rest),
        None => (0, input),
    };
    let (datagram, message) = input.split_at(split.min(input.len()));

    let (id, accepted) = match udp::parse_frame(datagram) {
        Some((header, payload)) => {
            assert_eq!(header.count, 1);
            assert!(!payload.is_empty());
            assert_eq!(payload.len() + udp::HEADER_LEN, datagram.len());
            let limits = text::Limits::default();
            if payload.first() == Some(&binary::REQUEST_MAGIC) {
                let _ = binary::parse(payload, &limits);
            } else {
                let _ = text::parse(payload, &limits);
            }
            (header.request_id, true)
        }
        None => (0, false),
    };
    if !accepted {
        // memcached drops anything shorter than 9 bytes or not a single datagram.
        let single = datagram.get(4..6) == Some(&[0, 1][..]);
        assert!(datagram.len() <= udp::HEADER_LEN || !single);
    }

    let frames = Datagrams::new(id, message);
    let count = frames.total();
    assert_eq!(count, udp::datagram_count(message.len()));
    let mut joined = Vec::with_capacity(message.len());
    let mut buf = [0u8; MAX_DATAGRAM];
    let mut n = 0usize;
    for (seq, d) in frames.enumerate() {
        let len = d.copy_into(&mut buf);
        assert!(len <= MAX_DATAGRAM && len == d.len());
        let (h, payload) = FrameHeader::decode(&buf[..len]).expect("a header");
        assert_eq!(
            h,
            FrameHeader {
                request_id: id,
                sequence: seq as u16,
                count,
                reserved: 0,
            }
        );
        if len < MAX_DATAGRAM {
            // Only the last datagram may be short.
            assert_eq!(joined.len() + payload.len(), message.len());
        }
        joined.extend_from_slice(payload);
        n += 1;
    }
    assert_eq!(joined, message);
    assert_eq!(n, usize::from(count).max(1));
});
