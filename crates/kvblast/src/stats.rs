//! What a run measured: per-request-kind counters and HdrHistogram latencies, merged across
//! threads, printed as a table and written as JSON; and the server's own `stats` counters,
//! read before and after a run to check that both sides counted the same requests.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{Read, Write};
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::workload::Op;

/// Latencies are recorded in nanoseconds, from 1 ns to 100 s, to 3 significant digits.
pub const HIST_MAX_NS: u64 = 100_000_000_000;

pub fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that new_with_bounds accepts (low >= 1, high >= 2 * low,
    // sigfig <= 5), so this cannot fail; fall back to an auto-resizing histogram anyway.
    Histogram::new_with_bounds(1, HIST_MAX_NS, 3)
        .or_else(|_| Histogram::new(3))
        .unwrap_or_else(|_| unreachable!("3 significant figures is valid"))
}

/// The timeline's latency histograms: microseconds, 1 µs to 100 s, 2 significant digits
/// (about 21 KB each; a run keeps at most [`MAX_INTERVALS`] per thread).
pub fn new_interval_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 100_000_000, 2)
        .or_else(|_| Histogram::new(2))
        .unwrap_or_else(|_| unreachable!("2 significant figures is valid"))
}

/// The most timeline intervals a run records (the interval grows with long runs to stay
/// under this).
pub const MAX_INTERVALS: usize = 300;

/// Counters for one request kind. Its serde form (what an agent sends its controller) has
/// the histogram in [`hist_v2`]'s form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OpStats {
    /// Latency of measured requests (sent after the warm-up, before the end), in ns.
    #[serde(with = "hist_v2")]
    pub hist: Histogram<u64>,
    /// Measured requests that completed (with any reply, errors included).
    pub count: u64,
    /// Hits: keys found (get), deleted (delete), touched (touch), incremented (incr); for
    /// set, `STORED`.
    pub hits: u64,
    /// Misses: keys not found; for set, `NOT_STORED`.
    pub misses: u64,
    /// Error replies (`ERROR`, `CLIENT_ERROR`, `SERVER_ERROR`).
    pub errors: u64,
    /// Measured requests slower than the SLO.
    pub late: u64,
    /// Every completed request of this kind, warm-up and load phase included.
    pub total: u64,
    /// Keys asked for by every completed get (multigets ask for several); warm-up included.
    pub total_keys: u64,
    /// Hits over every completed request, warm-up included (for checking the server).
    pub total_hits: u64,
    /// Value bytes of measured single-key gets that hit, and that missed: counted only when
    /// each key has one value size (`--value-size-per-key`), so a miss's size is known.
    pub hit_bytes: u64,
    pub miss_bytes: u64,
}

impl Default for OpStats {
    fn default() -> Self {
        OpStats {
            hist: new_histogram(),
            count: 0,
            hits: 0,
            misses: 0,
            errors: 0,
            late: 0,
            total: 0,
            total_keys: 0,
            total_hits: 0,
            hit_bytes: 0,
            miss_bytes: 0,
        }
    }
}

impl OpStats {
    pub fn merge(&mut self, o: &OpStats) {
        let _ = self.hist.add(&o.hist);
        self.count += o.count;
        self.hits += o.hits;
        self.misses += o.misses;
        self.errors += o.errors;
        self.late += o.late;
        self.total += o.total;
        self.total_keys += o.total_keys;
        self.total_hits += o.total_hits;
        self.hit_bytes += o.hit_bytes;
        self.miss_bytes += o.miss_bytes;
    }
}

/// Everything one thread (or, merged, the whole run) counted. Its serde form (what an agent
/// sends its controller) has the histograms in [`hist_v2`]'s form.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    pub ops: [OpStats; Op::COUNT],
    /// Open loop: how late each measured request was sent after its intended time, in ns.
    #[serde(with = "hist_v2")]
    pub send_lag: Histogram<u64>,
    /// Open loop: measured requests sent more than [`late_send_ns`] after their time.
    pub late_sends: u64,
    /// Open loop: requests not sent because every connection to their server was at its
    /// outstanding-request cap.
    pub skipped: u64,
    /// Requests with no reply by the end of the drain period.
    pub timeouts: u64,
    /// Requests lost with a connection that failed or sent an invalid reply.
    pub lost: u64,
    /// Connections that failed or were closed for an invalid reply.
    pub conn_failures: u64,
    /// UDP requests whose reply never came (or came damaged): given up after a later
    /// request's reply arrived, or after the UDP timeout.
    pub dropped: u64,
    /// Closed loop with several servers: requests sent to a connection whose server does
    /// not own the key (after a bounded search for a key that it owns).
    pub misrouted: u64,
    /// Measured requests issued (open loop: by intended time).
    pub issued: u64,
    /// Sets sent by the load phase, and their completions.
    pub loaded: u64,
    /// Connections reopened after a failure.
    pub reconnects: u64,
    /// Open loop: requests not sent because no connection to their server was up.
    pub unsent: u64,
    /// Load-phase sets sent again because their UDP reply was lost.
    pub load_retries: u64,
    /// Closed loop: nanoseconds from the start of the measured window until the thread
    /// stopped issuing (merged as the maximum).
    pub window_ns: u64,
    /// Latency (µs) of every request completed in each interval of `interval_ns` from the
    /// start (warm-up and drain included, the load phase not): the p99-over-time plot.
    #[serde(with = "hist_v2::intervals")]
    pub intervals: Vec<Histogram<u64>>,
    pub interval_ns: u64,
}

/// A server's `stats` that could not be read, or an HdrHistogram log that could not be
/// written.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    #[error(transparent)]
    Server(#[from] crate::transport::TransportError),
    #[error("{server}: {source}")]
    Io {
        server: String,
        source: std::io::Error,
    },
    /// A reply that `stats` does not give (as kvproto shows it).
    #[error("{server}: unexpected stats reply {reply}")]
    Unexpected { server: String, reply: String },
    #[error("{server}: invalid stats reply ({reason:?})")]
    Invalid {
        server: String,
        reason: kvproto::client::Invalid,
    },
    #[error("{server}: stats reply too long")]
    TooLong { server: String },
    #[error("{server}: connection closed during stats")]
    Closed { server: String },
    #[error("HdrHistogram log: {0}")]
    LogStart(#[source] std::io::Error),
    #[error("HdrHistogram log: {0}")]
    LogWrite(
        #[source]
        hdrhistogram::serialization::interval_log::IntervalLogWriterError<
            hdrhistogram::serialization::V2DeflateSerializeError,
        >,
    ),
}

/// Histogram data that cannot be read back (from a peer that may send anything).
#[derive(Debug, thiserror::Error)]
pub enum HistogramDataError {
    #[error("bad histogram data: not base64 ({0})")]
    NotBase64(#[source] base64::DecodeError),
    #[error("bad histogram data: short header")]
    ShortHeader,
    /// Not plain V2 (compressed, or another format), whose payload could not be checked
    /// before it is expanded.
    #[error("bad histogram data: not an uncompressed V2 histogram (cookie {0:#x})")]
    Cookie(u64),
    /// The header announces more payload than the data holds (the decoder would allocate
    /// what it announces).
    #[error("bad histogram data: a payload of {declared} bytes announced, {have} present")]
    PayloadLength { declared: u64, have: u64 },
    /// The V2 header asks for more than kvblast's own histograms hold.
    #[error(
        "bad histogram data: bounds larger than kvblast's ({lowest}..={highest}, {digits} \
         significant digits)"
    )]
    TooLarge {
        digits: u64,
        lowest: u64,
        highest: u64,
    },
    #[error("bad histogram data: {0}")]
    Decode(#[source] hdrhistogram::serialization::DeserializeError),
    /// Values that do not fit the histogram they are added to.
    #[error("bad histogram data: {0}")]
    Add(#[source] hdrhistogram::AdditionError),
    #[error("{0} interval histograms, more than the {MAX_INTERVALS} a run keeps")]
    TooManyIntervals(usize),
}

/// Histograms in serde form (`#[serde(with = "hist_v2")]`): HdrHistogram's V2 format (the
/// one its Java, C and Go implementations read), base64-encoded. V2 without deflate, so that
/// a reader can check the header's bounds before it allocates anything; what is read back is
/// added into a fresh histogram of kvblast's own, so a peer cannot choose its size.
pub mod hist_v2 {
    use base64::Engine as _;
    use hdrhistogram::serialization::{Serializer as _, V2Serializer};
    use hdrhistogram::Histogram;
    use serde::{de, ser, Deserialize, Deserializer, Serialize, Serializer};

    use super::{new_histogram, HistogramDataError, HIST_MAX_NS};

    /// The histogram as V2, base64-encoded.
    pub fn encode(
        h: &Histogram<u64>,
    ) -> Result<String, hdrhistogram::serialization::V2SerializeError> {
        let mut bytes = Vec::new();
        V2Serializer::new().serialize(h, &mut bytes)?;
        Ok(base64::engine::general_purpose::STANDARD.encode(&bytes))
    }

    /// HdrHistogram's V2 cookie (uncompressed) and header length.
    const V2_COOKIE: u64 = 0x1c84_9313;
    const V2_HEADER_LEN: usize = 40;

    /// The inverse of [`encode`], added into `into` (a fresh histogram of kvblast's): the V2
    /// header must describe a histogram no larger than kvblast's own (at most 3 significant
    /// figures, values from 1 to [`HIST_MAX_NS`]) before it is decoded.
    pub fn decode(
        data: &str,
        mut into: Histogram<u64>,
    ) -> Result<Histogram<u64>, HistogramDataError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(data)
            .map_err(HistogramDataError::NotBase64)?;
        let field = |at: usize, len: usize| -> Result<u64, HistogramDataError> {
            let b = bytes
                .get(at..at + len)
                .ok_or(HistogramDataError::ShortHeader)?;
            Ok(b.iter().fold(0u64, |acc, &x| acc << 8 | u64::from(x)))
        };
        // V2 header: cookie, payload length, normalizing offset, significant figures, lowest
        // and highest trackable values, conversion ratio; all big-endian.
        let (cookie, payload) = (field(0, 4)?, field(4, 4)?);
        if cookie != V2_COOKIE {
            return Err(HistogramDataError::Cookie(cookie));
        }
        let have = bytes.len().saturating_sub(V2_HEADER_LEN) as u64;
        if payload > have {
            return Err(HistogramDataError::PayloadLength {
                declared: payload,
                have,
            });
        }
        let (digits, lowest, highest) = (field(12, 4)?, field(16, 8)?, field(24, 8)?);
        if digits > 3 || lowest < 1 || highest > HIST_MAX_NS {
            return Err(HistogramDataError::TooLarge {
                digits,
                lowest,
                highest,
            });
        }
        let h: Histogram<u64> = hdrhistogram::serialization::Deserializer::new()
            .deserialize(&mut bytes.as_slice())
            .map_err(HistogramDataError::Decode)?;
        into.add(&h).map_err(HistogramDataError::Add)?;
        Ok(into)
    }

    pub fn serialize<S: Serializer>(h: &Histogram<u64>, s: S) -> Result<S::Ok, S::Error> {
        encode(h).map_err(ser::Error::custom)?.serialize(s)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Histogram<u64>, D::Error> {
        let data = String::deserialize(d)?;
        decode(&data, new_histogram()).map_err(de::Error::custom)
    }

    /// The timeline's histograms ([`super::new_interval_histogram`]), at most
    /// [`super::MAX_INTERVALS`] of them.
    pub mod intervals {
        use hdrhistogram::Histogram;
        use serde::{de, ser, Deserialize, Deserializer, Serializer};

        use super::super::{new_interval_histogram, HistogramDataError, MAX_INTERVALS};

        pub fn serialize<S: Serializer>(hs: &[Histogram<u64>], s: S) -> Result<S::Ok, S::Error> {
            use ser::SerializeSeq as _;
            let mut seq = s.serialize_seq(Some(hs.len()))?;
            for h in hs {
                seq.serialize_element(&super::encode(h).map_err(ser::Error::custom)?)?;
            }
            seq.end()
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Vec<Histogram<u64>>, D::Error> {
            let data = Vec::<String>::deserialize(d)?;
            if data.len() > MAX_INTERVALS {
                return Err(de::Error::custom(HistogramDataError::TooManyIntervals(
                    data.len(),
                )));
            }
            data.iter()
                .map(|h| super::decode(h, new_interval_histogram()).map_err(de::Error::custom))
                .collect()
        }
    }
}

/// A send later than this after its intended time counts as a late send (the generator fell
/// behind): half the SLO, at least 100 µs. A late send's delay is in its latency anyway
/// (latency counts from the intended time); this only decides when the generator itself,
/// not the server, would be what broke the SLO. (A tenth of the SLO rejected every step on
/// shared virtual machines, whose scheduling jitter alone exceeds 100 µs for 1% of sends.)
pub fn late_send_ns(slo: std::time::Duration) -> u64 {
    (slo.as_nanos() as u64 / 2).max(100_000)
}

impl Default for Stats {
    fn default() -> Self {
        Stats {
            ops: Default::default(),
            send_lag: new_histogram(),
            late_sends: 0,
            skipped: 0,
            timeouts: 0,
            lost: 0,
            conn_failures: 0,
            dropped: 0,
            misrouted: 0,
            issued: 0,
            loaded: 0,
            load_retries: 0,
            reconnects: 0,
            unsent: 0,
            window_ns: 0,
            intervals: Vec::new(),
            interval_ns: 0,
        }
    }
}

impl Stats {
    pub fn merge(&mut self, o: &Stats) {
        for (a, b) in self.ops.iter_mut().zip(o.ops.iter()) {
            a.merge(b);
        }
        let _ = self.send_lag.add(&o.send_lag);
        self.late_sends += o.late_sends;
        self.skipped += o.skipped;
        self.timeouts += o.timeouts;
        self.lost += o.lost;
        self.conn_failures += o.conn_failures;
        self.dropped += o.dropped;
        self.misrouted += o.misrouted;
        self.issued += o.issued;
        self.loaded += o.loaded;
        self.load_retries += o.load_retries;
        self.reconnects += o.reconnects;
        self.unsent += o.unsent;
        self.window_ns = self.window_ns.max(o.window_ns);
        self.interval_ns = self.interval_ns.max(o.interval_ns);
        for (i, h) in o.intervals.iter().enumerate() {
            if i >= self.intervals.len() {
                self.intervals.push(new_interval_histogram());
            }
            let _ = self.intervals[i].add(h);
        }
    }

    pub fn op(&self, op: Op) -> &OpStats {
        &self.ops[op.index()]
    }

    /// All request kinds together.
    pub fn all(&self) -> OpStats {
        let mut a = OpStats::default();
        for o in &self.ops {
            a.merge(o);
        }
        a
    }
}

/// One row of the latency table, in microseconds.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub name: String,
    pub count: u64,
    pub rate: f64,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub late: u64,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
    pub min_us: f64,
    pub mean_us: f64,
    pub stddev_us: f64,
    pub p50_us: f64,
    pub p90_us: f64,
    pub p95_us: f64,
    pub p99_us: f64,
    pub p999_us: f64,
    pub max_us: f64,
}

impl Summary {
    pub fn of(name: &str, o: &OpStats, seconds: f64) -> Summary {
        let h = &o.hist;
        let us = |ns: u64| ns as f64 / 1000.0;
        let empty = h.is_empty();
        let q = |p: f64| {
            if empty {
                0.0
            } else {
                us(h.value_at_quantile(p))
            }
        };
        Summary {
            name: name.to_string(),
            count: o.count,
            rate: if seconds > 0.0 {
                o.count as f64 / seconds
            } else {
                0.0
            },
            hits: o.hits,
            misses: o.misses,
            errors: o.errors,
            late: o.late,
            hit_bytes: o.hit_bytes,
            miss_bytes: o.miss_bytes,
            min_us: if empty { 0.0 } else { us(h.min()) },
            mean_us: if empty { 0.0 } else { h.mean() / 1000.0 },
            stddev_us: if empty { 0.0 } else { h.stdev() / 1000.0 },
            p50_us: q(0.50),
            p90_us: q(0.90),
            p95_us: q(0.95),
            p99_us: q(0.99),
            p999_us: q(0.999),
            max_us: if empty { 0.0 } else { us(h.max()) },
        }
    }
}

/// How the closed loop keeps `--depth` requests outstanding on a connection
/// (`--pipeline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Pipeline {
    /// A refilling window: as soon as one reply arrives, the next request goes out.
    #[default]
    Window,
    /// Batches: `depth` requests sent together, the next batch only once every reply of
    /// this one is in (memtier_benchmark's `--pipeline`, most pipelining clients).
    Batch,
}

impl Pipeline {
    pub fn parse(s: &str) -> Result<Pipeline, crate::units::BadChoice> {
        match s {
            "window" => Ok(Pipeline::Window),
            "batch" => Ok(Pipeline::Batch),
            _ => Err(crate::units::BadChoice {
                setting: "--pipeline",
                given: s.to_string(),
                choices: "window | batch",
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Pipeline::Window => "window",
            Pipeline::Batch => "batch",
        }
    }

    /// How many new requests a closed-loop connection sends when it has `outstanding`
    /// requests in flight: a window tops up to `depth`; a batch of `depth` goes out only
    /// when nothing is outstanding (so never more than `depth` are, and the next batch
    /// waits for every reply of the last).
    pub fn sends(self, depth: usize, outstanding: usize) -> usize {
        match self {
            Pipeline::Window => depth.saturating_sub(outstanding),
            Pipeline::Batch if outstanding == 0 => depth,
            Pipeline::Batch => 0,
        }
    }
}

/// Requests completed (and error replies) in one second of a run, the probe's included.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// Seconds since the start (warm-up included) at the end of the interval.
    pub t: f64,
    pub completed: u64,
    pub errors: u64,
}

/// A finished run, ready to print.
#[derive(Debug, Clone)]
pub struct Report {
    /// Settings worth printing, in order (name, value).
    pub settings: Vec<(String, String)>,
    /// How requests were pipelined on a connection, and the depth: closed loop, the
    /// requests outstanding (window) or per batch; open loop, the cap per connection.
    pub pipeline: Pipeline,
    pub depth: usize,
    /// Length of the measured window, in seconds.
    pub seconds: f64,
    /// Open loop target, requests per second.
    pub target_rate: Option<f64>,
    pub slo_us: f64,
    pub stats: Stats,
    /// The latency probe's counters, if there was a probe.
    pub probe: Option<Stats>,
    /// Completions per second over the run.
    pub timeline: Vec<Sample>,
    /// Seconds the load phase took, if there was one.
    pub load_seconds: Option<f64>,
    /// Server counter deltas over the run (sum over servers), if read.
    pub server: Option<BTreeMap<String, i64>>,
    /// When the run started (warm-up included), by the wall clock, in ns since the Unix
    /// epoch (0 if unknown).
    pub start_unix_ns: u64,
    /// Distinct keys the main phase sent requests for (warm-up included, the load phase and
    /// the probe not), when tracked (at most 2^24 keys).
    pub distinct_keys: Option<u64>,
    /// Distributed load: each participant's share and counts (the controller first).
    pub participants: Vec<Participant>,
}

/// One participant of a distributed run, as the controller saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct Participant {
    /// "controller", or the agent's address.
    pub name: String,
    /// The fraction of the workload's requests it was given: of the key space's popularity
    /// mass with split keys, else 1/N.
    pub share: f64,
    /// Open loop: the rate it was asked for.
    pub target_rate: Option<f64>,
    /// Measured requests issued.
    pub issued: u64,
    /// Measured requests completed (as `count` of the `all` row).
    pub requests: u64,
    /// Error replies, timeouts, requests lost with a connection or dropped (UDP).
    pub errors: u64,
    /// Measured requests completed per second of its window.
    pub rate: f64,
    /// Distinct keys its main phase touched, when tracked.
    pub distinct_keys: Option<u64>,
    /// Its start relative to the controller's, in ms: the difference of the wall clocks at
    /// the two starts, less `clock_offset_ms`.
    pub start_ms: f64,
    /// Its wall clock minus the controller's, estimated from the fastest of a few pings
    /// (within half a round trip).
    pub clock_offset_ms: f64,
    /// That ping's round trip, ms.
    pub rtt_ms: f64,
}

impl Participant {
    /// A participant's entry from its own counters over `seconds` of measured window.
    pub fn of(name: &str, share: f64, target_rate: Option<f64>, st: &Stats, seconds: f64) -> Self {
        let all = st.all();
        Participant {
            name: name.to_string(),
            share,
            target_rate,
            issued: st.issued,
            requests: all.count,
            errors: all.errors + st.timeouts + st.lost + st.dropped,
            rate: if seconds > 0.0 {
                all.count as f64 / seconds
            } else {
                0.0
            },
            distinct_keys: None,
            start_ms: 0.0,
            clock_offset_ms: 0.0,
            rtt_ms: 0.0,
        }
    }
}

impl Report {
    pub fn rows(&self) -> Vec<Summary> {
        let mut rows: Vec<Summary> = Op::ALL
            .iter()
            .filter(|op| self.stats.op(**op).total > 0)
            .map(|op| Summary::of(op.name(), self.stats.op(*op), self.seconds))
            .collect();
        rows.push(Summary::of("all", &self.stats.all(), self.seconds));
        if let Some(p) = &self.probe {
            rows.extend(
                Op::ALL.iter().filter(|op| p.op(**op).total > 0).map(|op| {
                    Summary::of(&format!("probe-{}", op.name()), p.op(*op), self.seconds)
                }),
            );
        }
        rows
    }

    /// Measured requests issued per second (the offered load).
    pub fn offered_rate(&self) -> f64 {
        if self.seconds > 0.0 {
            self.stats.issued as f64 / self.seconds
        } else {
            0.0
        }
    }

    /// Whether an open-loop generator failed to keep to its schedule: more than 1% of sends
    /// late, or any skipped. (The offered rate itself is the schedule's, so it is on target by
    /// construction, up to the arrival process's randomness.)
    pub fn fell_behind(&self) -> bool {
        if self.target_rate.is_none() {
            return false;
        }
        let issued = self.stats.issued.max(1) as f64;
        self.stats.skipped > 0 || self.stats.late_sends as f64 / issued > 0.01
    }

    /// The human-readable table.
    pub fn table(&self) -> String {
        let mut s = String::new();
        for (k, v) in &self.settings {
            let _ = writeln!(s, "{k:>12}: {v}");
        }
        if let Some(l) = self.load_seconds {
            let _ = writeln!(
                s,
                "{:>12}: {} sets in {l:.2}s{}",
                "load phase",
                self.stats.loaded,
                if self.stats.load_retries > 0 {
                    format!(
                        " ({} sent again after a lost UDP reply)",
                        self.stats.load_retries
                    )
                } else {
                    String::new()
                }
            );
        }
        let _ = writeln!(
            s,
            "{:>12}: {:.2}s measured, offered {:.0} req/s{}",
            "window",
            self.seconds,
            self.offered_rate(),
            match self.target_rate {
                Some(t) => format!(" (target {t:.0})"),
                None => String::new(),
            }
        );
        let _ =
            writeln!(
            s,
            "\n{:<13}{:>10}{:>11}{:>10}{:>9}{:>7}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>8}{:>9}{:>9}",
            "op", "count", "req/s", "hits", "misses", "errs", "late", "min", "mean", "stddev",
            "p50", "p90", "p95", "p99", "p99.9", "max"
        );
        for r in self.rows() {
            let _ = writeln!(
                s,
                "{:<13}{:>10}{:>11.0}{:>10}{:>9}{:>7}{:>8}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>8.1}{:>9.1}{:>9.1}",
                r.name, r.count, r.rate, r.hits, r.misses, r.errors, r.late, r.min_us, r.mean_us,
                r.stddev_us, r.p50_us, r.p90_us, r.p95_us, r.p99_us, r.p999_us, r.max_us
            );
        }
        let _ = writeln!(
            s,
            "(latencies in µs; late = slower than the {:.0} µs SLO)",
            self.slo_us
        );
        let st = &self.stats;
        if self.target_rate.is_some() {
            let lag = &st.send_lag;
            let _ = writeln!(
                s,
                "send lag: p50 {:.1} µs, p99 {:.1} µs, max {:.1} µs; {} sends over {} µs late, {} skipped{}",
                lag.value_at_quantile(0.5) as f64 / 1000.0,
                lag.value_at_quantile(0.99) as f64 / 1000.0,
                lag.max() as f64 / 1000.0,
                st.late_sends,
                late_send_ns(std::time::Duration::from_secs_f64(self.slo_us / 1e6)) / 1000,
                st.skipped,
                if self.fell_behind() {
                    "  -- FELL BEHIND: the generator could not keep the schedule"
                } else {
                    ""
                }
            );
        }
        if st.timeouts + st.lost + st.conn_failures + st.misrouted + st.dropped + st.unsent > 0 {
            let _ = writeln!(
                s,
                "timeouts {}, lost with connections {}, connection failures {}, reconnects {}, \
                 not sent (server down) {}, misrouted {}, UDP dropped {}",
                st.timeouts,
                st.lost,
                st.conn_failures,
                st.reconnects,
                st.unsent,
                st.misrouted,
                st.dropped
            );
        }
        if !self.participants.is_empty() {
            let _ = writeln!(
                s,
                "\n{:<24}{:>7}{:>10}{:>10}{:>10}{:>8}{:>9}{:>10}{:>8}",
                "participant",
                "share",
                "target/s",
                "req/s",
                "requests",
                "errors",
                "keys",
                "start ms",
                "rtt ms"
            );
            for p in &self.participants {
                let _ = writeln!(
                    s,
                    "{:<24}{:>7.3}{:>10}{:>10.0}{:>10}{:>8}{:>9}{:>10.3}{:>8.3}",
                    p.name,
                    p.share,
                    p.target_rate
                        .map(|r| format!("{r:.0}"))
                        .unwrap_or_else(|| "-".into()),
                    p.rate,
                    p.requests,
                    p.errors,
                    p.distinct_keys
                        .map(|k| k.to_string())
                        .unwrap_or_else(|| "-".into()),
                    p.start_ms,
                    p.rtt_ms
                );
            }
        }
        if let Some(server) = &self.server {
            let _ = writeln!(s, "\nserver counters over the run (ours in brackets):");
            for (name, ours) in self.reconcile() {
                let theirs = server.get(name).copied().unwrap_or(0);
                let mark = if theirs == ours { "" } else { "  (differs)" };
                let _ = writeln!(s, "  {name:<20}{theirs:>12}  [{ours}]{mark}");
            }
        }
        s
    }

    /// Our totals under the names of memcached's `stats` counters.
    pub fn reconcile(&self) -> Vec<(&'static str, i64)> {
        let mut st = self.stats.clone();
        if let Some(p) = &self.probe {
            st.merge(p);
        }
        let st = &st;
        let get = st.op(Op::Get);
        let set = st.op(Op::Set);
        let del = st.op(Op::Delete);
        let touch = st.op(Op::Touch);
        let incr = st.op(Op::Incr);
        // memcached counts a gat under touch only (cmd_touch, touch_hits/misses).
        let gat = st.op(Op::Gat);
        vec![
            ("cmd_get", get.total_keys as i64),
            ("get_hits", get.total_hits as i64),
            (
                "get_misses",
                (get.total_keys - get.total_hits.min(get.total_keys)) as i64,
            ),
            ("cmd_set", (set.total + st.loaded) as i64),
            ("delete_hits+misses", del.total as i64 - del.errors as i64),
            ("cmd_touch", (touch.total + gat.total) as i64),
            ("incr_hits+misses", incr.total as i64 - incr.errors as i64),
        ]
    }

    /// The JSON report's contents ([`RunReport`]).
    pub fn report(&self) -> RunReport {
        let st = &self.stats;
        RunReport {
            settings: self.settings.clone(),
            pipeline: self.pipeline,
            depth: self.depth as u64,
            seconds: Num::of(self.seconds),
            target_rate: self.target_rate.map(Num::of),
            offered_rate: Num::of(self.offered_rate()),
            slo_us: Num::of(self.slo_us),
            fell_behind: self.fell_behind(),
            ops: self
                .rows()
                .iter()
                .map(|r| (r.name.clone(), OpReport::of(r)))
                .collect(),
            totals: Totals {
                issued: st.issued,
                loaded: st.loaded,
                load_retries: st.load_retries,
                late_sends: st.late_sends,
                skipped: st.skipped,
                timeouts: st.timeouts,
                lost: st.lost,
                conn_failures: st.conn_failures,
                reconnects: st.reconnects,
                unsent: st.unsent,
                dropped: st.dropped,
                misrouted: st.misrouted,
                send_lag_p99_us: Num::of(st.send_lag.value_at_quantile(0.99) as f64 / 1000.0),
                send_lag_max_us: Num::of(st.send_lag.max() as f64 / 1000.0),
            },
            timeline: self
                .timeline
                .iter()
                .map(|p| TimelineReport {
                    t: Num::of(p.t),
                    completed: p.completed,
                    errors: p.errors,
                })
                .collect(),
            latency_timeline: self
                .latency_timeline()
                .iter()
                .map(|p| LatencyReport {
                    t: Num::of(p.t),
                    count: p.count,
                    p50_us: Num::of(p.p50_us),
                    p99_us: Num::of(p.p99_us),
                    max_us: Num::of(p.max_us),
                })
                .collect(),
            ours: self
                .reconcile()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            distinct_keys: self.distinct_keys,
            participants: self
                .participants
                .iter()
                .map(ParticipantReport::of)
                .collect(),
            server: self.server.clone(),
        }
    }

    /// The JSON report (`run --json`): [`Report::report`], pretty-printed.
    pub fn json(&self) -> String {
        to_json(&self.report())
    }
}

/// `value` as pretty JSON with a final line end (a report file).
pub fn to_json(value: &impl Serialize) -> String {
    let mut out = serde_json::to_string_pretty(value).unwrap_or_default();
    out.push('\n');
    out
}

/// A number as a report writes it: rounded to `1/SCALE`, as an integer when it is one, and
/// `null` when it is not finite. It reads back as the number (a `null` does not).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Rounded<const SCALE: u32>(pub f64);

/// Three decimals (microseconds, rates, seconds).
pub type Num = Rounded<1000>;
/// Six decimals (shares, milliseconds).
pub type Num6 = Rounded<1_000_000>;
/// One decimal (a capacity search's rates).
pub type Num1 = Rounded<10>;

impl<const SCALE: u32> Rounded<SCALE> {
    pub fn of(x: f64) -> Self {
        Rounded(x)
    }
}

impl<const SCALE: u32> Serialize for Rounded<SCALE> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        if !self.0.is_finite() {
            return s.serialize_none();
        }
        let scale = f64::from(SCALE);
        let r = (self.0 * scale).round() / scale;
        if r.fract() == 0.0 && r.abs() < 9e15 {
            s.serialize_i64(r as i64)
        } else {
            s.serialize_f64(r)
        }
    }
}

impl<'de, const SCALE: u32> Deserialize<'de> for Rounded<SCALE> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        f64::deserialize(d).map(Rounded)
    }
}

/// Pairs written as a JSON object, in their order.
fn pairs<S: Serializer, V: Serialize>(pairs: &[(String, V)], s: S) -> Result<S::Ok, S::Error> {
    s.collect_map(pairs.iter().map(|(k, v)| (k, v)))
}

/// A run's JSON report (`kvblast run --json`, and a capacity search's best run).
#[derive(Debug, Clone, Serialize)]
pub struct RunReport {
    /// The settings worth printing, in order.
    #[serde(serialize_with = "pairs")]
    pub settings: Vec<(String, String)>,
    /// `window` or `batch` ([`Pipeline`]).
    pub pipeline: Pipeline,
    /// Closed loop: requests outstanding per connection (window) or per batch; open loop:
    /// the cap per connection.
    pub depth: u64,
    pub seconds: Num,
    pub target_rate: Option<Num>,
    pub offered_rate: Num,
    pub slo_us: Num,
    pub fell_behind: bool,
    /// One entry per kind of request, then `all`.
    #[serde(serialize_with = "pairs")]
    pub ops: Vec<(String, OpReport)>,
    pub totals: Totals,
    pub timeline: Vec<TimelineReport>,
    pub latency_timeline: Vec<LatencyReport>,
    /// What the server's counters should show for this run ([`Report::reconcile`]).
    #[serde(serialize_with = "pairs")]
    pub ours: Vec<(String, i64)>,
    pub distinct_keys: Option<u64>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub participants: Vec<ParticipantReport>,
    /// The server's counter deltas, when read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub server: Option<BTreeMap<String, i64>>,
}

/// One kind of request in a [`RunReport`] ([`Summary`]).
#[derive(Debug, Clone, Serialize)]
pub struct OpReport {
    pub count: u64,
    pub rate: Num,
    pub hits: u64,
    pub misses: u64,
    pub errors: u64,
    pub late: u64,
    pub min_us: Num,
    pub mean_us: Num,
    pub stddev_us: Num,
    pub p50_us: Num,
    pub p90_us: Num,
    pub p95_us: Num,
    pub p99_us: Num,
    pub p999_us: Num,
    pub max_us: Num,
    pub hit_bytes: u64,
    pub miss_bytes: u64,
}

impl OpReport {
    fn of(r: &Summary) -> OpReport {
        OpReport {
            count: r.count,
            rate: Num::of(r.rate),
            hits: r.hits,
            misses: r.misses,
            errors: r.errors,
            late: r.late,
            min_us: Num::of(r.min_us),
            mean_us: Num::of(r.mean_us),
            stddev_us: Num::of(r.stddev_us),
            p50_us: Num::of(r.p50_us),
            p90_us: Num::of(r.p90_us),
            p95_us: Num::of(r.p95_us),
            p99_us: Num::of(r.p99_us),
            p999_us: Num::of(r.p999_us),
            max_us: Num::of(r.max_us),
            hit_bytes: r.hit_bytes,
            miss_bytes: r.miss_bytes,
        }
    }
}

/// A [`RunReport`]'s totals over every kind of request.
#[derive(Debug, Clone, Serialize)]
pub struct Totals {
    pub issued: u64,
    pub loaded: u64,
    pub load_retries: u64,
    pub late_sends: u64,
    pub skipped: u64,
    pub timeouts: u64,
    pub lost: u64,
    pub conn_failures: u64,
    pub reconnects: u64,
    pub unsent: u64,
    pub dropped: u64,
    pub misrouted: u64,
    pub send_lag_p99_us: Num,
    pub send_lag_max_us: Num,
}

/// Completions of one interval ([`Sample`]).
#[derive(Debug, Clone, Serialize)]
pub struct TimelineReport {
    pub t: Num,
    pub completed: u64,
    pub errors: u64,
}

/// Latency of one interval ([`LatencyPoint`]).
#[derive(Debug, Clone, Serialize)]
pub struct LatencyReport {
    pub t: Num,
    pub count: u64,
    pub p50_us: Num,
    pub p99_us: Num,
    pub max_us: Num,
}

/// One participant of a distributed run ([`Participant`]).
#[derive(Debug, Clone, Serialize)]
pub struct ParticipantReport {
    pub name: String,
    pub share: Num6,
    pub target_rate: Option<Num>,
    pub issued: u64,
    pub requests: u64,
    pub errors: u64,
    pub rate: Num,
    pub distinct_keys: Option<u64>,
    pub start_ms: Num6,
    pub clock_offset_ms: Num6,
    pub rtt_ms: Num6,
}

impl ParticipantReport {
    fn of(p: &Participant) -> ParticipantReport {
        ParticipantReport {
            name: p.name.clone(),
            share: Num6::of(p.share),
            target_rate: p.target_rate.map(Num::of),
            issued: p.issued,
            requests: p.requests,
            errors: p.errors,
            rate: Num::of(p.rate),
            distinct_keys: p.distinct_keys,
            start_ms: Num6::of(p.start_ms),
            clock_offset_ms: Num6::of(p.clock_offset_ms),
            rtt_ms: Num6::of(p.rtt_ms),
        }
    }
}

/// One interval of the latency timeline: `t` is the interval's end in seconds from the start.
#[derive(Debug, Clone, PartialEq)]
pub struct LatencyPoint {
    pub t: f64,
    pub count: u64,
    pub p50_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
}

impl Report {
    /// The latency of each interval that completed requests.
    /// The latency histogram of each request kind over the whole run (nanoseconds, tagged
    /// with the kind's name), as an HdrHistogram interval log (`hdrhistogram`'s writer, V2
    /// deflate encoding; maxima shown in microseconds).
    pub fn hdr_log(&self) -> Result<Vec<u8>, StatsError> {
        use hdrhistogram::serialization::interval_log::{IntervalLogWriterBuilder, Tag};
        use hdrhistogram::serialization::V2DeflateSerializer;
        let mut out = Vec::new();
        let mut serializer = V2DeflateSerializer::new();
        let mut builder = IntervalLogWriterBuilder::new();
        builder
            .add_comment("kvblast latency histograms, values in nanoseconds")
            .with_max_value_divisor(1000.0);
        let mut log = builder
            .begin_log_with(&mut out, &mut serializer)
            .map_err(StatsError::LogStart)?;
        let run = Duration::from_secs_f64(self.seconds.max(0.0));
        for op in Op::ALL {
            let h = &self.stats.op(op).hist;
            if h.is_empty() {
                continue;
            }
            log.write_histogram(h, Duration::ZERO, run, Tag::new(op.name()))
                .map_err(StatsError::LogWrite)?;
        }
        drop(log);
        Ok(out)
    }

    pub fn latency_timeline(&self) -> Vec<LatencyPoint> {
        let step = self.stats.interval_ns as f64 / 1e9;
        self.stats
            .intervals
            .iter()
            .enumerate()
            .filter(|(_, h)| !h.is_empty())
            .map(|(i, h)| LatencyPoint {
                t: (i + 1) as f64 * step,
                count: h.len(),
                p50_us: h.value_at_quantile(0.5) as f64,
                p99_us: h.value_at_quantile(0.99) as f64,
                max_us: h.max() as f64,
            })
            .collect()
    }
}

/// The counters a run changes, as memcached names them.
pub const SERVER_COUNTERS: [&str; 12] = [
    "cmd_get",
    "get_hits",
    "get_misses",
    "cmd_set",
    "delete_hits",
    "delete_misses",
    "cmd_touch",
    "touch_hits",
    "touch_misses",
    "incr_hits",
    "incr_misses",
    "total_connections",
];

/// Read a server's `stats` ("host[:port]" or "unix:/path") over a fresh connection
/// (blocking, with timeouts). Only numeric
/// counters are kept. A server that answers garbage gives an error, not a panic.
pub fn server_stats(
    addr: &str,
    timeout: Duration,
    tls: Option<&crate::transport::Tls>,
) -> Result<BTreeMap<String, i64>, StatsError> {
    let ep = crate::transport::Endpoint::parse(addr)?;
    let server = || addr.to_string();
    let io = |source| StatsError::Io {
        server: server(),
        source,
    };
    let mut s = ep.connect_blocking(timeout, tls).map_err(io)?;
    let mut req = Vec::new();
    kvproto::client::stats(&mut req, b"");
    s.write_all(&req).map_err(io)?;
    let mut buf = Vec::new();
    let mut out = BTreeMap::new();
    let mut chunk = [0u8; 16384];
    loop {
        // Parse what we have.
        let mut pos = 0;
        loop {
            match kvproto::client::parse_reply(&buf[pos..], 0) {
                kvproto::client::ParseReply::Reply(r, n) => {
                    pos += n;
                    match r {
                        kvproto::client::Reply::Stat { name, value } => {
                            if let (Ok(n), Ok(Ok(v))) = (
                                std::str::from_utf8(name),
                                std::str::from_utf8(value).map(|v| v.parse::<i64>()),
                            ) {
                                out.insert(n.to_string(), v);
                            }
                        }
                        kvproto::client::Reply::End => return Ok(out),
                        other => {
                            return Err(StatsError::Unexpected {
                                server: server(),
                                reply: format!("{other:?}"),
                            })
                        }
                    }
                }
                kvproto::client::ParseReply::Incomplete => break,
                kvproto::client::ParseReply::Invalid(reason) => {
                    return Err(StatsError::Invalid {
                        server: server(),
                        reason,
                    })
                }
            }
        }
        buf.drain(..pos);
        if buf.len() > (1 << 20) {
            return Err(StatsError::TooLong { server: server() });
        }
        let n = s.read(&mut chunk).map_err(io)?;
        if n == 0 {
            return Err(StatsError::Closed { server: server() });
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Counter deltas (after − before) summed over servers, with memcached's pairs of
/// hit/miss counters also added up under `delete_hits+misses` and `incr_hits+misses`.
pub fn server_delta(
    before: &[BTreeMap<String, i64>],
    after: &[BTreeMap<String, i64>],
) -> BTreeMap<String, i64> {
    let mut d = BTreeMap::new();
    for (b, a) in before.iter().zip(after) {
        for name in SERVER_COUNTERS {
            let v = a.get(name).copied().unwrap_or(0) - b.get(name).copied().unwrap_or(0);
            *d.entry(name.to_string()).or_insert(0) += v;
        }
    }
    let pair = |d: &BTreeMap<String, i64>, x: &str, y: &str| {
        d.get(x).copied().unwrap_or(0) + d.get(y).copied().unwrap_or(0)
    };
    let del = pair(&d, "delete_hits", "delete_misses");
    let incr = pair(&d, "incr_hits", "incr_misses");
    d.insert("delete_hits+misses".into(), del);
    d.insert("incr_hits+misses".into(), incr);
    d
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    fn report_with(latencies_us: &[u64]) -> Report {
        let mut st = Stats::default();
        let g = &mut st.ops[Op::Get.index()];
        for l in latencies_us {
            g.hist.saturating_record(l * 1000);
            g.count += 1;
            g.total += 1;
            g.total_keys += 1;
            g.hits += 1;
            g.total_hits += 1;
            if *l > 1000 {
                g.late += 1;
            }
        }
        st.issued = latencies_us.len() as u64;
        Report {
            settings: vec![("workload".into(), "test \"q\"".into())],
            pipeline: Pipeline::Window,
            depth: 1,
            seconds: 2.0,
            target_rate: Some(2.0),
            slo_us: 1000.0,
            stats: st,
            probe: None,
            timeline: vec![],
            load_seconds: None,
            server: None,
            start_unix_ns: 0,
            distinct_keys: None,
            participants: Vec::new(),
        }
    }

    #[test]
    fn summary_percentiles() {
        let lat: Vec<u64> = (1..=1000).collect();
        let r = report_with(&lat);
        let rows = r.rows();
        assert_eq!(rows.len(), 2);
        let g = &rows[0];
        assert_eq!(g.name, "get");
        assert_eq!(g.count, 1000);
        assert!((g.rate - 500.0).abs() < 1e-9);
        assert!((g.p50_us - 500.0).abs() <= 1.0, "{}", g.p50_us);
        assert!((g.p99_us - 990.0).abs() <= 1.0, "{}", g.p99_us);
        assert!((g.max_us - 1000.0).abs() <= 1.0);
        assert_eq!(g.late, 0);
    }

    /// The interval log reads back with hdrhistogram's own reader: one histogram per request
    /// kind that ran, tagged with its name, holding its latencies.
    #[test]
    fn hdr_log_reads_back() {
        use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
        use hdrhistogram::serialization::Deserializer;
        let r = report_with(&[10, 20, 2000]);
        let log = r.hdr_log().unwrap_or_else(|e| panic!("{e}"));
        let mut hists = Vec::new();
        for entry in IntervalLogIterator::new(&log) {
            if let Ok(LogEntry::Interval(ilh)) = entry {
                use base64::Engine as _;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(ilh.encoded_histogram())
                    .unwrap_or_default();
                let h: Histogram<u64> = Deserializer::new()
                    .deserialize(&mut bytes.as_slice())
                    .unwrap_or_else(|e| panic!("{e:?}"));
                hists.push((ilh.tag().map(|t| t.as_str().to_string()), h));
            }
        }
        assert_eq!(hists.len(), 1, "{hists:?}");
        assert_eq!(hists[0].0.as_deref(), Some("get"));
        assert_eq!(hists[0].1.len(), 3);
        assert_eq!(hists[0].1, r.stats.op(Op::Get).hist);
    }

    /// A report with every optional part, as `run --json` and `capacity --json` write it.
    pub(crate) fn full_report() -> Report {
        let mut r = report_with(&[10, 20, 2000, 123_457]);
        r.settings.push(("server".into(), "127.0.0.1:11211".into()));
        r.timeline = vec![
            Sample {
                t: 1.0,
                completed: 3,
                errors: 0,
            },
            Sample {
                t: 2.000_4,
                completed: 1,
                errors: 1,
            },
        ];
        r.server = Some(BTreeMap::from([
            ("cmd_get".to_string(), 4),
            ("evictions".into(), -1),
        ]));
        r.distinct_keys = Some(7);
        r.stats.timeouts = 2;
        let mut p = Participant::of("controller", 0.333_333_3, None, &r.stats, 2.0);
        p.clock_offset_ms = f64::NAN;
        r.participants = vec![
            p,
            Participant::of("10.0.0.2:7000", 2.0 / 3.0, Some(1e6 / 3.0), &r.stats, 2.0),
        ];
        r
    }

    #[test]
    fn the_json_report_is_what_it_was() {
        let got = full_report().json();
        let want = include_str!("../tests/data/report.json");
        assert_eq!(got, want);
    }

    #[test]
    fn json_is_well_formed_enough() {
        let r = report_with(&[10, 20, 2000]);
        let j = r.json();
        assert!(j.contains("\"workload\": \"test \\\"q\\\"\""), "{j}");
        assert!(j.contains("\"late\": 1"), "{j}");
        let opens = j.matches('{').count();
        let closes = j.matches('}').count();
        assert_eq!(opens, closes);
        assert!(r.table().contains("get"));
    }

    /// A connection driven by [`Pipeline::sends`] as the closed loop drives it (a send at the
    /// start and after every reply), with replies in order: a window keeps `depth`
    /// outstanding; a batch never has more than `depth` outstanding and sends the next
    /// batch only once every reply of the last is in.
    #[test]
    fn batches_wait_for_every_reply_and_windows_refill() {
        for depth in [1usize, 2, 7, 32] {
            for mode in [Pipeline::Window, Pipeline::Batch] {
                // Each outstanding request, by the batch (send) it went out in.
                let mut outstanding: std::collections::VecDeque<u64> = Default::default();
                let (mut sends, mut sent) = (0u64, 0u64);
                let mut send = |outstanding: &mut std::collections::VecDeque<u64>| {
                    let n = mode.sends(depth, outstanding.len());
                    if n > 0 {
                        sends += 1;
                        outstanding.extend(std::iter::repeat_n(sends, n));
                        sent += n as u64;
                    }
                    n
                };
                assert_eq!(send(&mut outstanding), depth, "{mode:?} starts full");
                for _ in 0..1000 {
                    let answered = outstanding.pop_front().unwrap_or(0);
                    let before = outstanding.len();
                    let n = send(&mut outstanding);
                    assert!(outstanding.len() <= depth, "{mode:?} {depth}");
                    match mode {
                        Pipeline::Window => {
                            assert_eq!((n, outstanding.len()), (1, depth), "refills one slot")
                        }
                        Pipeline::Batch if before > 0 => {
                            assert_eq!(n, 0, "a batch waits for its last reply");
                            assert_eq!(outstanding.front(), Some(&answered), "one batch at a time");
                        }
                        Pipeline::Batch => assert_eq!(n, depth, "the next batch is whole"),
                    }
                    // Every request outstanding belongs to one batch.
                    if mode == Pipeline::Batch {
                        assert!(outstanding.iter().all(|b| Some(b) == outstanding.front()));
                    }
                }
                match mode {
                    Pipeline::Window => assert_eq!(sent, depth as u64 + 1000),
                    // 1000 replies complete 1000 / depth batches, each followed by the next.
                    Pipeline::Batch => {
                        assert_eq!(sent, depth as u64 * (1 + 1000 / depth as u64))
                    }
                }
            }
        }
        assert_eq!(Pipeline::parse("batch"), Ok(Pipeline::Batch));
        assert_eq!(
            Pipeline::parse("burst").map_err(|e| e.to_string()),
            Err("bad --pipeline \"burst\": window | batch".into())
        );
        assert_eq!(
            serde_json::to_string(&Pipeline::Batch).ok().as_deref(),
            Some("\"batch\"")
        );
    }

    #[test]
    fn fell_behind_when_sends_are_late_or_skipped() {
        let mut r = report_with(&[10, 20]);
        assert!(!r.fell_behind());
        r.stats.skipped = 1;
        assert!(r.fell_behind());
        r.stats.skipped = 0;
        r.stats.late_sends = 1;
        assert!(r.fell_behind());
        r.target_rate = None;
        assert!(!r.fell_behind());
    }

    #[test]
    fn deltas_sum_over_servers() {
        let m = |g: i64, d: i64| {
            let mut m = BTreeMap::new();
            m.insert("cmd_get".to_string(), g);
            m.insert("delete_hits".to_string(), d);
            m
        };
        let d = server_delta(&[m(1, 0), m(5, 1)], &[m(11, 2), m(6, 4)]);
        assert_eq!(d["cmd_get"], 11);
        assert_eq!(d["delete_hits+misses"], 5);
    }
}
