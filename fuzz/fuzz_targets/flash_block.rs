//! Feeds arbitrary bytes to the flash tier's readers of what comes back from a device:
//! `Header::parse` (a file found at start) and `Header::decode` (blocks read back), which
//! must refuse what they cannot vouch for with an error, never panic or read out of
//! bounds, and append exactly the bytes asked for when they accept.
//!
//! The input is the header block's candidate bytes, then a range (offset and length, 4
//! bytes each) and the raw blocks; a second pass encodes a page from the input, damages one
//! byte the input picks, and checks that the damaged block is refused.
#![no_main]

use kvstore::flash::{Header, BLOCK, BLOCK_DATA};
use libfuzzer_sys::fuzz_target;

fn u32_at(d: &[u8], at: usize) -> u32 {
    d.get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map_or(0, u32::from_le_bytes)
}

fuzz_target!(|data: &[u8]| {
    let _ = Header::parse(data);
    let h = Header {
        tier_id: 0x5eed,
        page_blocks: 4,
        pages: 2,
    };
    let off = u32_at(data, 0) as usize % (h.page_capacity() + 8);
    let len = u32_at(data, 4) as usize % (h.page_capacity() + 8);
    let raw = data.get(8..).unwrap_or_default();
    let mut out = vec![0xAA];
    if h.decode(1, 3, off, len, raw, &mut out).is_ok() {
        assert_eq!(out.len(), 1 + len);
    } else {
        assert_eq!(out, [0xAA]);
    }

    // A page encoded from the input reads back whole, and a damaged byte is refused.
    let image = raw.get(..raw.len().min(h.page_capacity())).unwrap_or_default();
    if image.is_empty() {
        return;
    }
    let mut blocks = vec![0u8; 4 * BLOCK];
    let n = h.encode_page(0, 9, image, &mut blocks).expect("an image that fits");
    let mut back = Vec::new();
    h.decode(0, 9, 0, image.len(), &blocks[..n], &mut back)
        .expect("what was written reads back");
    assert_eq!(back, image);
    let at = u32_at(data, 0) as usize % n;
    blocks[at] ^= 1 + (data[0] & 0x7f);
    let block = at / BLOCK;
    let start = block * BLOCK_DATA;
    let len = image.len().saturating_sub(start).clamp(1, BLOCK_DATA);
    let (_, want) = h.span(0, start, len).expect("in range");
    let raw = &blocks[block * BLOCK..block * BLOCK + want];
    assert!(h.decode(0, 9, start, len, raw, &mut Vec::new()).is_err());
});
