//! Warm restart: the engine's segments, written to a file and mapped back.
//!
//! A snapshot file is the magic `KVSNAP\0` and a version byte, then frames. A frame is its
//! payload's length (u64, little-endian), a CRC-32 (u32) of the length's eight bytes and the
//! payload, then the payload. The first frame is the header (the settings that decide how
//! items are laid out, and the item count); each further frame is a segment image: one of
//! the engine's segments exactly as it lies in memory (its header, then its records, dead
//! ones included: a record's place gives its version, so records cannot move), followed
//! by the offsets of its live records. Every frame after the header starts where its
//! payload begins on a page boundary (the gap before it is zero bytes), so that a restart
//! maps each image straight from the file as a segment (private, copy on write) and only
//! builds the index over its live records: nothing is copied, decoded or re-encoded. An end frame (length 0, its CRC over
//! the trailer, then the trailer: the number of frames before it and their payload bytes)
//! closes the file, and nothing may follow it. So a file that was cut short, extended, or
//! has any bit flipped is refused with the byte offset where it goes wrong, instead of
//! loading part of a cache or a wrong value; `FORMAT.md` ("Snapshot file") has the layout.
//!
//! Files of format 3 (images of live records in record format 1) and 2 (the replication
//! snapshot's batches, also of record format 1) still load: their records are applied one
//! by one through the write path.

use std::borrow::Cow;
use std::io::{Read, Write};

use super::repl::apply::PREFETCH;
use super::repl::wire::{Phase, ReplicaState, FLAG_DONE, KIND_RESET, KIND_SNAPSHOT};
use super::repl::ReplError;

use std::sync::atomic::{AtomicBool, Ordering};

use super::flash::{FlashRestore, SavedPage};
use super::format::{self, KIND_ITEM, SEG_HDR};
use super::{compact, index, mem, seg::Seg, Insert, LogEngine, Queue, Rec, Vis, MAX_KEY, PAGE};
use crate::Engine;
use crate::Time;

/// File magic (7 bytes) and format version (the 8th).
const MAGIC: &[u8; 7] = b"KVSNAP\x00";
/// The newest snapshot format, which this engine writes when flash pages are named in
/// it (1 had no checksums or header; 2 held replication batches and 3 images of live
/// records, both of record format 1, and are still read; 4 is 5 without flash frames).
pub const SNAPSHOT_VERSION: u8 = 5;
/// The format this engine writes without a flash tier (readable by engines of format 4).
const MEMORY_VERSION: u8 = 4;
/// The first bytes of a flash frame's payload (a segment image's are `format::SEG_MAGIC`).
const FLASH_MAGIC: &[u8; 4] = b"KVFP";
/// A flash frame's payload before its list of offsets: magic, file id, page, generation,
/// image length, CAS base, count.
const FLASH_FRAME_HEAD: usize = 4 + 8 + 4 + 4 + 4 + 8 + 4;
/// The oldest snapshot format this engine reads.
const OLDEST_READ: u8 = 2;
/// The log record format this engine writes (`FORMAT.md`).
const RECORD_FORMAT: u8 = 2;

/// The record format a snapshot of format `version` holds.
fn record_format_of(version: u8) -> u8 {
    if version >= 4 {
        2
    } else {
        1
    }
}
/// Bytes of a snapshot batch before the record that crosses the budget.
const BATCH_BUDGET: usize = 4 << 20;
/// The header frame's payload length.
const HEADER_LEN: usize = 34;

/// What decides how a snapshot's items are laid out: a file saved with other settings is
/// refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotSettings {
    /// The record format version of the log.
    pub record_format: u8,
    /// CAS uniques kept (memcached's `-C` turns them off).
    pub use_cas: bool,
    /// The largest item (memcached's `-I`).
    pub max_item_size: u64,
}

/// What a snapshot's header says about its contents.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SnapshotInfo {
    /// The file's format version.
    pub version: u8,
    pub settings: SnapshotSettings,
    /// Items held when it was saved (expired ones may be dropped on load).
    pub items: u64,
    /// Unix time it was saved.
    pub saved_at: u64,
    /// Bytes of items held when it was saved.
    pub bytes: u64,
}

/// Why a snapshot file cannot be loaded. Offsets are bytes from the start of the file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// The file is empty.
    #[error("the file is empty")]
    Empty,
    /// The file does not start with a snapshot's magic.
    #[error("not a kvcached snapshot")]
    NotSnapshot,
    /// Written in another snapshot format.
    #[error(
        "written in snapshot format {found}; this kvcached reads formats {OLDEST_READ} to \
         {SNAPSHOT_VERSION}"
    )]
    Version { found: u8 },
    /// Saved by an engine with other item-layout settings.
    #[error("saved with other item settings:{}", settings_differences(saved, ours))]
    Settings {
        saved: SnapshotSettings,
        ours: SnapshotSettings,
    },
    /// The file ends before its end frame.
    #[error("truncated: it ends at byte {offset}, before its end frame")]
    Truncated { offset: u64 },
    /// A frame's checksum does not match its bytes.
    #[error("damaged: the checksum of frame {frame} (at byte {offset}) does not match")]
    Checksum { frame: u64, offset: u64 },
    /// The checksums match but the contents do not make sense.
    #[error("invalid at byte {offset}: {why}")]
    Invalid { offset: u64, why: &'static str },
    /// A replication batch of an older format's file does not follow its format.
    #[error("invalid at byte {offset}: {source}")]
    Batch {
        offset: u64,
        #[source]
        source: ReplError,
    },
    /// Reading failed.
    #[error("read error: {0}")]
    Io(String),
}

impl SnapshotError {
    /// The byte of the file where it goes wrong (0 for an error about the whole file).
    pub fn offset(&self) -> u64 {
        match self {
            SnapshotError::Truncated { offset }
            | SnapshotError::Checksum { offset, .. }
            | SnapshotError::Invalid { offset, .. }
            | SnapshotError::Batch { offset, .. } => *offset,
            _ => 0,
        }
    }
}

/// What differs between a file's settings and the engine's, for [`SnapshotError::Settings`].
fn settings_differences(saved: &SnapshotSettings, ours: &SnapshotSettings) -> String {
    let mut out = String::new();
    if saved.record_format != ours.record_format {
        out += &format!(
            " record format {} (this kvcached: {})",
            saved.record_format, ours.record_format
        );
    }
    if saved.use_cas != ours.use_cas {
        let says = |cas: bool| if cas { "on" } else { "off (-C)" };
        out += &format!(" CAS {} (now {})", says(saved.use_cas), says(ours.use_cas));
    }
    if saved.max_item_size != ours.max_item_size {
        out += &format!(
            " item size max {} (now {})",
            saved.max_item_size, ours.max_item_size
        );
    }
    out
}

/// Writes frames and counts them for the trailer.
struct FrameWriter<'w> {
    w: &'w mut dyn Write,
    frames: u64,
    bytes: u64,
    /// Bytes written so far (the file offset).
    pos: u64,
    /// Format 3: every frame after the first has its payload on a page boundary.
    aligned: bool,
}

impl<'w> FrameWriter<'w> {
    /// A writer of the frames that follow the magic and version byte (`magic[7]`).
    fn new(w: &'w mut dyn Write, magic: &[u8]) -> Self {
        FrameWriter {
            w,
            frames: 0,
            bytes: 0,
            pos: magic.len() as u64,
            aligned: magic.get(7).is_some_and(|&v| v >= 3),
        }
    }

    /// Zero bytes up to where the next frame belongs.
    fn pad(&mut self) -> std::io::Result<()> {
        let n = gap(self.aligned, self.frames, self.pos);
        if n > 0 {
            self.w.write_all(&ZEROS[..n])?;
            self.pos += n as u64;
        }
        Ok(())
    }

    fn frame(&mut self, payload: &[u8]) -> std::io::Result<()> {
        self.pad()?;
        let len = (payload.len() as u64).to_le_bytes();
        self.w.write_all(&len)?;
        self.w.write_all(&crc(&len, payload).to_le_bytes())?;
        self.w.write_all(payload)?;
        self.frames += 1;
        self.bytes += payload.len() as u64;
        self.pos += 12 + payload.len() as u64;
        Ok(())
    }

    fn end(mut self) -> std::io::Result<()> {
        self.pad()?;
        let len = 0u64.to_le_bytes();
        let mut trailer = [0u8; 16];
        trailer[..8].copy_from_slice(&self.frames.to_le_bytes());
        trailer[8..].copy_from_slice(&self.bytes.to_le_bytes());
        self.w.write_all(&len)?;
        self.w.write_all(&crc(&len, &trailer).to_le_bytes())?;
        self.w.write_all(&trailer)
    }
}

/// Zero bytes before a frame (the `frames`th, header first) that would start at `pos`: in
/// format 3, enough that every frame after the header has its payload (12 bytes on) on a
/// page boundary.
fn gap(aligned: bool, frames: u64, pos: u64) -> usize {
    if !aligned || frames == 0 {
        return 0;
    }
    let page = PAGE as u64;
    ((page - (pos + 12) % page) % page) as usize
}

static ZEROS: [u8; PAGE] = [0; PAGE];

fn crc(len: &[u8; 8], payload: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(len);
    h.update(payload);
    h.finalize()
}

/// Where a snapshot's bytes come from: a stream, or the whole file in memory (mapped).
enum Source<'r> {
    Read(&'r mut dyn Read),
    /// The whole file; the reader's offset is the position in it.
    Bytes(&'r [u8]),
}

/// Reads and checks frames, keeping the offset for error messages.
struct FrameReader<'r> {
    src: Source<'r>,
    offset: u64,
    frames: u64,
    bytes: u64,
    max_frame: u64,
    /// Format 3: zero bytes before every frame after the header (see `gap`).
    aligned: bool,
}

/// A frame as read: where it starts, its length's bytes and its stored checksum (not yet
/// compared: see [`FrameReader::next`]), and its payload.
struct Frame<'r> {
    at: u64,
    len: [u8; 8],
    crc: u32,
    payload: Cow<'r, [u8]>,
}

impl Frame<'_> {
    fn check(&self, frame: u64) -> Result<(), SnapshotError> {
        if crc(&self.len, &self.payload) != self.crc {
            return Err(SnapshotError::Checksum {
                frame,
                offset: self.at,
            });
        }
        Ok(())
    }
}

impl<'r> FrameReader<'r> {
    fn new(src: Source<'r>, offset: u64, max_frame: u64) -> Self {
        FrameReader {
            src,
            offset,
            frames: 0,
            bytes: 0,
            max_frame,
            aligned: false,
        }
    }

    /// Another reader at the same place in the same bytes (`None` for a stream), to look
    /// ahead.
    fn fork(&self) -> Option<FrameReader<'r>> {
        match self.src {
            Source::Bytes(b) => Some(FrameReader {
                src: Source::Bytes(b),
                offset: self.offset,
                frames: self.frames,
                bytes: self.bytes,
                max_frame: self.max_frame,
                aligned: self.aligned,
            }),
            Source::Read(_) => None,
        }
    }

    /// The bytes of a file in memory from the current offset.
    fn rest(file: &[u8], offset: u64) -> &[u8] {
        usize::try_from(offset)
            .ok()
            .and_then(|o| file.get(o..))
            .unwrap_or(&[])
    }

    /// Up to `buf.len()` bytes (fewer only at the end of the file); advances the offset.
    fn some(&mut self, buf: &mut [u8]) -> Result<usize, SnapshotError> {
        let mut done = 0;
        match &mut self.src {
            Source::Bytes(file) => {
                let rest = Self::rest(file, self.offset);
                done = rest.len().min(buf.len());
                buf[..done].copy_from_slice(&rest[..done]);
            }
            Source::Read(r) => {
                while done < buf.len() {
                    match r.read(&mut buf[done..]) {
                        Ok(0) => break,
                        Ok(n) => done += n,
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(e) => return Err(SnapshotError::Io(e.to_string())),
                    }
                }
            }
        }
        self.offset += done as u64;
        Ok(done)
    }

    fn exact(&mut self, buf: &mut [u8]) -> Result<(), SnapshotError> {
        let at = self.offset;
        let n = self.some(buf)?;
        if n < buf.len() {
            return Err(SnapshotError::Truncated {
                offset: at + n as u64,
            });
        }
        Ok(())
    }

    /// `len` payload bytes: borrowed from a file in memory, or read (only as many as the
    /// stream holds: a length that runs past the end of a short file costs only the bytes
    /// that are there).
    fn payload(&mut self, len: u64) -> Result<Cow<'r, [u8]>, SnapshotError> {
        let at = self.offset;
        let got: Cow<'r, [u8]> = match &mut self.src {
            Source::Bytes(file) => {
                let file: &'r [u8] = file;
                let rest = Self::rest(file, at);
                let n = usize::try_from(len).map_or(rest.len(), |l| l.min(rest.len()));
                Cow::Borrowed(&rest[..n])
            }
            Source::Read(r) => {
                let mut v = Vec::new();
                if let Err(e) = (&mut **r).take(len).read_to_end(&mut v) {
                    return Err(SnapshotError::Io(e.to_string()));
                }
                Cow::Owned(v)
            }
        };
        if (got.len() as u64) < len {
            return Err(SnapshotError::Truncated {
                offset: at + got.len() as u64,
            });
        }
        self.offset += len;
        Ok(got)
    }

    /// The next frame's payload, or None after a valid end frame (and nothing after it).
    fn next(&mut self) -> Result<Option<Cow<'r, [u8]>>, SnapshotError> {
        let frame = self.frames;
        let Some(f) = self.next_unchecked()? else {
            return Ok(None);
        };
        f.check(frame)?;
        Ok(Some(f.payload))
    }

    /// The next frame, its checksum not compared (the caller does, where it reads the
    /// payload anyway), or None after a valid end frame (and nothing after it).
    fn next_unchecked(&mut self) -> Result<Option<Frame<'r>>, SnapshotError> {
        let gap = gap(self.aligned, self.frames, self.offset);
        if gap > 0 {
            let at = self.offset;
            let mut pad = [0u8; PAGE];
            self.exact(&mut pad[..gap])?;
            if pad[..gap].iter().any(|&b| b != 0) {
                return Err(SnapshotError::Invalid {
                    offset: at,
                    why: "the gap before a frame is not zero",
                });
            }
        }
        let at = self.offset;
        let mut head = [0u8; 12];
        self.exact(&mut head)?;
        let mut len_bytes = [0u8; 8];
        len_bytes.copy_from_slice(&head[..8]);
        let len = u64::from_le_bytes(len_bytes);
        let want = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
        let frame = self.frames;
        if len == 0 {
            let mut trailer = [0u8; 16];
            self.exact(&mut trailer)?;
            if crc(&len_bytes, &trailer) != want {
                return Err(SnapshotError::Checksum { frame, offset: at });
            }
            let count = u64::from_le_bytes(trailer[..8].try_into().unwrap_or_default());
            let bytes = u64::from_le_bytes(trailer[8..].try_into().unwrap_or_default());
            if (count, bytes) != (self.frames, self.bytes) {
                return Err(SnapshotError::Invalid {
                    offset: at,
                    why: "the end frame counts other frames than the file holds",
                });
            }
            let end = self.offset;
            let mut more = [0u8; 1];
            return match self.some(&mut more)? {
                0 => Ok(None),
                _ => Err(SnapshotError::Invalid {
                    offset: end,
                    why: "data after the end frame",
                }),
            };
        }
        if len > self.max_frame {
            // A damaged length: never allocate what it claims.
            return Err(SnapshotError::Checksum { frame, offset: at });
        }
        let payload = self.payload(len)?;
        self.frames += 1;
        self.bytes += len;
        Ok(Some(Frame {
            at,
            len: len_bytes,
            crc: want,
            payload,
        }))
    }
}

impl LogEngine {
    /// The settings a snapshot of this engine is saved with, and must have to load.
    pub fn snapshot_settings(&self) -> SnapshotSettings {
        SnapshotSettings {
            record_format: RECORD_FORMAT,
            use_cas: self.config.use_cas,
            max_item_size: self.config.max_item_size as u64,
        }
    }

    /// Write a snapshot of every live item (see the module documentation): one segment
    /// image per segment that holds any, oldest first. Meant for a quiescent engine (at
    /// shutdown): writes that race with it may or may not be in the snapshot. `saved_at`
    /// is recorded in the header. Returns the record bytes written.
    pub fn dump(&self, w: &mut dyn Write, saved_at: u64) -> std::io::Result<u64> {
        // With a tier, its pages first (oldest first): each a flash frame naming the page
        // and the live records the index points at in it.
        let pages = self.pages_to_save()?;
        let live = self.flash_offsets(&pages);
        let mut magic = [0u8; 8];
        magic[..7].copy_from_slice(MAGIC);
        magic[7] = if live.is_empty() {
            MEMORY_VERSION
        } else {
            SNAPSHOT_VERSION
        };
        w.write_all(&magic)?;
        let mut fw = FrameWriter::new(w, &magic);
        fw.frame(&self.snapshot_header(saved_at))?;
        let now = self.clock.load(Ordering::Relaxed);
        let mut image = Vec::new();
        let mut bytes = 0u64;
        for (id, page) in &pages {
            let Some(offsets) = live.get(id) else {
                continue;
            };
            flash_frame(page, offsets, &mut image);
            fw.frame(&image)?;
            bytes += self.segs.get(*id).map_or(0, |s| s.live_bytes());
        }
        for (seq, id) in self.order.live() {
            if let Some(live) = self.segment_image(seq, id, now, &mut image) {
                bytes += live;
                fw.frame(&image)?;
            }
        }
        fw.end()?;
        Ok(bytes)
    }

    /// The header frame's payload.
    fn snapshot_header(&self, saved_at: u64) -> Vec<u8> {
        let s = self.snapshot_settings();
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.push(s.record_format);
        header.push(u8::from(s.use_cas));
        header.extend_from_slice(&s.max_item_size.to_le_bytes());
        let stats = self.stats();
        header.extend_from_slice(&stats.curr_items.to_le_bytes());
        header.extend_from_slice(&saved_at.to_le_bytes());
        header.extend_from_slice(&stats.bytes.to_le_bytes());
        header
    }

    /// Put into `out` an image of segment `id` (if it still has number `seq`): its header
    /// (the same kind and CAS base, no number), its records byte for byte up to its
    /// published length, then the offsets of the records the index points at (u32 each),
    /// the published length (u32) and the number of offsets (u32). The live records' bytes,
    /// or None if it holds none.
    fn segment_image(&self, seq: u64, id: u32, now: Time, out: &mut Vec<u8>) -> Option<u64> {
        out.clear();
        let _pin = self.pin();
        let seg = self.segs.get(id)?;
        if seg.seq() != seq {
            return None;
        }
        let used = seg.used();
        let ptr = seg.ptr()?;
        let used32 = u32::try_from(used).ok()?;
        let kind = if seg.is_large() {
            format::SEG_KIND_LARGE
        } else {
            format::SEG_KIND_REGULAR
        };
        // SAFETY: pinned, and the segment is still live (its number did not change since
        // the pin was taken), so it is not reused before we unpin.
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        out.resize(SEG_HDR, 0);
        // SAFETY: `out` holds SEG_HDR bytes that only we touch.
        unsafe { format::write_seg_header(out.as_mut_ptr(), kind, 0, base) };
        // SAFETY: as above; `used` is the published length, and a pinned live segment's
        // published records do not change.
        out.extend_from_slice(unsafe {
            std::slice::from_raw_parts(ptr.as_ptr().add(SEG_HDR), used.saturating_sub(SEG_HDR))
        });
        let (mut n, mut live) = (0u32, 0u64);
        // SAFETY: as above.
        unsafe {
            compact::for_records(ptr, used, |here, r| {
                if r.kind == KIND_ITEM
                    && self.vis(r, now) == Vis::Live
                    && self.indexed_at(r.key, id, here)
                {
                    out.extend_from_slice(&(here as u32).to_le_bytes());
                    n += 1;
                    live += r.len as u64;
                }
                true
            })
        };
        out.extend_from_slice(&used32.to_le_bytes());
        out.extend_from_slice(&n.to_le_bytes());
        (n > 0).then_some(live)
    }

    /// The offsets the index points at in each of the bound segments `pages` names, in
    /// order (one pass over the index; records that expired meanwhile are left to the
    /// load to skip).
    fn flash_offsets(
        &self,
        pages: &[(u32, SavedPage)],
    ) -> std::collections::HashMap<u32, Vec<u32>> {
        let mut live: std::collections::HashMap<u32, Vec<u32>> =
            pages.iter().map(|(id, _)| (*id, Vec::new())).collect();
        if live.is_empty() {
            return live;
        }
        self.for_each_indexed(|_, v| {
            if let Some(offs) = live.get_mut(&index::slot_seg(v)) {
                offs.push(index::slot_off(v) as u32);
            }
        });
        live.retain(|_, offs| {
            offs.sort_unstable();
            offs.dedup();
            !offs.is_empty()
        });
        live
    }

    /// Read a snapshot's header: its format, settings and item count, without loading it.
    pub fn snapshot_info(r: &mut dyn Read) -> Result<SnapshotInfo, SnapshotError> {
        read_header(&mut FrameReader::new(Source::Read(r), 0, HEADER_LEN as u64))
    }

    /// Load a snapshot written by [`LogEngine::dump`] into this (empty) engine; returns
    /// the record bytes loaded. Every frame is checked before it is applied, and the file
    /// must end with its end frame; on any error the engine is left empty.
    pub fn restore(&self, r: &mut dyn Read, now: Time) -> Result<u64, SnapshotError> {
        self.restore_from(Source::Read(r), None, now)
    }

    /// [`LogEngine::restore`] from the whole file in memory: the frames are checked where
    /// they are; segment images are copied into segment memory.
    pub fn restore_bytes(&self, file: &[u8], now: Time) -> Result<u64, SnapshotError> {
        self.restore_from(Source::Bytes(file), None, now)
    }

    /// [`LogEngine::restore`] from a snapshot file. When no name reaches the file any more
    /// (the caller removed it after opening it), its segment images become segments as
    /// private mappings of it (nothing is copied; a page is copied only if it is written,
    /// and segments are never written in place), so the load only checks them and builds
    /// the index. A file that still has a name is read as a stream and copied: another
    /// process could truncate it, and a mapped page past a file's end cannot be read
    /// (SIGBUS), during the load or at any later read of an item.
    pub fn restore_file(&self, file: &std::fs::File, now: Time) -> Result<u64, SnapshotError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let meta = file
            .metadata()
            .map_err(|e| SnapshotError::Io(e.to_string()))?;
        let nameless = meta.nlink() == 0;
        let Some(map) = usize::try_from(meta.len())
            .ok()
            .filter(|_| nameless)
            .and_then(|l| ReadMap::new(file.as_raw_fd(), l))
        else {
            // Named, empty, or a special file: read as a stream.
            let mut r = std::io::BufReader::with_capacity(1 << 20, file);
            return self.restore_from(Source::Read(&mut r), None, now);
        };
        self.restore_from(Source::Bytes(map.bytes()), Some(file.as_raw_fd()), now)
    }

    fn restore_from(
        &self,
        src: Source<'_>,
        fd: Option<std::os::fd::RawFd>,
        now: Time,
    ) -> Result<u64, SnapshotError> {
        let mut fr = FrameReader::new(src, 0, HEADER_LEN as u64);
        let result = read_header(&mut fr).and_then(|info| {
            // A file of an older format holds records of its own format, which its loader
            // reads.
            let ours = SnapshotSettings {
                record_format: record_format_of(info.version),
                ..self.snapshot_settings()
            };
            if info.settings != ours {
                return Err(SnapshotError::Settings {
                    saved: info.settings,
                    ours,
                });
            }
            if info.version >= 3 {
                self.restore_images(fr, fd, info, now)
            } else {
                self.restore_batches(fr, info, now)
            }
        });
        if result.is_err() {
            self.wipe();
        }
        result
    }

    /// Load a format 3 file's segment images (see the module documentation). The frames
    /// are read here; worker threads map (or copy) each image, check it against its
    /// checksum and index it.
    fn restore_images(
        &self,
        mut fr: FrameReader<'_>,
        fd: Option<std::os::fd::RawFd>,
        info: SnapshotInfo,
        now: Time,
    ) -> Result<u64, SnapshotError> {
        // The index is sized for the items at once, and no chain is compacted while they
        // are loaded (splits still happen if the header's count was short).
        let _bulk = self.bulk_load(info.items);
        // An image holds at most a regular segment, or one item in a large one.
        fr.max_frame = (index::MAX_OFFSET + self.config.max_item_size + (64 << 10)) as u64;
        let first = self.first_image_that_fits(&fr);
        // Flash frames (format 5, before the images) are checked and kept here, and
        // loaded after the images.
        let mut on_flash = Vec::new();
        let loaded = fan_out(
            |send| loop {
                let no = fr.frames;
                let Some(frame) = fr.next_unchecked()? else {
                    return Ok(());
                };
                if is_flash_frame(&frame.payload) {
                    if info.version < 5 {
                        return Err(SnapshotError::Invalid {
                            offset: frame.at,
                            why: "a flash frame in a file of a format without them",
                        });
                    }
                    frame.check(no)?;
                    let page = parse_flash_frame(&frame.payload).map_err(|why| {
                        SnapshotError::Invalid {
                            offset: frame.at,
                            why,
                        }
                    })?;
                    on_flash.push(page);
                    continue;
                }
                if no < first {
                    // Older than what fits in memory: read past (the file's structure is
                    // still checked to its end frame), not mapped, copied or checked.
                    continue;
                }
                if !send((no, frame)) {
                    return Ok(());
                }
            },
            Loaded::default,
            |total, (no, frame)| {
                if info.version >= 4 {
                    total.add(self.load_image(no, &frame, fd, now)?);
                } else {
                    frame.check(no)?;
                    let replayed = self.replay_image_1(&frame.payload, now).map_err(|why| {
                        SnapshotError::Invalid {
                            offset: frame.at,
                            why,
                        }
                    })?;
                    total.add(replayed);
                }
                Ok(())
            },
        )?;
        let mut total = Loaded::default();
        for l in loaded {
            total.add(l);
        }
        total.add(self.restore_flash(on_flash, now)?);
        self.cas.observe(total.cas);
        self.stamps.observe(total.stamp.saturating_add(1));
        // A file saved with a larger memory limit: the oldest segments go.
        self.shrink();
        Ok(total.bytes)
    }

    /// The number of the first image frame to load: images are written oldest first, and
    /// a file saved with a larger memory limit than this engine's has more than fit. Only
    /// the newest images whose memory (rounded to pages) fits the segment budget are
    /// loaded, so a restart with a smaller `-m` never maps or copies the whole file (the
    /// oldest segments would be evicted right after anyway). Looks ahead through the frame
    /// headers only, twice (a total, then the cut); a stream (no look-ahead) loads every
    /// image and shrinks afterwards.
    fn first_image_that_fits(&self, fr: &FrameReader<'_>) -> u64 {
        // (frame number, memory) of each image ahead, read by a reader of its own; it
        // stops at the end, at a damaged frame (the load itself reports it), or on a stream.
        let images = || {
            let mut scan = fr.fork();
            std::iter::from_fn(move || loop {
                let scan = scan.as_mut()?;
                let no = scan.frames;
                let frame = scan.next_unchecked().ok()??;
                // A flash frame takes no segment memory.
                if !is_flash_frame(&frame.payload) {
                    return Some((no, frame.payload.len().div_ceil(PAGE) * PAGE));
                }
            })
        };
        let mut ahead = images().fold(0usize, |sum, (_, cap)| sum.saturating_add(cap));
        let budget = self.budget();
        let mut first = 0;
        for (no, cap) in images() {
            if ahead <= budget {
                return no;
            }
            ahead -= cap;
            first = no + 1;
        }
        first
    }

    /// Check the `no`th frame, a segment image, against its checksum and make it a
    /// segment: a private mapping of the file where there is one (`fd`) and the image is
    /// on a page boundary in it, else a copy.
    fn load_image(
        &self,
        no: u64,
        frame: &Frame<'_>,
        fd: Option<std::os::fd::RawFd>,
        now: Time,
    ) -> Result<Loaded, SnapshotError> {
        let len = frame.payload.len();
        let cap = len.div_ceil(PAGE) * PAGE;
        let checksum = SnapshotError::Checksum {
            frame: no,
            offset: frame.at,
        };
        let start = frame.at + 12;
        let mapped = match (fd, &frame.payload) {
            (Some(fd), Cow::Borrowed(_)) if start % PAGE as u64 == 0 => {
                mem::map_file(fd, start, cap)
            }
            _ => None,
        };
        let (ptr, file) = match mapped {
            Some(p) => {
                // Not populated up front: the checksum's reads fault the pages in, and a
                // read fault maps a run of the file's pages at once (fault-around).
                // SAFETY: `p` maps `cap >= len` bytes of the file that nothing writes.
                let image = unsafe { std::slice::from_raw_parts(p.as_ptr(), len) };
                if crc(&frame.len, image) != frame.crc {
                    // SAFETY: our mapping of `cap` bytes, not used past this point.
                    unsafe { mem::unmap(p, cap) };
                    return Err(checksum);
                }
                (p, true)
            }
            None => {
                frame.check(no)?;
                let p = mem::map(cap).ok_or(SnapshotError::Io(
                    "out of memory for a segment image".to_string(),
                ))?;
                // SAFETY: `p` is a fresh mapping of `cap >= len` bytes.
                unsafe { std::ptr::copy_nonoverlapping(frame.payload.as_ptr(), p.as_ptr(), len) };
                (p, false)
            }
        };
        self.adopt_image(ptr, cap, len, file, now)
            .map_err(|why| SnapshotError::Invalid {
                offset: frame.at,
                why,
            })
    }

    /// Make the segment image at `ptr` (`len` bytes of a `cap`-byte mapping of ours,
    /// checked against its checksum; `file`: a private mapping of the snapshot file) a
    /// sealed segment, and index the live records its list names. On an error the mapping
    /// is the engine's (released with the rest when the caller wipes) or unmapped.
    fn adopt_image(
        &self,
        ptr: std::ptr::NonNull<u8>,
        cap: usize,
        len: usize,
        file: bool,
        now: Time,
    ) -> Result<Loaded, &'static str> {
        // SAFETY: `ptr .. ptr + len` is our mapping, written by nobody.
        let image = unsafe { std::slice::from_raw_parts(ptr.as_ptr(), len) };
        let checked = image_layout(image);
        let (used, offsets) = match checked {
            Ok(layout) => layout,
            Err(why) => {
                // SAFETY: the mapping is still only ours, and unused past this point.
                unsafe { mem::unmap(ptr, cap) };
                return Err(why);
            }
        };
        let large = image.get(5) == Some(&format::SEG_KIND_LARGE);
        let Some(id) = self.install_segment(&mut self.arena.pool(), ptr, cap, large, file) else {
            // SAFETY: as above.
            unsafe { mem::unmap(ptr, cap) };
            return Err("no segment id left");
        };
        // SAFETY: the header's bytes are readable (`used > SEG_HDR`).
        let base = unsafe { format::seg_cas_base(ptr.as_ptr()) };
        let seg = self.segs.get(id).ok_or("no segment id left")?;
        {
            // The header keeps the image's zero sequence number: the segment's number is
            // the one its header `Seg` keeps (nothing reads the header's), and leaving the page
            // unwritten leaves it shared with the file.
            let mut order = self.order.lock();
            let seq = order.number(id, false);
            seg.publish_sealed(seq, used);
            // Its records were written before the restart; their times are not kept.
            seg.note_written(SEG_HDR, now);
        }
        // In the FIFO before its items are indexed: a failed restore wipes the index and
        // frees every segment the FIFO holds.
        self.eviction.push(id, Queue::Small);
        let image = image.as_ptr();
        let mut loaded = Loaded::default();
        // Counted once per image rather than per item (the restore threads would share
        // the counters' cache lines).
        let mut acct = ImageAcct::default();
        // The next PREFETCH records are parsed and their keys hashed ahead, and their
        // buckets loaded while this one is indexed (see `apply_records`).
        let mut ring: [(usize, u64, Option<Rec<'_>>); PREFETCH] = [(0, 0, None); PREFETCH];
        let mut walk = || -> Result<(), &'static str> {
            let mut ahead = offsets.chunks_exact(4).map(|o| {
                let mut b = [0u8; 4];
                b.copy_from_slice(o);
                u32::from_le_bytes(b) as usize
            });
            let (mut queued, mut done, mut last) = (0usize, 0usize, None);
            loop {
                while queued < PREFETCH {
                    let Some(off) = ahead.next() else { break };
                    if off < SEG_HDR || last.is_some_and(|l| off <= l) {
                        return Err("a live record's offset out of order");
                    }
                    last = Some(off);
                    // The record's first lines, a few records ahead.
                    index::prefetch(image.wrapping_add(off.min(used)).cast());
                    // SAFETY: the image is `used` bytes of our mapping that nothing writes
                    // now; `read` checks every length against `used`.
                    let r = unsafe { format::read(image, used, off, base) }.ok_or("bad record")?;
                    let h = self.hash(r.key);
                    self.index.prefetch(h);
                    ring[(done + queued) % PREFETCH] = (off, h, Some(r));
                    queued += 1;
                }
                if queued == 0 {
                    return Ok(());
                }
                let (off, h, Some(r)) = ring[done % PREFETCH] else {
                    return Ok(());
                };
                queued -= 1;
                done += 1;
                if r.kind != KIND_ITEM {
                    return Err("a record that is not an item");
                }
                if r.key.len() > MAX_KEY || r.value.len() > self.config.max_item_size {
                    return Err("an item larger than allowed");
                }
                if large && (done > 1 || off != SEG_HDR) {
                    return Err("a large segment image with more than one record");
                }
                loaded.cas = loaded.cas.max(r.cas.saturating_add(1));
                loaded.stamp = loaded.stamp.max(r.stamp);
                loaded.bytes += r.len as u64;
                if self.vis(&r, now) == Vis::Live && self.adopt_record(id, off, &r, h) {
                    acct.add(self, self.rec_size(&r), r.len, r.exptime);
                }
            }
        };
        // Counted even when the image turns out bad: a failed restore unlinks what was
        // indexed, and takes it off the counts.
        let walked = walk();
        acct.flush(self, seg);
        // Every place of the image names a unique: new writes go above them all.
        loaded.cas = loaded
            .cas
            .max(format::natural_cas(base, used).saturating_add(1));
        walked.map(|()| loaded)
    }

    /// Load the flash frames of a snapshot into the tier just opened: claim the pages they
    /// name, read each whole (checked block by block) on the restore threads, make it a
    /// bound segment and index the live records its frame lists. A page that cannot be
    /// used (no tier, another file, unreadable) loses its items, counted
    /// ([`LogEngine::flash_restore`]); the rest of the snapshot still loads.
    fn restore_flash(
        &self,
        frames: Vec<(SavedPage, Vec<u32>)>,
        now: Time,
    ) -> Result<Loaded, SnapshotError> {
        let mut report = FlashRestore::default();
        if frames.is_empty() {
            *super::sync::lock(&self.restored) = report;
            return Ok(Loaded::default());
        }
        let pages: Vec<SavedPage> = frames.iter().map(|(p, _)| *p).collect();
        let claimed = self.claim_saved(&pages);
        let jobs: Vec<(usize, SavedPage, Vec<u32>)> = frames
            .into_iter()
            .zip(claimed)
            .enumerate()
            .filter_map(|(no, ((p, offs), ok))| ok.then_some((no, p, offs)))
            .collect();
        report.pages_lost = (pages.len() - jobs.len()) as u64;
        let mut jobs = jobs.into_iter();
        let done = fan_out(
            |send| {
                for job in jobs.by_ref() {
                    if !send(job) {
                        break;
                    }
                }
                Ok(())
            },
            || (Loaded::default(), Vec::new(), FlashRestore::default()),
            |(total, bound, report), (no, page, offsets)| {
                let Some(image) = self.read_saved(&page) else {
                    report.pages_lost += 1;
                    return Ok(());
                };
                let Some(id) = self.bind_saved(&page) else {
                    report.pages_lost += 1;
                    return Ok(());
                };
                let (loaded, items) = self.adopt_flash_page(id, &page, &image, &offsets, now);
                total.add(loaded);
                bound.push((no, id));
                report.pages += 1;
                report.items += items;
                Ok(())
            },
        )?;
        let mut total = Loaded::default();
        let mut bound = Vec::new();
        for (loaded, ids, r) in done {
            total.add(loaded);
            bound.extend(ids);
            report.pages += r.pages;
            report.items += r.items;
            report.pages_lost += r.pages_lost;
        }
        bound.sort_unstable();
        self.order_saved(bound.into_iter().map(|(_, id)| id));
        *super::sync::lock(&self.restored) = report;
        Ok(total)
    }

    /// Index the records at `offsets` of flash page `page` (its image, read back), now
    /// bound segment `id`: the live ones the index holds nothing newer of. A record that
    /// does not parse ends the page (its blocks' checks passed, so this is not expected;
    /// what was indexed before it stays). Returns what was loaded and the items indexed.
    fn adopt_flash_page(
        &self,
        id: u32,
        page: &SavedPage,
        image: &[u8],
        offsets: &[u32],
        now: Time,
    ) -> (Loaded, u64) {
        let mut loaded = Loaded::default();
        let mut acct = ImageAcct::default();
        for &off in offsets {
            let off = off as usize;
            if off < SEG_HDR {
                break;
            }
            // SAFETY: `image` is ours; `read` checks every length against its end.
            let Some(r) = (unsafe { format::read(image.as_ptr(), image.len(), off, page.base) })
            else {
                break;
            };
            if r.kind != KIND_ITEM
                || r.key.len() > MAX_KEY
                || r.value.len() > self.config.max_item_size
            {
                continue;
            }
            loaded.cas = loaded.cas.max(r.cas.saturating_add(1));
            loaded.stamp = loaded.stamp.max(r.stamp);
            loaded.bytes += r.len as u64;
            if self.vis(&r, now) == Vis::Live && self.adopt_record(id, off, &r, self.hash(r.key)) {
                acct.add(self, self.rec_size(&r), r.len, r.exptime);
            }
        }
        let items = acct.items;
        if let Some(seg) = self.segs.get(id) {
            // Its records were written before the restart; their times are not kept.
            seg.note_written(SEG_HDR, now);
            acct.flush(self, seg);
        }
        loaded.cas = loaded
            .cas
            .max(format::natural_cas(page.base, page.used).saturating_add(1));
        (loaded, items)
    }

    /// What the last restore did with the flash pages its snapshot named.
    pub fn flash_restore(&self) -> FlashRestore {
        *super::sync::lock(&self.restored)
    }

    /// Load a segment image of snapshot format 3 (the live records of a segment, in record
    /// format 1): each item is written anew through the write path, with its version.
    fn replay_image_1(&self, image: &[u8], now: Time) -> Result<Loaded, &'static str> {
        let len = image.len();
        let kind = image.get(5).copied();
        if len <= SEG_HDR {
            return Err("a segment image without records");
        }
        if image[..4] != format::SEG_MAGIC.to_le_bytes() || image[4] != format::v1::SEG_VERSION {
            return Err("a segment image without a segment header");
        }
        if kind != Some(format::SEG_KIND_REGULAR) && kind != Some(format::SEG_KIND_LARGE) {
            return Err("a segment image of an unknown kind");
        }
        // SAFETY: the header's bytes are readable (`len > SEG_HDR`).
        let base = unsafe { format::seg_cas_base(image.as_ptr()) };
        let st = ReplicaState::new();
        let mut loaded = Loaded::default();
        let mut off = SEG_HDR;
        while off < len {
            // SAFETY: `image` is a live slice nobody writes; `read` checks every length.
            let r =
                unsafe { format::v1::read(image.as_ptr(), len, off, base) }.ok_or("bad record")?;
            off += r.len;
            if r.kind != KIND_ITEM {
                return Err("a record that is not an item");
            }
            if r.key.len() > MAX_KEY || r.value.len() > self.config.max_item_size {
                return Err("an item larger than allowed");
            }
            loaded.cas = loaded.cas.max(r.cas.saturating_add(1));
            loaded.stamp = loaded.stamp.max(r.stamp);
            loaded.bytes += r.len as u64;
            if self.vis(&r, now) == Vis::Live {
                self.apply_item(&st, &r, self.hash(r.key), now);
            }
        }
        Ok(loaded)
    }

    /// Index the live record `r` at `off` in segment `id` (being adopted), unless the
    /// index holds the same key with a version at least as new. True if indexed; the
    /// caller counts it (`ImageAcct`).
    fn adopt_record(&self, id: u32, off: usize, r: &Rec<'_>, h: u64) -> bool {
        let v = index::pack(self.index.tag(h), id, off as u32, 0, false);
        let _g = self.index.lock(h);
        // The key's next version goes above this one (see `cas.rs`).
        self.index.raise_floor(h, r.cas.saturating_add(1));
        let mut fetch = super::flash::Fetch::default();
        // SAFETY: we hold `h`'s stripe lock.
        match unsafe { self.lookup(h, r.key, &mut fetch) } {
            Some((slot, old_v, old)) => {
                if (old.cas, old.stamp) >= (r.cas, r.stamp) {
                    return false;
                }
                slot.store(v);
                self.account_remove(old_v, old.len, self.rec_size(&old));
            }
            None => match self.index.insert(h, v) {
                Insert::Stored => {}
                Insert::Victim(slot) => {
                    self.evict_index_slot(slot, slot.load(), v);
                }
                Insert::Full => {
                    self.count_index_eviction();
                    return false;
                }
            },
        }
        true
    }

    /// Load a format 2 file: a reset batch, then replication snapshot batches applied
    /// through the write path.
    fn restore_batches(
        &self,
        mut fr: FrameReader<'_>,
        info: SnapshotInfo,
        now: Time,
    ) -> Result<u64, SnapshotError> {
        // The index is sized for the items at once, and no chain is compacted while they
        // are loaded (splits still happen if the header's count was short).
        let _bulk = self.bulk_load(info.items);
        // A batch holds its budget and at most one record more.
        fr.max_frame = (BATCH_BUDGET + self.config.max_item_size + (64 << 10)) as u64;
        let invalid = |offset, source: ReplError| SnapshotError::Batch { offset, source };
        // The reset batch first, alone: it sets up the cursor every snapshot batch is
        // checked against.
        let mut st = ReplicaState::new();
        let at = fr.offset;
        let first = fr.next()?.ok_or(SnapshotError::Invalid {
            offset: at,
            why: "no reset batch",
        })?;
        if first.get(5) != Some(&KIND_RESET) {
            return Err(SnapshotError::Invalid {
                offset: at,
                why: "the first batch is not a reset",
            });
        }
        self.apply_batch(&mut st, &first, now, true)
            .map_err(|e| invalid(at, e))?;
        drop(first);
        // Snapshot batches hold live items, each applied with its version (the highest
        // wins), so they may be applied in any order: worker threads apply them while this
        // one reads and checks the file.
        let states = fan_out(
            |send| {
                let mut done = false;
                loop {
                    let at = fr.offset;
                    let Some(frame) = fr.next()? else {
                        return Ok(());
                    };
                    // Batch header: magic (4), version, kind, flags (see FORMAT.md).
                    if done || frame.get(5) != Some(&KIND_SNAPSHOT) {
                        return Err(SnapshotError::Invalid {
                            offset: at,
                            why: "not a snapshot batch where one belongs",
                        });
                    }
                    done = frame.get(6).is_some_and(|f| f & FLAG_DONE != 0);
                    if !send((at, frame)) {
                        return Ok(());
                    }
                }
            },
            || (st.clone(), 0u64),
            |(mine, bytes), (at, frame)| {
                let before = mine.applied_bytes;
                self.apply_batch(mine, &frame, now, true)
                    .map_err(|e| invalid(at, e))?;
                *bytes += mine.applied_bytes - before;
                Ok(())
            },
        )?;
        let mut bytes = st.applied_bytes;
        let mut done = false;
        for (mine, b) in states {
            bytes += b;
            done |= mine.phase == Phase::Tail;
        }
        if !done {
            return Err(SnapshotError::Invalid {
                offset: fr.offset,
                why: "the snapshot's last batch is missing",
            });
        }
        Ok(bytes)
    }
}

/// Run `read` on this thread, which hands each frame it reads to its argument (false: stop
/// reading), while worker threads `apply` the frames, each folding them into its own state
/// (from `init`); at most two frames per worker wait. A worker that meets an error applies
/// nothing more but still takes frames off the queue (so the reader never waits on a full
/// one), and the reader stops early. Several frames may be bad, and which worker met which
/// depends on scheduling: the verdict is the error at the smallest offset, the reader's or
/// a worker's, the same for every run.
fn fan_out<J: Send, T: Send>(
    read: impl FnOnce(&mut dyn FnMut(J) -> bool) -> Result<(), SnapshotError>,
    init: impl Fn() -> T + Sync,
    apply: impl Fn(&mut T, J) -> Result<(), SnapshotError> + Sync,
) -> Result<Vec<T>, SnapshotError> {
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .clamp(1, RESTORE_THREADS);
    let (tx, rx) = std::sync::mpsc::sync_channel::<J>(2 * workers);
    let rx = std::sync::Mutex::new(rx);
    let failed = AtomicBool::new(false);
    let worker_failed = || SnapshotError::Invalid {
        offset: 0,
        why: "restore worker failed",
    };
    let (read, results) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                let (rx, failed, init, apply) = (&rx, &failed, &init, &apply);
                s.spawn(move || -> Result<T, SnapshotError> {
                    let mut state = init();
                    let mut error = None;
                    loop {
                        let job = match rx.lock() {
                            Ok(q) => q.recv(),
                            Err(_) => return Err(worker_failed()),
                        };
                        let Ok(job) = job else {
                            return error.map_or(Ok(state), Err);
                        };
                        if error.is_none() {
                            if let Err(e) = apply(&mut state, job) {
                                failed.store(true, Ordering::Relaxed);
                                error = Some(e);
                            }
                        }
                    }
                })
            })
            .collect();
        let read = read(&mut |job| !failed.load(Ordering::Relaxed) && tx.send(job).is_ok());
        drop(tx);
        let results: Vec<_> = handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(worker_failed())))
            .collect();
        (read, results)
    });
    let mut first_error: Option<SnapshotError> = read.err();
    let mut states = Vec::with_capacity(results.len());
    for res in results {
        match res {
            Ok(t) => states.push(t),
            Err(e) => {
                if first_error.as_ref().is_none_or(|f| e.offset() < f.offset()) {
                    first_error = Some(e);
                }
            }
        }
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(states),
    }
}

/// The items a segment image gave the index, counted as `account_add` counts each, and
/// added to the engine's counters at once. Runs of items of one size count in the size
/// tally together.
#[derive(Default)]
struct ImageAcct {
    items: u64,
    bytes: u64,
    max_exp: Time,
    /// The earliest expiry (0: none yet).
    min_exp: Time,
    /// The current run: its items' size and their number.
    run: (usize, i64),
}

impl ImageAcct {
    fn add(&mut self, e: &LogEngine, size: usize, len: usize, exptime: Time) {
        self.items += 1;
        self.bytes += len as u64;
        self.max_exp = self
            .max_exp
            .max(if exptime == 0 { Time::MAX } else { exptime });
        if exptime != 0 && (self.min_exp == 0 || exptime < self.min_exp) {
            self.min_exp = exptime;
        }
        if self.run.0 != size {
            self.tally_run(e);
            self.run.0 = size;
        }
        self.run.1 += 1;
    }

    fn tally_run(&mut self, e: &LogEngine) {
        if let (Some(t), n @ 1..) = (e.tally.get(), self.run.1) {
            t.count(self.run.0, n);
        }
        self.run.1 = 0;
    }

    /// Add the counts to the engine's and to segment `seg`'s.
    fn flush(mut self, e: &LogEngine, seg: &Seg) {
        self.tally_run(e);
        if self.items == 0 {
            return;
        }
        e.stats.add_live(self.items as i64);
        seg.add_live(self.items, self.bytes);
        seg.note_latest_expiry(self.max_exp);
        if self.min_exp != 0 {
            seg.note_expiry(self.min_exp);
        }
    }
}

/// What loading segment images gave: the record bytes they hold, and the version counters
/// to continue from.
#[derive(Default)]
struct Loaded {
    bytes: u64,
    cas: u64,
    stamp: u64,
}

impl Loaded {
    fn add(&mut self, o: Loaded) {
        self.bytes += o.bytes;
        self.cas = self.cas.max(o.cas);
        self.stamp = self.stamp.max(o.stamp);
    }
}

/// A whole file mapped read-only (its pages are read only where frames are looked at).
struct ReadMap {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl ReadMap {
    fn new(fd: std::os::fd::RawFd, len: usize) -> Option<ReadMap> {
        Some(ReadMap {
            ptr: mem::map_file_read(fd, len)?,
            len,
        })
    }

    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for ReadMap {
    fn drop(&mut self) {
        // SAFETY: our mapping of `len` bytes from `map_file_read`; no borrow of it
        // outlives `self`.
        unsafe { mem::unmap(self.ptr, self.len) };
    }
}

/// A snapshot file's first 8 bytes (magic and version) and its frames' payloads (the header
/// first), each frame's checksum checked. For tests and fuzzing, which damage a real file's
/// frames and join them again.
#[doc(hidden)]
pub fn split_snapshot_frames(file: &[u8]) -> Result<(Vec<u8>, Vec<Vec<u8>>), SnapshotError> {
    let magic = file.get(..8).ok_or(SnapshotError::NotSnapshot)?;
    let mut fr = FrameReader::new(Source::Bytes(file), 8, u64::MAX);
    fr.aligned = magic[7] >= 3;
    let mut frames = Vec::new();
    while let Some(f) = fr.next()? {
        frames.push(f.into_owned());
    }
    Ok((magic.to_vec(), frames))
}

/// A snapshot file of `magic` (8 bytes) and frames with these payloads, checksums and
/// trailer right (see [`split_snapshot_frames`]).
#[doc(hidden)]
pub fn join_snapshot_frames(magic: &[u8], payloads: &[Vec<u8>]) -> Vec<u8> {
    let mut file = magic.to_vec();
    let mut fw = FrameWriter::new(&mut file, magic);
    // Writing to a Vec cannot fail.
    let _ = payloads
        .iter()
        .try_for_each(|p| fw.frame(p))
        .and_then(|()| fw.end());
    file
}

/// Whether a frame's payload is a flash frame (else a segment image).
fn is_flash_frame(payload: &[u8]) -> bool {
    payload.starts_with(FLASH_MAGIC)
}

/// Put into `out` the flash frame of bound segment `page` whose live records are at
/// `offsets` (ascending): magic, file id (u64), page, generation, image length (u32
/// each), CAS base (u64), the count of offsets (u32), the offsets (u32 each).
fn flash_frame(page: &SavedPage, offsets: &[u32], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(FLASH_MAGIC);
    out.extend_from_slice(&page.file_id.to_le_bytes());
    out.extend_from_slice(&page.loc.page.to_le_bytes());
    out.extend_from_slice(&page.loc.gen.to_le_bytes());
    out.extend_from_slice(&(page.used as u32).to_le_bytes());
    out.extend_from_slice(&page.base.to_le_bytes());
    out.extend_from_slice(&(offsets.len() as u32).to_le_bytes());
    for o in offsets {
        out.extend_from_slice(&o.to_le_bytes());
    }
}

/// A flash frame's page and offsets (see [`flash_frame`]), once its layout checks out:
/// the count matches its length and the offsets ascend within the image.
fn parse_flash_frame(payload: &[u8]) -> Result<(SavedPage, Vec<u32>), &'static str> {
    let bad = "a flash frame whose layout is wrong";
    let u32_at = |i: usize| -> Result<u32, &'static str> {
        let b = payload.get(i..i + 4).ok_or(bad)?;
        Ok(u32::from_le_bytes(b.try_into().map_err(|_| bad)?))
    };
    let u64_at = |i: usize| -> Result<u64, &'static str> {
        let b = payload.get(i..i + 8).ok_or(bad)?;
        Ok(u64::from_le_bytes(b.try_into().map_err(|_| bad)?))
    };
    let page = SavedPage {
        file_id: u64_at(4)?,
        loc: crate::flash::Loc {
            page: u32_at(12)?,
            gen: u32_at(16)?,
        },
        used: u32_at(20)? as usize,
        base: u64_at(24)?,
    };
    let n = u32_at(32)? as usize;
    if n == 0 || FLASH_FRAME_HEAD.checked_add(n.checked_mul(4).ok_or(bad)?) != Some(payload.len()) {
        return Err(bad);
    }
    let offsets: Vec<u32> = payload[FLASH_FRAME_HEAD..]
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let ascending = offsets.windows(2).all(|w| w[0] < w[1]);
    let within = offsets
        .iter()
        .all(|&o| o as usize >= SEG_HDR && (o as usize) < page.used);
    if !ascending || !within {
        return Err("a flash frame's offsets out of order or outside its image");
    }
    Ok((page, offsets))
}

/// The published length of a segment image of format 4 and the list of its live records'
/// offsets, once its layout checks out: segment header, records up to that length, the
/// list (u32 each), the length (u32) and the list's count (u32).
fn image_layout(image: &[u8]) -> Result<(usize, &[u8]), &'static str> {
    let len = image.len();
    if len < SEG_HDR + 8 {
        return Err("a segment image without records");
    }
    let word = |at: usize| {
        let mut b = [0u8; 4];
        b.copy_from_slice(&image[at..at + 4]);
        u32::from_le_bytes(b) as usize
    };
    let (used, n) = (word(len - 8), word(len - 4));
    let end = n
        .checked_mul(4)
        .and_then(|l| l.checked_add(used))
        .filter(|&end| end.checked_add(8) == Some(len))
        .ok_or("a segment image whose list of live records does not fit")?;
    if used <= SEG_HDR || n == 0 {
        return Err("a segment image without records");
    }
    let kind = image[5];
    if image[..4] != format::SEG_MAGIC.to_le_bytes() || image[4] != format::SEG_VERSION {
        Err("a segment image without a segment header")
    } else if kind == format::SEG_KIND_REGULAR && used > index::MAX_OFFSET {
        Err("a segment image longer than a segment")
    } else if kind != format::SEG_KIND_REGULAR && kind != format::SEG_KIND_LARGE {
        Err("a segment image of an unknown kind")
    } else {
        Ok((used, &image[used..end]))
    }
}

/// Threads that load a snapshot's segment images (or apply its batches) on a warm restart.
const RESTORE_THREADS: usize = 8;

fn read_header(fr: &mut FrameReader<'_>) -> Result<SnapshotInfo, SnapshotError> {
    let mut magic = [0u8; 8];
    if fr.some(&mut magic[..1])? == 0 {
        return Err(SnapshotError::Empty);
    }
    match fr.exact(&mut magic[1..]) {
        Err(SnapshotError::Truncated { .. }) => return Err(SnapshotError::NotSnapshot),
        other => other?,
    }
    if &magic[..7] != MAGIC {
        return Err(SnapshotError::NotSnapshot);
    }
    if !(OLDEST_READ..=SNAPSHOT_VERSION).contains(&magic[7]) {
        return Err(SnapshotError::Version { found: magic[7] });
    }
    fr.aligned = magic[7] >= 3;
    let at = fr.offset;
    let h = fr.next()?.ok_or(SnapshotError::Invalid {
        offset: at,
        why: "no header",
    })?;
    if h.len() != HEADER_LEN {
        return Err(SnapshotError::Invalid {
            offset: at,
            why: "the header has the wrong length",
        });
    }
    let u64_at = |i: usize| {
        let mut b = [0u8; 8];
        b.copy_from_slice(&h[i..i + 8]);
        u64::from_le_bytes(b)
    };
    Ok(SnapshotInfo {
        version: magic[7],
        settings: SnapshotSettings {
            record_format: h[0],
            use_cas: h[1] != 0,
            max_item_size: u64_at(2),
        },
        items: u64_at(10),
        saved_at: u64_at(18),
        bytes: u64_at(26),
    })
}
