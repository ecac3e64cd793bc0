//! Tests of the UDP frame header. Expected framing was captured from the newest memcached
//! (1.6.18 frames identically).

use super::*;
use proptest::prelude::*;

fn frame(id: u16, seq: u16, count: u16, reserved: u16, payload: &[u8]) -> Vec<u8> {
    let mut d = FrameHeader {
        request_id: id,
        sequence: seq,
        count,
        reserved,
    }
    .encode()
    .to_vec();
    d.extend_from_slice(payload);
    d
}

#[test]
fn header_bytes_are_big_endian() {
    let h = FrameHeader {
        request_id: 0x1234,
        sequence: 0x0102,
        count: 0x0003,
        reserved: 0xabcd,
    };
    assert_eq!(h.encode(), [0x12, 0x34, 0x01, 0x02, 0x00, 0x03, 0xab, 0xcd]);
    assert_eq!(FrameHeader::decode(&h.encode()), Some((h, &[][..])));
}

#[test]
fn accepts_what_memcached_accepts() {
    let get = b"get a\r\n";
    let d = frame(7, 0, 1, 0, get);
    let (h, payload) = parse_frame(&d).unwrap();
    assert_eq!((h.request_id, payload), (7, &get[..]));
    // The sequence number and the reserved field are ignored.
    let d = frame(8, 5, 1, 9, get);
    let (h, payload) = parse_frame(&d).unwrap();
    assert_eq!(
        (h.request_id, h.sequence, h.reserved, payload),
        (8, 5, 9, &get[..])
    );
    // One byte of payload is enough.
    assert!(parse_frame(&frame(9, 0, 1, 0, b"\n")).is_some());
}

#[test]
fn drops_what_memcached_drops() {
    let get = b"get a\r\n";
    for bad in [
        frame(7, 0, 2, 0, get),      // multi-datagram request
        frame(7, 0, 0, 0, get),      // count 0
        frame(7, 0, 0x0101, 0, get), // count 257: both bytes matter
        frame(7, 0, 1, 0, b""),      // header only
        vec![0, 7, 0, 0, 0, 1, 0],   // short header
        Vec::new(),
    ] {
        assert_eq!(parse_frame(&bad), None, "{bad:?}");
    }
}

fn collect(id: u16, message: &[u8]) -> Vec<Vec<u8>> {
    Datagrams::new(id, message)
        .map(|d| {
            let mut out = Vec::new();
            d.write_to(&mut out);
            assert_eq!(out.len(), d.len());
            out
        })
        .collect()
}

#[test]
fn single_datagram() {
    let msg = b"VALUE a 0 1\r\na\r\nEND\r\n";
    let got = collect(0x1234, msg);
    assert_eq!(got, [frame(0x1234, 0, 1, 0, msg)]);
}

#[test]
fn multi_datagram_like_memcached() {
    // `get big` of a 3000-byte value: memcached sent 1400 + 1400 + 249 bytes, sequence 0..3,
    // count 3 in each.
    let mut msg = b"VALUE big 0 3000\r\n".to_vec();
    msg.extend_from_slice(&[b'x'; 3000]);
    msg.extend_from_slice(b"\r\nEND\r\n");
    let it = Datagrams::new(0x4321, &msg);
    assert_eq!(it.total(), 3);
    assert_eq!(it.len(), 3);
    let got = collect(0x4321, &msg);
    let sizes: Vec<usize> = got.iter().map(Vec::len).collect();
    assert_eq!(sizes, [1400, 1400, 249]);
    for (seq, d) in got.iter().enumerate() {
        assert_eq!(&d[..8], &[0x43, 0x21, 0, seq as u8, 0, 3, 0, 0]);
    }
    let joined: Vec<u8> = got.iter().flat_map(|d| d[8..].to_vec()).collect();
    assert_eq!(joined, msg);
}

#[test]
fn exact_multiples_and_edges() {
    for (len, count) in [
        (1, 1),
        (MAX_PAYLOAD - 1, 1),
        (MAX_PAYLOAD, 1),
        (MAX_PAYLOAD + 1, 2),
        (2 * MAX_PAYLOAD, 2),
        (2 * MAX_PAYLOAD + 1, 3),
    ] {
        let msg = vec![b'z'; len];
        let got = collect(1, &msg);
        assert_eq!(got.len(), count, "len {len}");
        assert!(got.iter().all(|d| d.len() <= MAX_DATAGRAM));
        assert!(got[..count - 1].iter().all(|d| d.len() == MAX_DATAGRAM));
        assert_eq!(usize::from(datagram_count(len)), count);
    }
}

#[test]
fn empty_message_is_a_bare_header_with_count_zero() {
    // memcached sends this for a missed key that is not the last of a multi-key `get`.
    let got = collect(21, b"");
    assert_eq!(got, [vec![0, 21, 0, 0, 0, 0, 0, 0]]);
}

#[test]
fn count_saturates_and_sequence_wraps() {
    assert_eq!(datagram_count(MAX_PAYLOAD * 65_535), 65_535);
    assert_eq!(datagram_count(MAX_PAYLOAD * 65_535 + 1), u16::MAX);
    let msg = vec![0u8; MAX_PAYLOAD * 65_537];
    let mut it = Datagrams::new(3, &msg);
    assert_eq!(it.total(), u16::MAX);
    assert_eq!(it.len(), 65_537);
    let last = it.by_ref().last().unwrap();
    let (h, _) = FrameHeader::decode(&last.header).unwrap();
    assert_eq!((h.sequence, h.count), (0, u16::MAX));
}

#[test]
fn copy_into_a_fixed_buffer() {
    let msg = vec![7u8; 2000];
    let mut buf = [0u8; MAX_DATAGRAM];
    let mut total = 0;
    for d in Datagrams::new(9, &msg) {
        let n = d.copy_into(&mut buf);
        assert_eq!(n, d.len());
        assert_eq!(&buf[..8], &d.header);
        assert_eq!(&buf[8..n], d.payload);
        total += n - HEADER_LEN;
    }
    assert_eq!(total, msg.len());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn parse_frame_never_panics(d in prop::collection::vec(any::<u8>(), 0..32)) {
        if let Some((h, payload)) = parse_frame(&d) {
            prop_assert_eq!(h.count, 1);
            prop_assert!(!payload.is_empty());
            prop_assert_eq!(payload.len() + HEADER_LEN, d.len());
        }
    }

    #[test]
    fn framing_round_trips(id in any::<u16>(), len in 0usize..6000) {
        let msg: Vec<u8> = (0..len).map(|i| i as u8).collect();
        let mut joined = Vec::new();
        let mut n = 0usize;
        let count = datagram_count(len);
        for (seq, d) in Datagrams::new(id, &msg).enumerate() {
            let mut wire = Vec::new();
            d.write_to(&mut wire);
            prop_assert!(wire.len() <= MAX_DATAGRAM);
            let (h, payload) = FrameHeader::decode(&wire).unwrap();
            prop_assert_eq!(h, FrameHeader { request_id: id, sequence: seq as u16, count, reserved: 0 });
            joined.extend_from_slice(payload);
            n += 1;
        }
        prop_assert_eq!(joined, msg);
        prop_assert_eq!(n, usize::from(count).max(1));
    }
}
