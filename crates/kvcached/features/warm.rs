//! Warm restart (`-e FILE`), as memcached's restartable cache behaves for an operator: stop
//! the server with SIGUSR1 (or, unlike memcached, SIGTERM: what a service manager sends) and
//! it saves the cache; SIGINT saves nothing. Start it again with the same `-e` and it
//! comes back with every item that was live (values, flags, expiry and CAS uniques), once:
//! the file is removed when it is loaded, so a crash later never brings back stale data.
//!
//! Unlike memcached, item memory is not a mapping of the file: the file is a snapshot of
//! the live items written at shutdown (the engine's replication snapshot, see
//! `kvstore::LogEngine::dump`), so it needs disk space for the live data only and can sit
//! on any file system. Written to `FILE.tmp`, synced, then renamed, so a file that exists
//! is complete.

use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::path::Path;
use std::time::Instant;

use kvstore::{Engine, LogEngine};

use crate::state::clock::Clock;
use crate::state::shared::Shared;

/// Load the snapshot at `path` into `engine` if there is one, then remove it.
pub fn load(engine: &LogEngine, path: &Path, clock: &Clock) {
    let file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "kvcached: warm restart: no snapshot at {}, starting with an empty cache",
                path.display()
            );
            return;
        }
        Err(e) => {
            eprintln!(
                "kvcached: warm restart: cannot open {}: {e}; starting with an empty cache",
                path.display()
            );
            return;
        }
    };
    let log = engine;
    let started = Instant::now();
    let result = log.restore(&mut BufReader::with_capacity(1 << 20, file), clock.now());
    // Valid once, as memcached's metadata file: remove it whatever happened.
    if let Err(e) = std::fs::remove_file(path) {
        eprintln!(
            "kvcached: warm restart: cannot remove {}: {e}",
            path.display()
        );
    }
    match result {
        Ok(bytes) => eprintln!(
            "kvcached: warm restart: loaded {} items ({bytes} bytes of records) from {} in {} ms",
            log.stats().curr_items,
            path.display(),
            started.elapsed().as_millis()
        ),
        Err(e) => eprintln!(
            "kvcached: warm restart: {} is unusable ({e}); starting with an empty cache",
            path.display()
        ),
    }
}

/// Save a snapshot of the cache to `path` (after the workers stopped).
pub fn save(shared: &Shared, path: &Path) -> Result<(), String> {
    let log = &shared.engine;
    let started = Instant::now();
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    let tmp = std::path::PathBuf::from(tmp);
    let write = || -> std::io::Result<u64> {
        let file = File::create(&tmp)?;
        let mut w = BufWriter::with_capacity(1 << 20, file);
        let bytes = log.dump(&mut w)?;
        let file = w.into_inner().map_err(|e| e.into_error())?;
        file.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(bytes)
    };
    match write() {
        Ok(bytes) => {
            eprintln!(
                "kvcached: warm restart: saved {} items ({bytes} bytes of records) to {} in {} ms",
                log.stats().curr_items,
                path.display(),
                started.elapsed().as_millis()
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
