//! Times given on the command line, in a config file or in a report (`30s`, `500ms`, `250us`,
//! `1.5s`, `1m30s`, a plain number of seconds). The units and compound forms are
//! `humantime`'s; a decimal number with one unit (`1.5s`, `0.25ms`, and `Duration`'s own
//! `{:?}` output, which reports print) is scaled here, since humantime takes whole numbers.
//! Also the error for a name that is none of a setting's choices ([`BadChoice`]).

use std::time::Duration;

/// A time that does not parse (or is a billion seconds or more).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad time {input:?} (e.g. 30s, 500ms, 250us, 1.5s, 2m)")]
pub struct DurationError {
    /// What was given, trimmed.
    pub input: String,
}

/// A name that is none of a setting's choices (`--routing`, `--protocol`, `--arrival`,
/// `--agent-keys`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("bad {setting} {given:?}: {choices}")]
pub struct BadChoice {
    /// The setting, as messages name it (`routing`, `--agent-keys`).
    pub setting: &'static str,
    pub given: String,
    /// The choices, as `a | b | c`.
    pub choices: &'static str,
}

/// Parse a time. A plain number is seconds.
pub fn parse_duration(s: &str) -> Result<Duration, DurationError> {
    let s = s.trim();
    let bad = || DurationError {
        input: s.to_string(),
    };
    let split = s
        .find(|c: char| c.is_alphabetic() || c == 'µ')
        .unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let d = if unit.is_empty() {
        let v: f64 = num.parse().map_err(|_| bad())?;
        secs(v).ok_or_else(bad)?
    } else if num.contains('.') {
        // One unit after a decimal number: humantime gives the unit's length.
        let v: f64 = num.parse().map_err(|_| bad())?;
        let one = humantime::parse_duration(&format!("1{unit}")).map_err(|_| bad())?;
        secs(v * one.as_secs_f64()).ok_or_else(bad)?
    } else {
        humantime::parse_duration(s).map_err(|_| bad())?
    };
    if d.as_secs() >= 1_000_000_000 {
        return Err(bad());
    }
    Ok(d)
}

fn secs(v: f64) -> Option<Duration> {
    (v.is_finite() && (0.0..1e9).contains(&v)).then(|| Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        let ok: &[(&str, Duration)] = &[
            ("30s", Duration::from_secs(30)),
            ("500ms", Duration::from_millis(500)),
            ("250us", Duration::from_micros(250)),
            ("250µs", Duration::from_micros(250)),
            ("2m", Duration::from_secs(120)),
            ("1m30s", Duration::from_secs(90)),
            ("1h", Duration::from_secs(3600)),
            ("1.5", Duration::from_millis(1500)),
            ("1.5s", Duration::from_millis(1500)),
            ("0.25ms", Duration::from_micros(250)),
            (" 10s ", Duration::from_secs(10)),
            ("0", Duration::ZERO),
        ];
        for (s, d) in ok {
            assert_eq!(parse_duration(s), Ok(*d), "{s}");
        }
        for s in [
            "fast", "-1s", "3parsecs", "", "s", "1e99", "NaN", "1.5xs", "inf",
        ] {
            assert!(parse_duration(s).is_err(), "{s} accepted");
        }
    }

    /// What a report prints (`Duration`'s Debug form) reads back.
    #[test]
    fn debug_form_round_trips() {
        for d in [
            Duration::from_millis(1),
            Duration::from_micros(500),
            Duration::from_micros(1500),
            Duration::from_secs(2),
            Duration::from_nanos(100),
        ] {
            assert_eq!(parse_duration(&format!("{d:?}")), Ok(d), "{d:?}");
        }
    }
}
