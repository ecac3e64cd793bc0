//! Warm restart (`-e FILE`), as memcached's restartable cache behaves for an operator: stop
//! the server with SIGUSR1 (or, unlike memcached, SIGTERM: what a service manager sends) and
//! it saves the cache; SIGINT saves nothing. Start it again with the same `-e` and it
//! comes back with every item that was live (values, flags, expiry and CAS uniques), once:
//! the file is removed when it is loaded, so a crash later never brings back stale data.
//!
//! As with memcached, item memory comes back as a mapping of the file; unlike memcached's,
//! the file is a snapshot written at shutdown (the live records of each segment, each
//! segment image on a page boundary, see `kvstore::LogEngine::dump`), so it needs disk
//! space for the live data only and can sit on any file system. Every frame of it carries a CRC-32 and it ends with a trailer, so a
//! file that is empty, cut short, extended, bit-flipped, of another format or saved with
//! other `-C`/`-I` is refused: kvcached names the file and what is wrong and exits (as
//! memcached 1.6.45 refuses an empty metadata file), leaving the file for inspection, unless
//! `-o warm_restart_ignore_bad_file` asks it to move the file to `FILE.bad` and start empty.
//! A save writes `FILE.tmp`, syncs it, renames it over `FILE` and syncs the directory, so a
//! crash or SIGKILL during a save leaves the previous file whole.
//!
//! With a flash tier (`-o ext_path`; memcached starts empty when `-e` meets extstore) the
//! save first finishes and syncs the flash writes under way, and the snapshot names the
//! flash pages and their live records instead of copying them; the next start opens the
//! flash files as they are (`server::build_engine`) and takes those pages back. Pages that
//! cannot be (the files were made afresh, another size, a damaged page, no `ext_path`) lose
//! their items, logged; the rest still loads.
//!
//! Beside it a save writes `FILE.meta`, as memcached keeps its restart metadata in
//! `FILE.meta`: a tag line and what `stats` must show again after the restart (memcached's
//! hash table level, `hash_power_level`, which memcached restores too). It is read and
//! removed at the next start; one that is empty or not kvcached's stops the start as
//! memcached's corrupt metadata file does (or, with `-o warm_restart_ignore_bad_file`, is
//! moved to `FILE.meta.bad`). A snapshot without one (saved by an older kvcached) still
//! loads.

use std::fs::File;
use std::io::BufWriter;
use std::path::{Path, PathBuf};
use std::time::Instant;

use kvstore::{Engine, LogEngine};

use crate::state::clock::Clock;
use crate::state::shared::Shared;

/// `path` with `suffix` appended to its file name.
fn beside(path: &Path, suffix: &str) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(suffix);
    PathBuf::from(p)
}

/// The first line of `FILE.meta`.
const META_TAG: &str = "T kvcached";

/// What `FILE.meta` brings back.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Restored {
    /// memcached's hash table level when the snapshot was saved.
    pub hash_power: Option<u32>,
}

/// Read and remove `FILE.meta` (None if there is none). An empty or foreign one is an
/// error, unless `ignore_bad`.
fn read_meta(path: &Path, ignore_bad: bool) -> Result<Restored, String> {
    let meta = beside(path, ".meta");
    let text = match std::fs::read(&meta) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Restored::default()),
        Err(e) => {
            refuse(&meta, &format!("cannot be read: {e}"), ignore_bad)?;
            return Ok(Restored::default());
        }
    };
    let text = String::from_utf8_lossy(&text);
    let mut lines = text.lines();
    if lines.next() != Some(META_TAG) {
        refuse(
            &meta,
            "corrupt metadata file (empty, or not saved by kvcached)",
            ignore_bad,
        )?;
        return Ok(Restored::default());
    }
    let mut restored = Restored::default();
    for line in lines {
        let mut f = line.split(' ');
        if let (Some("K"), Some("hash_power_level"), Some(v)) = (f.next(), f.next(), f.next()) {
            restored.hash_power = v.parse().ok();
        }
    }
    // Valid once, as memcached's.
    if let Err(e) = std::fs::remove_file(&meta) {
        tracing::warn!(file = %meta.display(), "warm restart: cannot remove {}: {e}", meta.display());
    }
    Ok(restored)
}

/// Write `FILE.meta` for the snapshot just saved at `path`.
fn write_meta(shared: &Shared, path: &Path) -> std::io::Result<()> {
    let meta = beside(path, ".meta");
    let tmp = beside(path, ".meta.tmp");
    shared
        .hash_power
        .note_items(shared.engine.stats().curr_items);
    let text = format!(
        "{META_TAG}\nK hash_power_level {}\n",
        shared.hash_power.get()
    );
    std::fs::write(&tmp, text)?;
    File::open(&tmp)?.sync_all()?;
    std::fs::rename(&tmp, &meta)
}

/// Load the snapshot at `path` into `engine` if there is one, then remove it, and read
/// `FILE.meta`. A file that cannot be used is an error (the server must not start), unless
/// `ignore_bad`.
pub fn load(
    engine: &LogEngine,
    path: &Path,
    clock: &Clock,
    ignore_bad: bool,
) -> Result<Restored, String> {
    let restored = read_meta(path, ignore_bad)?;
    load_snapshot(engine, path, clock, ignore_bad)?;
    Ok(restored)
}

fn load_snapshot(
    engine: &LogEngine,
    path: &Path,
    clock: &Clock,
    ignore_bad: bool,
) -> Result<(), String> {
    // A save that was killed leaves its temporary file; the real one is untouched.
    let tmp = beside(path, ".tmp");
    if std::fs::remove_file(&tmp).is_ok() {
        tracing::warn!(
            file = %tmp.display(),
            "warm restart: removed {} (left by a save that did not finish)",
            tmp.display()
        );
    }
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            tracing::info!(
                file = %path.display(),
                "warm restart: no snapshot at {}, starting with an empty cache",
                path.display()
            );
            return Ok(());
        }
        Err(e) => return refuse(path, &format!("cannot be opened: {e}"), ignore_bad),
    };
    let started = Instant::now();
    // Valid once, as memcached's metadata file: removed before the load, so that no other
    // process can truncate it under the mappings the load makes of it (its segment images
    // become segments as private mappings: the load checks them and builds the index, and
    // copies nothing; `restore_file` copies a file that still has a name instead). A file
    // that cannot be loaded is written back where it was.
    let removed = match std::fs::remove_file(path) {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(
                file = %path.display(),
                "warm restart: cannot remove {} ({e}); loading it by copying",
                path.display()
            );
            false
        }
    };
    let result = engine.restore_file(&file, clock.now());
    match result {
        Ok(bytes) => {
            drop(file);
            let (items, ms) = (
                engine.stats().curr_items,
                started.elapsed().as_millis() as u64,
            );
            tracing::info!(
                file = %path.display(),
                items,
                bytes,
                ms,
                "warm restart: loaded {items} items ({bytes} bytes of records) from {} in {ms} ms",
                path.display(),
            );
            log_flash_restore(engine.flash_restore());
            Ok(())
        }
        Err(e) => {
            if removed {
                if let Err(put) = put_back(&file, path) {
                    return refuse_gone(path, &e.to_string(), &put, ignore_bad);
                }
            }
            refuse(path, &e.to_string(), ignore_bad)
        }
    }
}

/// Say what the load did with the flash pages the snapshot named (nothing, if it named
/// none).
fn log_flash_restore(r: kvstore::FlashRestore) {
    if r.pages > 0 {
        tracing::info!(
            pages = r.pages,
            items = r.items,
            "warm restart: {} of the items are on {} flash pages, kept",
            r.items,
            r.pages
        );
    }
    if r.pages_lost > 0 {
        tracing::warn!(
            pages = r.pages_lost,
            "warm restart: the items of {} flash pages are lost (no -o ext_path now, flash \
             files made afresh or of another size, or pages that could not be read back)",
            r.pages_lost
        );
    }
}

/// Write the contents of the removed snapshot `file` back to `path` (a new file, so one
/// that appeared there meanwhile is kept).
fn put_back(file: &File, path: &Path) -> std::io::Result<()> {
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)?;
    let mut from = file;
    std::io::Seek::seek(&mut from, std::io::SeekFrom::Start(0))?;
    std::io::copy(&mut from, &mut out)?;
    out.sync_all()
}

/// As [`refuse`], for a file that could not be written back after a failed load.
fn refuse_gone(
    path: &Path,
    why: &str,
    put: &std::io::Error,
    ignore_bad: bool,
) -> Result<(), String> {
    if !ignore_bad {
        return Err(format!(
            "warm restart: {}: {why}. Not starting; the file could not be written back \
             for inspection ({put}) (-o warm_restart_ignore_bad_file starts with an empty \
             cache instead)",
            path.display()
        ));
    }
    tracing::error!(
        file = %path.display(),
        "warm restart: {}: {why}; it could not be written back ({put}), starting with an \
         empty cache",
        path.display()
    );
    Ok(())
}

/// The file at `path` cannot be used because of `why`: an error, or with `ignore_bad` a
/// line on stderr, the file moved to `FILE.bad` and an empty start.
fn refuse(path: &Path, why: &str, ignore_bad: bool) -> Result<(), String> {
    if !ignore_bad {
        return Err(format!(
            "warm restart: {}: {why}. Not starting; the file is left as it is \
             (-o warm_restart_ignore_bad_file starts with an empty cache instead)",
            path.display()
        ));
    }
    let bad = beside(path, ".bad");
    match std::fs::rename(path, &bad) {
        Ok(()) => tracing::error!(
            file = %path.display(),
            "warm restart: {}: {why}; moved to {}, starting with an empty cache",
            path.display(),
            bad.display()
        ),
        Err(e) => tracing::error!(
            file = %path.display(),
            "warm restart: {}: {why}; cannot move it to {} ({e}), starting with an empty cache",
            path.display(),
            bad.display()
        ),
    }
    Ok(())
}

/// Save a snapshot of the cache to `path` (after the workers stopped).
pub fn save(shared: &Shared, path: &Path) -> Result<(), String> {
    let log = &shared.engine;
    let started = Instant::now();
    let tmp = beside(path, ".tmp");
    let saved_at = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let write = || -> std::io::Result<u64> {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let bytes = log.dump(&mut w, saved_at)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        // The rename itself must reach the disk before we report the save done.
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        File::open(dir)?.sync_all()?;
        write_meta(shared, path)?;
        Ok(bytes)
    };
    match write() {
        Ok(bytes) => {
            let (items, ms) = (log.stats().curr_items, started.elapsed().as_millis() as u64);
            tracing::info!(
                file = %path.display(),
                items,
                bytes,
                ms,
                "warm restart: saved {items} items ({bytes} bytes of records) to {} in {ms} ms",
                path.display(),
            );
            Ok(())
        }
        Err(e) => {
            let _ = std::fs::remove_file(&tmp);
            Err(format!(
                "warm restart: cannot save to {}: {e}",
                path.display()
            ))
        }
    }
}
