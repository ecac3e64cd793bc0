//! The server clock: whole unix seconds, read from a monotonic source so that a wall-clock
//! step does not expire or revive items, plus memcached's exptime conventions.
//!
//! Tests can shift the clock forward (`debugtime`, enabled by `-o debug_clock`) instead of
//! sleeping.

use std::sync::atomic::{AtomicI64, Ordering};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use kvstore::Time;

/// Exptimes up to this many seconds are relative to now; larger ones are unix times.
pub const REALTIME_MAXDELTA: i64 = 60 * 60 * 24 * 30;

pub struct Clock {
    started: Instant,
    started_unix: i64,
    offset: AtomicI64,
}

impl Clock {
    pub fn new() -> Clock {
        let started_unix = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs() as i64)
            .unwrap_or(0);
        Clock {
            started: Instant::now(),
            started_unix,
            offset: AtomicI64::new(0),
        }
    }

    /// Now, in unix seconds.
    pub fn now(&self) -> Time {
        let t = self.started_unix
            + self.started.elapsed().as_secs() as i64
            + self.offset.load(Ordering::Relaxed);
        t.clamp(1, u32::MAX as i64) as Time
    }

    /// Microseconds since start, for measuring spans (not shifted by `debugtime`).
    pub fn micros(&self) -> u64 {
        self.started.elapsed().as_micros() as u64
    }

    /// Seconds since start (memcached's `uptime`).
    pub fn uptime(&self) -> u64 {
        (self.now() as i64 - self.started_unix).max(0) as u64
    }

    /// Shift the clock forward (test clock only).
    pub fn advance(&self, seconds: i64) {
        self.offset.fetch_add(seconds, Ordering::Relaxed);
    }

    /// Turn a protocol exptime into an absolute expiry time at `now` (a time read from this
    /// clock), as memcached does: 0 never expires; negative is already expired; up to 30
    /// days is relative to now; larger is a unix time (one at or before the start of the
    /// process is already expired).
    pub fn expiry_at(&self, exptime: i64, now: Time) -> Time {
        expiry_at(exptime, now, self.started_unix)
    }
}

impl Default for Clock {
    fn default() -> Self {
        Clock::new()
    }
}

/// [`Clock::expiry_at`] for a given process start time.
pub fn expiry_at(exptime: i64, now: Time, started: i64) -> Time {
    if exptime == 0 {
        0
    } else if exptime < 0 {
        1
    } else if exptime > REALTIME_MAXDELTA {
        if exptime <= started {
            1
        } else {
            exptime.min(u32::MAX as i64) as Time
        }
    } else {
        (now as i64 + exptime).min(u32::MAX as i64) as Time
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exptime_conventions() {
        let now = 2_000_000_000;
        let started = 1_999_999_000;
        let rows: &[(i64, Time)] = &[
            (0, 0),
            (-1, 1),
            (i64::MIN, 1),
            (1, now + 1),
            (REALTIME_MAXDELTA, now + REALTIME_MAXDELTA as Time),
            (REALTIME_MAXDELTA + 1, 1),
            (started, 1),
            (started + 1, (started + 1) as Time),
            (i64::MAX, u32::MAX),
        ];
        for &(exptime, want) in rows {
            assert_eq!(expiry_at(exptime, now, started), want, "exptime {exptime}");
        }
    }

    #[test]
    fn advance_moves_now() {
        let c = Clock::new();
        let before = c.now();
        c.advance(100);
        assert!(c.now() >= before + 100);
    }
}
