//! Workloads: what requests to send (key space, sizes, popularity, command mix), built in by
//! name and overridable field by field. Timing (rates, connections) is the engine's business.
//!
//! Sources of the presets:
//! - `etc`, `usr`: Atikoglu et al. (SIGMETRICS 2012) as encoded in mutilate and used by IX:
//!   ETC = GEV key sizes, ETC value sizes, 3.3% updates; USR = 19-byte keys, 2-byte values,
//!   0.2% updates.
//! - `kvcache-a/b/c`: KV-Cache's Table 2 (KV-Blaster): GEV key sizes clamped to 1..=250,
//!   bucket power-law popularity, mixes A (100% get), B (96.77/3.23 get/set), C (70/25/5
//!   get/set/delete), fixed 64-byte values (the smallest of its fixed sizes).
//! - `memaslap`: memaslap's default 90/10 get/set with fixed 64-byte keys and 1 KiB values
//!   (the OSv case study's benchmark), uniform popularity.
//! - `fixedsize`, `microblog`, `wiki`, `imgpreview`, `friendfeed`: TSSP's Figure 1 summary
//!   statistics (mean, standard deviation, min, max object size; write fraction; multiget).
//!   The paper gives no distribution family, so sizes are fitted to its moments: microblog and
//!   friendfeed a normal(1 KiB, 0.26 KiB) clamped to [0.56, 2.7] KiB; wiki a generalized
//!   Pareto whose location, mean and sd match (0.30 KiB, 2.8 KiB, 10.4 KiB), clamped at
//!   1017 KiB; imgpreview a log-normal(25 KiB, 12.4 KiB) clamped to [4, 908] KiB. Popularity is
//!   "zipf-like" in the paper: zipf(0.99) here (uniform for fixedsize, as the paper says).
//!   friendfeed's multiget width is not given: 10 keys here.

use crate::dist::{mix64, Dist, Popularity, SizeDist, ETC_KEY};

/// Request kinds a workload mixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Op {
    Get,
    Set,
    Delete,
    Touch,
    Incr,
    /// `gat`: a get that also sets the expiry (binary GAT; classic `gat` under meta).
    Gat,
}

impl Op {
    pub const ALL: [Op; 6] = [Op::Get, Op::Set, Op::Delete, Op::Touch, Op::Incr, Op::Gat];
    /// How many kinds there are.
    pub const COUNT: usize = Op::ALL.len();

    pub fn name(self) -> &'static str {
        match self {
            Op::Get => "get",
            Op::Set => "set",
            Op::Delete => "delete",
            Op::Touch => "touch",
            Op::Incr => "incr",
            Op::Gat => "gat",
        }
    }

    pub fn index(self) -> usize {
        self as usize
    }
}

/// A request mix or a workload name that cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum WorkloadError {
    #[error("mix fractions must be non-negative and not all zero")]
    MixFractions,
    #[error("mix {spec:?}: expected KIND=FRACTION")]
    MixSyntax { spec: String },
    #[error("mix {spec:?}: unknown kind {kind:?}")]
    MixKind { spec: String, kind: String },
    #[error("mix {spec:?}: {source}")]
    MixNumber {
        spec: String,
        source: std::num::ParseFloatError,
    },
    #[error("unknown workload {name:?}; built in: {}", PRESETS.join(", "))]
    UnknownPreset { name: String },
}

/// The fraction of each request kind (normalised to sum to 1).
#[derive(Debug, Clone, PartialEq)]
pub struct Mix {
    /// Cumulative thresholds in [`Op::ALL`] order.
    cum: [f64; Op::COUNT],
}

impl Mix {
    pub fn new(fractions: [f64; Op::COUNT]) -> Result<Mix, WorkloadError> {
        let total: f64 = fractions.iter().sum();
        if !(total > 0.0 && total.is_finite()) || fractions.iter().any(|f| f.is_nan() || *f < 0.0) {
            return Err(WorkloadError::MixFractions);
        }
        let mut cum = [0.0; Op::COUNT];
        let mut acc = 0.0;
        for (i, f) in fractions.iter().enumerate() {
            acc += f / total;
            cum[i] = acc;
        }
        cum[Op::COUNT - 1] = 1.0;
        Ok(Mix { cum })
    }

    pub fn get_set(get: f64) -> Mix {
        Mix {
            cum: [get, 1.0, 1.0, 1.0, 1.0, 1.0],
        }
    }

    pub fn fraction(&self, op: Op) -> f64 {
        let i = op.index();
        self.cum[i] - if i == 0 { 0.0 } else { self.cum[i - 1] }
    }

    /// Parse `get=0.9,set=0.1` (names from [`Op`]; missing kinds are 0; percentages work too).
    pub fn parse(spec: &str) -> Result<Mix, WorkloadError> {
        let mut f = [0.0; Op::COUNT];
        for part in spec.split(',').filter(|p| !p.trim().is_empty()) {
            let (name, v) = part
                .split_once('=')
                .ok_or_else(|| WorkloadError::MixSyntax { spec: spec.into() })?;
            let op = Op::ALL
                .iter()
                .find(|o| o.name() == name.trim())
                .ok_or_else(|| WorkloadError::MixKind {
                    spec: spec.into(),
                    kind: name.into(),
                })?;
            let v: f64 = v.trim().trim_end_matches('%').parse().map_err(|source| {
                WorkloadError::MixNumber {
                    spec: spec.into(),
                    source,
                }
            })?;
            f[op.index()] = v;
        }
        Mix::new(f)
    }

    /// Pick a request kind for uniform `u` in [0, 1).
    pub fn pick(&self, u: f64) -> Op {
        for (i, c) in self.cum.iter().enumerate() {
            if u < *c {
                return Op::ALL[i];
            }
        }
        Op::Get
    }

    pub fn describe(&self) -> String {
        Op::ALL
            .iter()
            .filter(|o| self.fraction(**o) > 0.0)
            .map(|o| format!("{}={:.4}", o.name(), self.fraction(*o)))
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Everything about what to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub name: String,
    /// Number of distinct keys.
    pub keys: u64,
    pub key_size: SizeDist,
    pub value_size: SizeDist,
    /// Each key's value size is fixed (drawn from `value_size` by the key's number) rather
    /// than drawn at every set.
    pub value_per_key: bool,
    pub popularity: Popularity,
    pub mix: Mix,
    /// Keys per get request (1: single get).
    pub multiget: usize,
    /// Expiration time sent with sets and touches: drawn uniformly from `exptime` to
    /// `exptime_max` (the same: always `exptime`).
    pub exptime: i64,
    pub exptime_max: i64,
}

pub const PRESETS: [&str; 11] = [
    "etc",
    "usr",
    "kvcache-a",
    "kvcache-b",
    "kvcache-c",
    "memaslap",
    "fixedsize",
    "microblog",
    "wiki",
    "imgpreview",
    "friendfeed",
];

fn etc_keys() -> SizeDist {
    SizeDist::new(ETC_KEY, 1, 250)
}

impl Workload {
    /// A built-in workload by name.
    pub fn preset(name: &str) -> Result<Workload, WorkloadError> {
        let kib = 1024.0;
        let w = |keys, key_size, value_size, popularity, mix, multiget| Workload {
            name: name.to_string(),
            keys,
            key_size,
            value_size,
            value_per_key: false,
            popularity,
            mix,
            multiget,
            exptime: 0,
            exptime_max: 0,
        };
        let microblog_sizes = SizeDist::new(
            Dist::Normal {
                mean: kib,
                sd: 0.26 * kib,
            },
            (0.56 * kib) as usize,
            (2.7 * kib) as usize,
        );
        let zipf = Popularity::Zipf { alpha: 0.99 };
        Ok(match name {
            "etc" => w(
                1_000_000,
                etc_keys(),
                SizeDist::new(Dist::EtcValue, 1, 1_000_000),
                Popularity::Uniform,
                Mix::get_set(0.967),
                1,
            ),
            "usr" => w(
                1_000_000,
                SizeDist::fixed(19),
                SizeDist::fixed(2),
                Popularity::Uniform,
                Mix::get_set(0.998),
                1,
            ),
            "kvcache-a" | "kvcache-b" | "kvcache-c" => {
                let mix = match name {
                    "kvcache-a" => Mix::get_set(1.0),
                    "kvcache-b" => Mix::get_set(0.9677),
                    _ => Mix::new([0.70, 0.25, 0.05, 0.0, 0.0, 0.0])?,
                };
                w(
                    1_000_000,
                    etc_keys(),
                    SizeDist::fixed(64),
                    Popularity::KVCACHE,
                    mix,
                    1,
                )
            }
            "memaslap" => w(
                100_000,
                SizeDist::fixed(64),
                SizeDist::fixed(1024),
                Popularity::Uniform,
                Mix::get_set(0.9),
                1,
            ),
            "fixedsize" => w(
                100_000,
                SizeDist::fixed(16),
                SizeDist::fixed(128),
                Popularity::Uniform,
                Mix::get_set(1.0),
                1,
            ),
            "microblog" => w(
                100_000,
                SizeDist::fixed(16),
                microblog_sizes,
                zipf,
                Mix::get_set(0.80),
                1,
            ),
            "wiki" => {
                // GPD with location m0: mean − m0 = σ/(1−ξ), sd = σ/((1−ξ)√(1−2ξ)).
                let (m0, mean, sd) = (0.30 * kib, 2.8 * kib, 10.4 * kib);
                let r = sd / (mean - m0);
                let shape = (1.0 - 1.0 / (r * r)) / 2.0;
                let scale = (mean - m0) * (1.0 - shape);
                w(
                    100_000,
                    SizeDist::fixed(16),
                    SizeDist::new(
                        Dist::GPareto {
                            loc: m0,
                            scale,
                            shape,
                        },
                        m0 as usize,
                        (1017.0 * kib) as usize,
                    ),
                    zipf,
                    Mix::get_set(0.99),
                    1,
                )
            }
            "imgpreview" => w(
                100_000,
                SizeDist::fixed(16),
                SizeDist::new(
                    Dist::LogNormal {
                        mean: 25.0 * kib,
                        sd: 12.4 * kib,
                    },
                    (4.0 * kib) as usize,
                    (908.0 * kib) as usize,
                ),
                zipf,
                Mix::get_set(1.0),
                1,
            ),
            "friendfeed" => w(
                100_000,
                SizeDist::fixed(16),
                microblog_sizes,
                zipf,
                Mix::get_set(0.95),
                10,
            ),
            _ => return Err(WorkloadError::UnknownPreset { name: name.into() }),
        })
    }

    /// One line per field, for `kvblast workloads` and the report.
    pub fn describe(&self) -> String {
        format!(
            "{}: keys={} key_size={:?}[{},{}] value_size={:?}[{},{}]{} popularity={:?} mix={} multiget={}",
            self.name,
            self.keys,
            self.key_size.dist,
            self.key_size.min,
            self.key_size.max,
            self.value_size.dist,
            self.value_size.min,
            self.value_size.max,
            if self.value_per_key { " per key" } else { "" },
            self.popularity,
            self.mix.describe(),
            self.multiget
        )
    }
}

/// The key space: key `i` is its decimal index, zero-padded to a length drawn once per key from
/// the key-size distribution (as mutilate does; the length is a pure function of `i`, so
/// every thread and every run agree on key `i`). Lengths shorter than the index's digits are
/// raised to fit, longer than 250 lowered to 250.
#[derive(Debug, Clone)]
pub struct Keyspace {
    lens: Vec<u8>,
    n: u64,
    digits: usize,
}

impl Keyspace {
    pub fn new(n: u64, sizes: &SizeDist) -> Keyspace {
        let digits = n.saturating_sub(1).max(1).ilog10() as usize + 1;
        let fixed = sizes.min == sizes.max;
        let lens = if fixed {
            Vec::new()
        } else {
            (0..n)
                .map(|i| {
                    let u = ((mix64(i ^ 0x6B65_7973) >> 11) + 1) as f64 / (1u64 << 53) as f64;
                    sizes.quantile(u).clamp(digits, kvproto::MAX_KEY_LEN) as u8
                })
                .collect()
        };
        let fixed_len = sizes.min.clamp(digits, kvproto::MAX_KEY_LEN);
        Keyspace {
            lens: if fixed { vec![fixed_len as u8] } else { lens },
            n,
            digits,
        }
    }

    pub fn len(&self) -> u64 {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    /// The length of key `i`.
    pub fn key_len(&self, i: u64) -> usize {
        if self.lens.len() == 1 {
            self.lens[0] as usize
        } else {
            self.lens
                .get(i as usize)
                .copied()
                .unwrap_or(self.digits as u8) as usize
        }
    }

    /// Append key `i` to `buf`.
    pub fn write_key(&self, i: u64, buf: &mut Vec<u8>) {
        let len = self.key_len(i);
        let start = buf.len();
        buf.resize(start + len, b'0');
        let mut v = i;
        for b in buf[start..].iter_mut().rev() {
            *b = b'0' + (v % 10) as u8;
            v /= 10;
            if v == 0 {
                break;
            }
        }
    }

    /// Key `i` as a new vector (for tests and routing tables).
    pub fn key(&self, i: u64) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.key_len(i));
        self.write_key(i, &mut v);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_builds() {
        for name in PRESETS {
            let w = Workload::preset(name).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(w.name, name);
            assert!(w.keys > 0);
        }
        assert!(Workload::preset("nope").is_err());
    }

    #[test]
    fn mixes_match_the_sources() {
        let b = Workload::preset("kvcache-b").unwrap_or_else(|e| panic!("{e}"));
        assert!((b.mix.fraction(Op::Set) - 0.0323).abs() < 1e-9);
        let c = Workload::preset("kvcache-c").unwrap_or_else(|e| panic!("{e}"));
        assert!((c.mix.fraction(Op::Delete) - 0.05).abs() < 1e-9);
        assert!((c.mix.fraction(Op::Set) - 0.25).abs() < 1e-9);
        let usr = Workload::preset("usr").unwrap_or_else(|e| panic!("{e}"));
        assert!((usr.mix.fraction(Op::Set) - 0.002).abs() < 1e-9);
    }

    #[test]
    fn wiki_fit_matches_the_papers_moments() {
        let w = Workload::preset("wiki").unwrap_or_else(|e| panic!("{e}"));
        let Dist::GPareto { loc, scale, shape } = w.value_size.dist else {
            panic!("wiki sizes are a GPD");
        };
        let mean = loc + scale / (1.0 - shape);
        let sd = scale / ((1.0 - shape) * (1.0 - 2.0 * shape).sqrt());
        assert!((mean - 2.8 * 1024.0).abs() < 1e-6);
        assert!((sd - 10.4 * 1024.0).abs() < 1e-6);
    }

    #[test]
    fn mix_parse_and_pick() {
        let m = Mix::parse("get=90,set=10").unwrap_or_else(|e| panic!("{e}"));
        assert!((m.fraction(Op::Get) - 0.9).abs() < 1e-12);
        assert_eq!(m.pick(0.0), Op::Get);
        assert_eq!(m.pick(0.95), Op::Set);
        assert_eq!(m.pick(0.999_999), Op::Set);
        assert!(Mix::parse("get=1,bogus=2").is_err());
        assert!(Mix::parse("get=0").is_err());
        assert!(Mix::parse("get").is_err());
    }

    #[test]
    fn keys_are_stable_padded_and_bounded() {
        let ks = Keyspace::new(1000, &SizeDist::new(ETC_KEY, 1, 250));
        for i in 0..1000 {
            let k = ks.key(i);
            assert!(k.len() >= 3 && k.len() <= 250);
            let s = std::str::from_utf8(&k).unwrap_or("");
            assert_eq!(s.parse::<u64>().ok(), Some(i));
        }
        let again = Keyspace::new(1000, &SizeDist::new(ETC_KEY, 1, 250));
        assert_eq!(ks.key(77), again.key(77));
        let usr = Keyspace::new(1_000_000, &SizeDist::fixed(19));
        assert_eq!(usr.key(42), b"0000000000000000042");
        // A fixed size shorter than the index is raised to fit.
        let short = Keyspace::new(100_000, &SizeDist::fixed(2));
        assert_eq!(short.key(99_999), b"99999");
        assert_eq!(short.key(5), b"00005");
    }
}
