//! Warm restart: the same snapshot a new replica gets, written to a file and read back.
//!
//! A snapshot file is the magic `KVSNAP\0` and a version byte, then frames. A frame is its
//! payload's length (u64, little-endian), a CRC-32 (u32) of the length's eight bytes and the
//! payload, then the payload. The first frame is the header (the settings that decide how
//! items are laid out, and the item count), the second the replication reset batch, then
//! snapshot batches; an end frame (length 0, its CRC over the trailer, then the trailer:
//! the number of frames before it and their payload bytes) closes the file, and nothing may
//! follow it. So a file that was cut short, extended, or has any bit flipped is refused
//! with the byte offset where it goes wrong, instead of loading part of a cache or a wrong
//! value; `FORMAT.md` ("Snapshot file") has the layout.

use std::borrow::Cow;
use std::io::{Read, Write};

use super::*;
use crate::Engine;

/// File magic (7 bytes) and format version (the 8th).
const MAGIC: &[u8; 7] = b"KVSNAP\x00";
/// The snapshot format this engine writes and reads (1 had no checksums or header).
pub const SNAPSHOT_VERSION: u8 = 2;
/// The log record format the batches carry (`FORMAT.md`).
const RECORD_FORMAT: u8 = 1;
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
    pub settings: SnapshotSettings,
    /// Items held when it was saved (expired ones may be dropped on load).
    pub items: u64,
    /// Unix time it was saved.
    pub saved_at: u64,
    /// Bytes of items held when it was saved.
    pub bytes: u64,
}

/// Why a snapshot file cannot be loaded. Offsets are bytes from the start of the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SnapshotError {
    /// The file is empty.
    Empty,
    /// The file does not start with a snapshot's magic.
    NotSnapshot,
    /// Written in another snapshot format.
    Version { found: u8 },
    /// Saved by an engine with other item-layout settings.
    Settings {
        saved: SnapshotSettings,
        ours: SnapshotSettings,
    },
    /// The file ends before its end frame.
    Truncated { offset: u64 },
    /// A frame's checksum does not match its bytes.
    Checksum { frame: u64, offset: u64 },
    /// The checksums match but the contents do not make sense.
    Invalid { offset: u64, why: &'static str },
    /// Reading failed.
    Io(String),
}

impl SnapshotError {
    /// The byte of the file where it goes wrong (0 for an error about the whole file).
    pub fn offset(&self) -> u64 {
        match self {
            SnapshotError::Truncated { offset }
            | SnapshotError::Checksum { offset, .. }
            | SnapshotError::Invalid { offset, .. } => *offset,
            _ => 0,
        }
    }
}

impl std::fmt::Display for SnapshotError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SnapshotError::Empty => write!(f, "the file is empty"),
            SnapshotError::NotSnapshot => write!(f, "not a kvcached snapshot"),
            SnapshotError::Version { found } => write!(
                f,
                "written in snapshot format {found}; this kvcached reads format {SNAPSHOT_VERSION}"
            ),
            SnapshotError::Settings { saved, ours } => {
                write!(f, "saved with other item settings:")?;
                if saved.record_format != ours.record_format {
                    write!(
                        f,
                        " record format {} (this kvcached: {})",
                        saved.record_format, ours.record_format
                    )?;
                }
                if saved.use_cas != ours.use_cas {
                    let says = |cas: bool| if cas { "on" } else { "off (-C)" };
                    write!(
                        f,
                        " CAS {} (now {})",
                        says(saved.use_cas),
                        says(ours.use_cas)
                    )?;
                }
                if saved.max_item_size != ours.max_item_size {
                    write!(
                        f,
                        " item size max {} (now {})",
                        saved.max_item_size, ours.max_item_size
                    )?;
                }
                Ok(())
            }
            SnapshotError::Truncated { offset } => write!(
                f,
                "truncated: it ends at byte {offset}, before its end frame"
            ),
            SnapshotError::Checksum { frame, offset } => write!(
                f,
                "damaged: the checksum of frame {frame} (at byte {offset}) does not match"
            ),
            SnapshotError::Invalid { offset, why } => write!(f, "invalid at byte {offset}: {why}"),
            SnapshotError::Io(e) => write!(f, "read error: {e}"),
        }
    }
}

impl std::error::Error for SnapshotError {}

/// Writes frames and counts them for the trailer.
struct FrameWriter<'w> {
    w: &'w mut dyn Write,
    frames: u64,
    bytes: u64,
}

impl FrameWriter<'_> {
    fn frame(&mut self, payload: &[u8]) -> std::io::Result<()> {
        let len = (payload.len() as u64).to_le_bytes();
        self.w.write_all(&len)?;
        self.w.write_all(&crc(&len, payload).to_le_bytes())?;
        self.w.write_all(payload)?;
        self.frames += 1;
        self.bytes += payload.len() as u64;
        Ok(())
    }

    fn end(self) -> std::io::Result<()> {
        let len = 0u64.to_le_bytes();
        let mut trailer = [0u8; 16];
        trailer[..8].copy_from_slice(&self.frames.to_le_bytes());
        trailer[8..].copy_from_slice(&self.bytes.to_le_bytes());
        self.w.write_all(&len)?;
        self.w.write_all(&crc(&len, &trailer).to_le_bytes())?;
        self.w.write_all(&trailer)
    }
}

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
}

impl<'r> FrameReader<'r> {
    fn new(src: Source<'r>, offset: u64, max_frame: u64) -> Self {
        FrameReader {
            src,
            offset,
            frames: 0,
            bytes: 0,
            max_frame,
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
        if crc(&len_bytes, &payload) != want {
            return Err(SnapshotError::Checksum { frame, offset: at });
        }
        self.frames += 1;
        self.bytes += len;
        Ok(Some(payload))
    }
}

impl LogEngine {
    /// The settings a snapshot of this engine is saved with, and must have to load.
    pub fn snapshot_settings(&self) -> SnapshotSettings {
        SnapshotSettings {
            record_format: RECORD_FORMAT,
            use_cas: self.use_cas,
            max_item_size: self.max_item_size as u64,
        }
    }

    /// Write a snapshot of every live item (see the module documentation). Meant for a
    /// quiescent engine (at shutdown): writes that race with it may or may not be in the
    /// snapshot. `saved_at` is recorded in the header. Returns the record bytes written.
    pub fn dump(&self, w: &mut dyn Write, saved_at: u64) -> std::io::Result<u64> {
        w.write_all(MAGIC)?;
        w.write_all(&[SNAPSHOT_VERSION])?;
        let mut fw = FrameWriter {
            w,
            frames: 0,
            bytes: 0,
        };
        let s = self.snapshot_settings();
        let mut header = Vec::with_capacity(HEADER_LEN);
        header.push(s.record_format);
        header.push(u8::from(s.use_cas));
        header.extend_from_slice(&s.max_item_size.to_le_bytes());
        let stats = self.stats();
        header.extend_from_slice(&stats.curr_items.to_le_bytes());
        header.extend_from_slice(&saved_at.to_le_bytes());
        header.extend_from_slice(&stats.bytes.to_le_bytes());
        fw.frame(&header)?;
        let mut out = Vec::new();
        let mut bytes = 0u64;
        let (_, mut c) = self.serve_reset_cursor(&mut out);
        fw.frame(&out)?;
        loop {
            out.clear();
            let (served, next) = self.serve_snapshot(&c, BATCH_BUDGET, &mut out);
            fw.frame(&out)?;
            bytes += served.shipped as u64;
            match next {
                Some((seq, off)) => c.phase = Phase::Snapshot { seq, off },
                None => break,
            }
        }
        fw.end()?;
        Ok(bytes)
    }

    /// Read a snapshot's header: its format, settings and item count, without loading it.
    pub fn snapshot_info(r: &mut dyn Read) -> Result<SnapshotInfo, SnapshotError> {
        read_header(&mut FrameReader::new(Source::Read(r), 0, HEADER_LEN as u64))
    }

    /// Load a snapshot written by [`LogEngine::dump`] into this (empty) engine; returns
    /// the record bytes loaded. Every frame is checked before it is applied, and the file
    /// must end with its end frame; on any error the engine is left empty.
    pub fn restore(&self, r: &mut dyn Read, now: Time) -> Result<u64, SnapshotError> {
        self.restore_from(Source::Read(r), now)
    }

    /// [`LogEngine::restore`] from the whole file in memory (a mapping of it, say): the
    /// frames are checked and applied where they are, with no copy and no allocation.
    pub fn restore_bytes(&self, file: &[u8], now: Time) -> Result<u64, SnapshotError> {
        self.restore_from(Source::Bytes(file), now)
    }

    fn restore_from(&self, src: Source<'_>, now: Time) -> Result<u64, SnapshotError> {
        let result = self.restore_frames(FrameReader::new(src, 0, HEADER_LEN as u64), now);
        if result.is_err() {
            self.wipe();
        }
        result
    }

    fn restore_frames(&self, mut fr: FrameReader<'_>, now: Time) -> Result<u64, SnapshotError> {
        let info = read_header(&mut fr)?;
        let ours = self.snapshot_settings();
        if info.settings != ours {
            return Err(SnapshotError::Settings {
                saved: info.settings,
                ours,
            });
        }
        // The index is sized for the items at once, and no chain is compacted while they
        // are loaded (splits still happen if the header's count was short).
        let _bulk = self.bulk_load(info.items);
        // A batch holds its budget and at most one record more.
        fr.max_frame = (BATCH_BUDGET + self.max_item_size + (64 << 10)) as u64;
        let invalid = |offset, e: ReplError| SnapshotError::Invalid { offset, why: e.0 };
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
        self.repl_apply(&mut st, &first, now)
            .map_err(|e| invalid(at, e))?;
        drop(first);
        // Snapshot batches hold live items, each applied with its version (the highest
        // wins), so they may be applied in any order: worker threads apply them while this
        // one reads and checks the file. At most two frames per worker wait in the queue.
        let workers = std::thread::available_parallelism()
            .map_or(1, |n| n.get())
            .clamp(1, RESTORE_THREADS);
        let (tx, rx) = std::sync::mpsc::sync_channel::<(u64, Cow<'_, [u8]>)>(2 * workers);
        let rx = std::sync::Mutex::new(rx);
        let (read, results) = std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let mut mine = st.clone();
                    let rx = &rx;
                    s.spawn(move || -> Result<(u64, bool), SnapshotError> {
                        let mut bytes = 0;
                        loop {
                            let frame = match rx.lock() {
                                Ok(q) => q.recv(),
                                Err(_) => {
                                    return Err(invalid(0, ReplError("restore worker failed")))
                                }
                            };
                            let Ok((at, frame)) = frame else {
                                return Ok((bytes, mine.phase == Phase::Tail));
                            };
                            let before = mine.applied_bytes;
                            self.repl_apply(&mut mine, &frame, now)
                                .map_err(|e| invalid(at, e))?;
                            bytes += mine.applied_bytes - before;
                        }
                    })
                })
                .collect();
            let read = (|| -> Result<(), SnapshotError> {
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
                    if tx.send((at, frame)).is_err() {
                        // Every worker stopped: one of them has the error.
                        return Ok(());
                    }
                }
            })();
            drop(tx);
            let results: Vec<_> = handles
                .into_iter()
                .map(|h| {
                    h.join()
                        .unwrap_or(Err(invalid(0, ReplError("restore worker failed"))))
                })
                .collect();
            (read, results)
        });
        // Several frames may be bad, and which worker met which depends on scheduling: the
        // verdict is the error at the smallest offset, the same for every run and reader.
        let mut bytes = st.applied_bytes;
        let mut done = false;
        let mut first_error: Option<SnapshotError> = read.err();
        for res in results {
            match res {
                Ok((b, d)) => {
                    bytes += b;
                    done |= d;
                }
                Err(e) => {
                    if first_error.as_ref().is_none_or(|f| e.offset() < f.offset()) {
                        first_error = Some(e);
                    }
                }
            }
        }
        if let Some(e) = first_error {
            return Err(e);
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

/// A snapshot file's first 8 bytes (magic and version) and its frames' payloads (the header
/// first), each frame's checksum checked. For tests and fuzzing, which damage a real file's
/// frames and join them again.
#[doc(hidden)]
pub fn split_snapshot_frames(file: &[u8]) -> Result<(Vec<u8>, Vec<Vec<u8>>), SnapshotError> {
    let magic = file.get(..8).ok_or(SnapshotError::NotSnapshot)?;
    let mut fr = FrameReader::new(Source::Bytes(file), 8, u64::MAX);
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
    let mut fw = FrameWriter {
        w: &mut file,
        frames: 0,
        bytes: 0,
    };
    // Writing to a Vec cannot fail.
    let _ = payloads
        .iter()
        .try_for_each(|p| fw.frame(p))
        .and_then(|()| fw.end());
    file
}

/// Threads that apply a snapshot's batches on a warm restart.
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
    if magic[7] != SNAPSHOT_VERSION {
        return Err(SnapshotError::Version { found: magic[7] });
    }
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
