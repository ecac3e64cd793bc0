//! Logs: `tracing` events written to stderr by `tracing-subscriber`, as text (the default)
//! or one JSON object per line (`-o log_format=json`).
//!
//! Levels follow memcached's `-v` flags: errors and warnings always; `-v` adds `info`
//! (start-up, listeners, signals, replication links, authentication failures), `-vv`
//! `debug` (every connection opened and closed, as memcached's `-vv` prints them), `-vvv`
//! `trace`. The `verbosity` command changes the level while the server runs, so the level
//! is an atomic read by a filter on each event, not a subscriber rebuilt.
//!
//! Every log line is a `tracing` event: the server's own, and rustls's diagnostics, which it
//! writes as `log` records and `tracing-log` (installed with the subscriber) turns into
//! events under the same levels (its handshake decisions are `debug`, shown at `-vv`).
//!
//! Text lines carry a UTC timestamp, the level and the module; under systemd (the
//! `JOURNAL_STREAM` variable is set) the timestamp is left out, since the journal adds its
//! own. No event carries a value, a password or SASL data: events name keys only in
//! counts, and authentication events say only whether it succeeded.

use std::sync::atomic::{AtomicU8, Ordering};

use tracing::Level;
use tracing_subscriber::filter::dynamic_filter_fn;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// How log events are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Text,
    Json,
}

/// memcached's verbosity: 0 (warnings and errors) to 3 (trace).
static VERBOSITY: AtomicU8 = AtomicU8::new(0);

/// The verbosity now (`-v` count, or what the `verbosity` command set).
pub fn verbosity() -> u8 {
    VERBOSITY.load(Ordering::Relaxed)
}

/// Set the verbosity (the `verbosity` command).
pub fn set_verbosity(v: u8) {
    VERBOSITY.store(v, Ordering::Relaxed);
}

/// Whether an event at `level` is written at verbosity `v`.
fn shown(level: &Level, v: u8) -> bool {
    match *level {
        Level::ERROR | Level::WARN => true,
        Level::INFO => v >= 1,
        Level::DEBUG => v >= 2,
        Level::TRACE => v >= 3,
    }
}

/// Install the process's subscriber (once; a second call changes nothing).
pub fn init(verbose: u8, format: Format) {
    set_verbosity(verbose);
    // A dynamic filter: asked on every event (a plain `filter_fn`'s answer is cached per
    // call site, and the `verbosity` command would then change nothing).
    let filter = dynamic_filter_fn(|meta, _| shown(meta.level(), verbosity()));
    let journald = std::env::var_os("JOURNAL_STREAM").is_some();
    let base = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(false);
    let layer = match (format, journald) {
        (Format::Json, _) => base.json().flatten_event(true).boxed(),
        (Format::Text, true) => base.without_time().boxed(),
        (Format::Text, false) => base.boxed(),
    };
    let _ = tracing_subscriber::registry()
        .with(layer.with_filter(filter))
        .try_init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_follow_memcached_verbosity() {
        for (v, want) in [
            (0, [true, true, false, false, false]),
            (1, [true, true, true, false, false]),
            (2, [true, true, true, true, false]),
            (3, [true, true, true, true, true]),
        ] {
            let got = [
                Level::ERROR,
                Level::WARN,
                Level::INFO,
                Level::DEBUG,
                Level::TRACE,
            ]
            .map(|l| shown(&l, v));
            assert_eq!(got, want, "verbosity {v}");
        }
    }
}
