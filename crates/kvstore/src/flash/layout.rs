//! The on-flash layout, as pure functions over bytes: the file header, and the blocks a
//! page's segment image is cut into, each carrying a CRC-32 of what it holds and of where
//! and when it was written. Nothing here does I/O, so the readers of untrusted bytes (a
//! file found at start, a block read back) are fuzzed directly (`fuzz/fuzz_targets/
//! flash_block.rs`).
//!
//! # The file
//!
//! Block 0 is the header: magic, format version, the tier's random id, the geometry
//! (blocks per page, pages) and a CRC of the header's bytes. Pages follow, back to back:
//! page `p` starts at block `1 + p * page_blocks`.
//!
//! # A page
//!
//! A page holds one segment image of up to `page_blocks * BLOCK_DATA` bytes. Block `b` of
//! the page holds image bytes `[b * BLOCK_DATA, (b + 1) * BLOCK_DATA)` and, in its last
//! four bytes, a CRC-32 (little-endian) over the tier id, the page number, the page's
//! write generation, the block's number and its data. So an offset into the image needs
//! no translation table, and a block read back is refused if it is damaged, belongs to
//! another page, to an older write of this page (a stale generation), to another file
//! (another tier id), or was never written: each of these passes only if its CRC happens
//! to match, a chance of one in 2^32 per block (and the reader then still checks the
//! record's key).

use thiserror::Error;

/// The unit of I/O and of checksumming: file offsets, lengths and buffers of flash reads
/// and writes are multiples of it (what `O_DIRECT` asks of them).
pub const BLOCK: usize = 4096;
/// Bytes of segment image a block carries (the rest is its CRC).
pub const BLOCK_DATA: usize = BLOCK - 4;

const MAGIC: &[u8; 8] = b"KVCFLASH";
/// The layout's version: a file of another is refused.
pub const FLASH_VERSION: u32 = 1;
/// Header bytes before its CRC: magic, version, tier id, page blocks, pages.
const HEADER_LEN: usize = 8 + 4 + 8 + 4 + 4;

/// What a flash file says of itself (block 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// Random, never 0: set when the file is made, part of every block's CRC.
    pub tier_id: u64,
    /// Blocks per page (a page holds `page_blocks * BLOCK_DATA` bytes of image).
    pub page_blocks: u32,
    /// Pages in the file.
    pub pages: u32,
}

/// Why bytes read from flash were refused.
#[derive(Debug, Error, PartialEq, Eq, Clone, Copy)]
pub enum LayoutError {
    #[error("not a kvcached flash file (bad magic)")]
    Magic,
    #[error("flash file format version {0}, this kvcached reads version {FLASH_VERSION}")]
    Version(u32),
    #[error("flash file header is damaged (checksum mismatch)")]
    HeaderChecksum,
    #[error("flash file header has an impossible geometry")]
    Geometry,
    #[error("block {block} of page {page} is damaged, stale or was never written")]
    Block { page: u32, block: u32 },
    #[error("bytes {off}..{end} are outside a page of {cap} bytes")]
    Range { off: usize, end: usize, cap: usize },
    #[error("got {got} bytes of flash data where {want} were needed")]
    Short { got: usize, want: usize },
}

impl Header {
    /// Bytes of segment image a page holds.
    pub fn page_capacity(&self) -> usize {
        self.page_blocks as usize * BLOCK_DATA
    }

    /// The file's length: the header block and every page.
    pub fn file_len(&self) -> u64 {
        (1 + u64::from(self.pages) * u64::from(self.page_blocks)) * BLOCK as u64
    }

    /// Byte offset of page `page` in the file.
    pub fn page_offset(&self, page: u32) -> u64 {
        (1 + u64::from(page) * u64::from(self.page_blocks)) * BLOCK as u64
    }

    /// The header block's bytes.
    pub fn encode(&self) -> [u8; BLOCK] {
        let mut b = [0u8; BLOCK];
        let mut w = Writer(&mut b, 0);
        w.put(MAGIC);
        w.put(&FLASH_VERSION.to_le_bytes());
        w.put(&self.tier_id.to_le_bytes());
        w.put(&self.page_blocks.to_le_bytes());
        w.put(&self.pages.to_le_bytes());
        let crc = crc32fast::hash(b.get(..HEADER_LEN).unwrap_or_default());
        Writer(&mut b, HEADER_LEN).put(&crc.to_le_bytes());
        b
    }

    /// Parse a header block (the first `BLOCK` bytes of a file; fewer are refused).
    pub fn parse(b: &[u8]) -> Result<Header, LayoutError> {
        let b = b.get(..BLOCK).ok_or(LayoutError::Short {
            got: b.len(),
            want: BLOCK,
        })?;
        let mut r = Reader(b);
        if r.take::<8>() != Some(*MAGIC) {
            return Err(LayoutError::Magic);
        }
        let version = r.u32().ok_or(LayoutError::Magic)?;
        let crc = b
            .get(HEADER_LEN..HEADER_LEN + 4)
            .and_then(|c| c.try_into().ok())
            .map(u32::from_le_bytes);
        if crc != b.get(..HEADER_LEN).map(crc32fast::hash) {
            return Err(LayoutError::HeaderChecksum);
        }
        if version != FLASH_VERSION {
            return Err(LayoutError::Version(version));
        }
        let (Some(tier_id), Some(page_blocks), Some(pages)) = (r.u64(), r.u32(), r.u32()) else {
            return Err(LayoutError::Geometry);
        };
        let h = Header {
            tier_id,
            page_blocks,
            pages,
        };
        if tier_id == 0 || page_blocks == 0 || pages == 0 {
            return Err(LayoutError::Geometry);
        }
        Ok(h)
    }

    /// The CRC of block `block` of page `page`, written at generation `gen`, holding `data`.
    fn block_crc(&self, page: u32, gen: u32, block: u32, data: &[u8]) -> u32 {
        let mut h = crc32fast::Hasher::new();
        h.update(&self.tier_id.to_le_bytes());
        h.update(&page.to_le_bytes());
        h.update(&gen.to_le_bytes());
        h.update(&block.to_le_bytes());
        h.update(data);
        h.finalize()
    }

    /// Cut `image` (at most [`Header::page_capacity`] bytes) into the blocks of page
    /// `page` at generation `gen`, into `out` (whole blocks: `blocks_for(image.len())`
    /// of them; a last block's unused data bytes are zero). Returns the bytes of `out`
    /// used.
    pub fn encode_page(
        &self,
        page: u32,
        gen: u32,
        image: &[u8],
        out: &mut [u8],
    ) -> Result<usize, LayoutError> {
        let cap = self.page_capacity();
        if image.len() > cap {
            return Err(LayoutError::Range {
                off: 0,
                end: image.len(),
                cap,
            });
        }
        let n = blocks_for(image.len());
        let want = n * BLOCK;
        let out = out
            .get_mut(..want)
            .ok_or(LayoutError::Short { got: 0, want })?;
        for (i, (blk, data)) in out
            .chunks_exact_mut(BLOCK)
            .zip(image.chunks(BLOCK_DATA))
            .enumerate()
        {
            let (body, tail) = blk.split_at_mut(BLOCK_DATA);
            let (used, rest) = body.split_at_mut(data.len());
            used.copy_from_slice(data);
            rest.fill(0);
            let crc = self.block_crc(page, gen, i as u32, body);
            tail.copy_from_slice(&crc.to_le_bytes());
        }
        Ok(want)
    }

    /// Where image bytes `[off, off + len)` of a page are: the byte offset in the file
    /// of the first block that holds them and how many bytes of whole blocks to read.
    pub fn span(&self, page: u32, off: usize, len: usize) -> Result<(u64, usize), LayoutError> {
        let cap = self.page_capacity();
        let end = off
            .checked_add(len)
            .filter(|&e| e <= cap && page < self.pages);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(LayoutError::Range {
                off,
                end: off.saturating_add(len),
                cap,
            });
        };
        let first = off / BLOCK_DATA;
        let last = (end - 1) / BLOCK_DATA;
        let at = self.page_offset(page) + (first * BLOCK) as u64;
        Ok((at, (last - first + 1) * BLOCK))
    }

    /// Check the blocks `raw` holds (read from the file at the span
    /// [`Header::span`]`(page, off, len)` gave) against page `page` at generation `gen`,
    /// and append image bytes `[off, off + len)` to `out`. Nothing is appended unless
    /// every block is sound.
    pub fn decode(
        &self,
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
        raw: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), LayoutError> {
        let (_, want) = self.span(page, off, len)?;
        let raw = raw.get(..want).ok_or(LayoutError::Short {
            got: raw.len(),
            want,
        })?;
        let first = off / BLOCK_DATA;
        for (i, blk) in raw.chunks_exact(BLOCK).enumerate() {
            let block = (first + i) as u32;
            let (body, tail) = blk.split_at(BLOCK_DATA);
            let stored = tail.try_into().ok().map(u32::from_le_bytes);
            if stored != Some(self.block_crc(page, gen, block, body)) {
                return Err(LayoutError::Block { page, block });
            }
        }
        let start = out.len();
        let mut skip = off - first * BLOCK_DATA;
        let mut left = len;
        for blk in raw.chunks_exact(BLOCK) {
            let body = blk.get(skip..BLOCK_DATA).unwrap_or_default();
            let take = body.len().min(left);
            out.extend_from_slice(body.get(..take).unwrap_or_default());
            left -= take;
            skip = 0;
        }
        debug_assert_eq!(out.len() - start, len);
        Ok(())
    }
}

/// Blocks that hold `len` bytes of image.
pub fn blocks_for(len: usize) -> usize {
    len.div_ceil(BLOCK_DATA).max(1)
}

struct Writer<'a>(&'a mut [u8], usize);

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) {
        if let Some(dst) = self.0.get_mut(self.1..self.1 + bytes.len()) {
            dst.copy_from_slice(bytes);
        }
        self.1 += bytes.len();
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Option<[u8; N]> {
        let (head, rest) = self.0.split_first_chunk::<N>()?;
        self.0 = rest;
        Some(*head)
    }

    fn u32(&mut self) -> Option<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }

    fn u64(&mut self) -> Option<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            tier_id: 0x1234_5678_9abc_def0,
            page_blocks: 4,
            pages: 3,
        }
    }

    fn image(len: usize, seed: u8) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31) ^ seed)
            .collect()
    }

    fn write(h: &Header, page: u32, gen: u32, img: &[u8]) -> Vec<u8> {
        let mut out = vec![0u8; h.page_blocks as usize * BLOCK];
        let n = h.encode_page(page, gen, img, &mut out).expect("fits");
        out.truncate(n);
        out
    }

    /// Read `[off, off + len)` from `blocks`, the encoded page (as the file would).
    fn read(
        h: &Header,
        blocks: &[u8],
        page: u32,
        gen: u32,
        off: usize,
        len: usize,
    ) -> Result<Vec<u8>, LayoutError> {
        let (at, n) = h.span(page, off, len)?;
        let start = (at - h.page_offset(page)) as usize;
        let raw = blocks.get(start..start + n).unwrap_or_default();
        let mut out = Vec::new();
        h.decode(page, gen, off, len, raw, &mut out)?;
        Ok(out)
    }

    #[test]
    fn header_round_trips_and_refuses_damage() {
        let h = header();
        let b = h.encode();
        assert_eq!(Header::parse(&b), Ok(h));
        assert_eq!(h.file_len(), (1 + 12) * BLOCK as u64);
        let mut bad = b;
        bad[0] ^= 1;
        assert_eq!(Header::parse(&bad), Err(LayoutError::Magic));
        let mut bad = b;
        bad[13] ^= 1; // the tier id
        assert_eq!(Header::parse(&bad), Err(LayoutError::HeaderChecksum));
        let mut other = Header { ..h };
        other.pages = 0;
        assert_eq!(Header::parse(&other.encode()), Err(LayoutError::Geometry));
        assert!(matches!(
            Header::parse(&b[..100]),
            Err(LayoutError::Short { .. })
        ));
        assert_eq!(Header::parse(&[0u8; BLOCK]), Err(LayoutError::Magic));
    }

    #[test]
    fn a_newer_version_is_refused_by_name() {
        let mut b = header().encode();
        b[8..12].copy_from_slice(&(FLASH_VERSION + 1).to_le_bytes());
        let crc = crc32fast::hash(&b[..HEADER_LEN]);
        b[HEADER_LEN..HEADER_LEN + 4].copy_from_slice(&crc.to_le_bytes());
        assert_eq!(
            Header::parse(&b),
            Err(LayoutError::Version(FLASH_VERSION + 1))
        );
    }

    #[test]
    fn every_range_of_a_page_reads_back() {
        let h = header();
        let img = image(h.page_capacity() - 100, 7);
        let blocks = write(&h, 2, 9, &img);
        assert_eq!(blocks.len(), 4 * BLOCK);
        for (off, len) in [
            (0, 1),
            (0, img.len()),
            (BLOCK_DATA - 1, 2),
            (BLOCK_DATA, BLOCK_DATA),
            (5, 3 * BLOCK_DATA),
            (img.len() - 1, 1),
        ] {
            assert_eq!(
                read(&h, &blocks, 2, 9, off, len).as_deref(),
                Ok(&img[off..off + len]),
                "{off}+{len}"
            );
        }
    }

    #[test]
    fn a_short_image_writes_only_its_blocks() {
        let h = header();
        let img = image(BLOCK_DATA + 1, 1);
        let blocks = write(&h, 0, 1, &img);
        assert_eq!(blocks.len(), 2 * BLOCK);
        // The unwritten third block (zeros, as a fresh file) fails its check.
        let mut file = blocks.clone();
        file.resize(4 * BLOCK, 0);
        assert_eq!(
            read(&h, &file, 0, 1, 2 * BLOCK_DATA, 10),
            Err(LayoutError::Block { page: 0, block: 2 })
        );
    }

    #[test]
    fn damaged_stale_misplaced_or_foreign_blocks_are_refused() {
        let h = header();
        let img = image(3 * BLOCK_DATA, 3);
        let blocks = write(&h, 1, 5, &img);
        // A flipped bit anywhere in a block, its CRC included.
        for at in [0, 100, BLOCK_DATA - 1, BLOCK_DATA, BLOCK - 1, BLOCK + 17] {
            let mut bad = blocks.clone();
            bad[at] ^= 0x10;
            let block = (at / BLOCK) as u32;
            assert_eq!(
                read(&h, &bad, 1, 5, 0, img.len()),
                Err(LayoutError::Block { page: 1, block }),
                "bit at {at}"
            );
        }
        // An older write of the page.
        assert_eq!(
            read(&h, &blocks, 1, 6, 0, 10),
            Err(LayoutError::Block { page: 1, block: 0 })
        );
        // Another page's blocks (a misdirected read or write).
        assert!(read(&h, &blocks, 2, 5, 0, 10).is_err());
        // The same place in another tier's file.
        let other = Header {
            tier_id: h.tier_id + 1,
            ..h
        };
        assert!(read(&other, &blocks, 1, 5, 0, 10).is_err());
        // Nothing is appended on a refusal.
        let mut out = vec![1, 2];
        let (_, n) = h.span(1, 0, 10).expect("in range");
        assert!(h.decode(1, 6, 0, 10, &blocks[..n], &mut out).is_err());
        assert_eq!(out, [1, 2]);
    }

    #[test]
    fn ranges_outside_a_page_and_short_reads_are_refused() {
        let h = header();
        let cap = h.page_capacity();
        assert!(h.span(0, cap - 1, 1).is_ok());
        assert!(h.span(0, cap - 1, 2).is_err());
        assert!(h.span(0, 0, 0).is_err());
        assert!(h.span(3, 0, 1).is_err(), "page 3 of 3");
        assert!(h.span(0, usize::MAX, 2).is_err());
        let img = image(cap + 1, 0);
        let mut out = vec![0u8; 5 * BLOCK];
        assert!(h.encode_page(0, 0, &img, &mut out).is_err());
        let blocks = write(&h, 0, 0, &img[..cap]);
        let mut v = Vec::new();
        assert!(matches!(
            h.decode(0, 0, 0, cap, &blocks[..BLOCK], &mut v),
            Err(LayoutError::Short { .. })
        ));
    }
}
