//! Random distributions for workloads: sizes, inter-arrival times and key popularity.
//!
//! Every continuous distribution here is sampled by inverse transform: [`Dist::quantile`] maps a
//! uniform number in (0, 1] to a sample, so a key's size can be a pure function of the key
//! (hash the key index to a uniform, take the quantile) and a sampler costs one uniform and a
//! few floating-point operations. Discrete popularity distributions (zipf, the KV-Cache bucket
//! power law) use a precomputed alias table, which draws a rank in O(1).
//!
//! The random source is the caller's seeded [`Rng`]; nothing here reads the clock or the OS.

use std::num::ParseFloatError;

use rand::Rng;

use crate::units::BadChoice;

/// A distribution, popularity or key share that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DistError {
    #[error("distribution {spec:?}: hist needs a file (hist:PATH)")]
    HistNeedsFile { spec: String },
    #[error(transparent)]
    Histogram(#[from] SizeHistogramError),
    #[error("distribution {spec:?}: {source}")]
    Number {
        spec: String,
        source: ParseFloatError,
    },
    /// A family given the wrong number of parameters (or one that is not finite).
    #[error("distribution {spec:?}: {family} takes {want} finite number(s)")]
    Parameters {
        spec: String,
        family: String,
        want: usize,
    },
    #[error("{spec:?}: lognormal needs mean > 0 and sd > 0")]
    LogNormal { spec: String },
    #[error("{spec:?}: uniform needs LO <= HI")]
    UniformBounds { spec: String },
    #[error("unknown distribution {spec:?}")]
    Unknown { spec: String },
    #[error("popularity {spec:?}: {source}")]
    PopularityNumber {
        spec: String,
        source: ParseFloatError,
    },
    #[error(
        "bad popularity {spec:?}: uniform | zipf:ALPHA | buckets[:SIZE,ALPHA,XMIN] | sequential"
    )]
    Popularity { spec: String },
    #[error("alias table over {0} outcomes")]
    AliasSize(usize),
    #[error("weights must be finite, non-negative, and not all zero")]
    AliasWeights,
    #[error("key count must be at least 1")]
    NoKeys,
    /// A participant's share of the key space with no key in it.
    #[error("key share {part} of {parts} is empty with {keys} keys")]
    EmptyShare { part: u64, parts: u64, keys: u64 },
}

/// A size histogram (a `hist:` file or a `hist-inline:` list) that cannot be used. Errors
/// name the file and line (`PATH:LINE: ...`) or the inline entry.
#[derive(Debug, thiserror::Error)]
pub enum SizeHistogramError {
    #[error("{file}:{line}: {source}")]
    Line {
        file: String,
        line: usize,
        source: HistEntryError,
    },
    #[error("hist-inline entry {entry}: {source}")]
    Entry {
        entry: usize,
        source: HistEntryError,
    },
    #[error("{file}: no SIZE WEIGHT entries")]
    NoEntries { file: String },
    #[error("{file}: every weight is zero")]
    AllZero { file: String },
    #[error("{file}: the weights' sum is not finite")]
    SumNotFinite { file: String },
    #[error("{file}: more than {MAX_HIST_LINES} lines")]
    TooManyLines { file: String },
    #[error("hist-inline: more than {MAX_HIST_LINES} entries")]
    TooManyEntries,
    #[error("hist-inline: longer than {MAX_HIST_BYTES} bytes")]
    InlineTooLong,
    #[error("histogram {file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("histogram {file}: {bytes} bytes, more than the {MAX_HIST_BYTES} allowed")]
    FileTooLarge { file: String, bytes: u64 },
    /// A file that grew past the limit while it was read.
    #[error("histogram {file}: more than the {MAX_HIST_BYTES} bytes allowed")]
    ReadTooLarge { file: String },
    #[error("histogram {file}: not UTF-8 text ({source})")]
    NotUtf8 {
        file: String,
        source: std::string::FromUtf8Error,
    },
}

/// What is wrong with one `SIZE WEIGHT` line or `SIZE:WEIGHT` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HistEntryError {
    #[error("expected SIZE WEIGHT, got {0:?}")]
    Fields(String),
    #[error("expected SIZE:WEIGHT, got {0:?}")]
    InlineFields(String),
    #[error("unexpected third field {0:?}")]
    ThirdField(String),
    #[error("size {0:?} is not a whole number >= 0")]
    Size(String),
    #[error("size {size} is outside {lo}..={hi}")]
    SizeRange { size: u64, lo: u64, hi: u64 },
    #[error("weight {0:?} is not a number")]
    Weight(String),
    #[error("weight {0:?} is not finite")]
    WeightNotFinite(String),
    #[error("weight {0} is negative")]
    WeightNegative(String),
}

/// A uniform number in (0, 1]: never 0, so that `ln U` and `U^-ξ` are finite.
pub fn unit_open0(rng: &mut impl Rng) -> f64 {
    ((rng.next_u64() >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A number in (0, 1] fixed by `key` and spread as uniformly as [`unit_open0`]'s
/// (splitmix64's finalizer of the key number).
pub fn unit_of_key(key: u64) -> f64 {
    let mut z = key.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    ((z >> 11) + 1) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform number in [0, 1).
pub fn unit(rng: &mut impl Rng) -> f64 {
    (rng.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

/// A uniform integer in [0, n) (n > 0), by Lemire's multiply-shift (bias below 2^-32 for the
/// key counts used here, which is far under what any test could see).
pub fn below(rng: &mut impl Rng, n: u64) -> u64 {
    ((u128::from(rng.next_u64()) * u128::from(n)) >> 64) as u64
}

/// splitmix64: a bijective mixer, used to turn a key index into a uniform number.
pub fn mix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Probabilities of ETC value sizes 0..=14 bytes (Atikoglu et al. 2012, as tabulated in
/// mutilate's `createFacebookValue`); the remaining mass (about 0.558) is the generalized
/// Pareto tail starting at 15 bytes.
pub const ETC_SMALL_VALUES: [f64; 15] = [
    0.00536, 0.00047, 0.17820, 0.09239, 0.00018, 0.02740, 0.00065, 0.00606, 0.00023, 0.00837,
    0.00837, 0.08989, 0.00092, 0.00326, 0.01980,
];

/// ETC key size: GEV(30.7984, 8.20449, 0.078688).
pub const ETC_KEY: Dist = Dist::Gev {
    loc: 30.7984,
    scale: 8.20449,
    shape: 0.078688,
};
/// The tail of the ETC value size: generalized Pareto(15, 214.476, 0.348238).
pub const ETC_VALUE_TAIL: Dist = Dist::GPareto {
    loc: 15.0,
    scale: 214.476,
    shape: 0.348238,
};
/// Shape of the ETC inter-arrival generalized Pareto (location 0, scale 16.0292 µs).
pub const ETC_IA_SHAPE: f64 = 0.154971;

/// A real-valued distribution, sampled by inverse transform.
#[derive(Debug, Clone, PartialEq)]
pub enum Dist {
    Fixed(f64),
    /// Uniform on [lo, hi].
    Uniform {
        lo: f64,
        hi: f64,
    },
    Normal {
        mean: f64,
        sd: f64,
    },
    /// Log-normal given by the mean and standard deviation of the variable itself.
    LogNormal {
        mean: f64,
        sd: f64,
    },
    Exponential {
        mean: f64,
    },
    /// Generalized extreme value: x = µ + σ((−ln U)^(−ξ) − 1)/ξ.
    Gev {
        loc: f64,
        scale: f64,
        shape: f64,
    },
    /// Generalized Pareto: x = µ + σ(U^(−ξ) − 1)/ξ.
    GPareto {
        loc: f64,
        scale: f64,
        shape: f64,
    },
    /// ETC value size: [`ETC_SMALL_VALUES`] for 0..=14 bytes, else [`ETC_VALUE_TAIL`].
    EtcValue,
    /// An empirical size histogram (`hist:PATH` or `hist-inline:SIZE:W,...`), as KV-Blaster
    /// configures its traffic generators; see [`SizeHistogram`].
    Hist(std::sync::Arc<SizeHistogram>),
}

fn gev_quantile(loc: f64, scale: f64, shape: f64, u: f64) -> f64 {
    let t = -u.ln();
    if shape.abs() < 1e-12 {
        loc - scale * t.ln()
    } else {
        loc + scale * (t.powf(-shape) - 1.0) / shape
    }
}

fn gpareto_quantile(loc: f64, scale: f64, shape: f64, u: f64) -> f64 {
    if shape.abs() < 1e-12 {
        loc - scale * u.ln()
    } else {
        loc + scale * (u.powf(-shape) - 1.0) / shape
    }
}

/// The standard normal quantile (Acklam's rational approximation, relative error < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// The standard normal CDF (via erfc, Numerical Recipes' Chebyshev fit, error < 1.2e-7).
pub fn normal_cdf(x: f64) -> f64 {
    let z = -x / std::f64::consts::SQRT_2;
    let t = 1.0 / (1.0 + 0.5 * z.abs());
    let y = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    let erfc = if z >= 0.0 { y } else { 2.0 - y };
    0.5 * erfc
}

impl Dist {
    /// The sample for uniform `u` in (0, 1]. Larger `u` gives a larger sample for the
    /// continuous distributions except GEV and generalized Pareto, whose formulas (as
    /// published) run the other way; either way `u` uniform gives the distribution.
    pub fn quantile(&self, u: f64) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            Dist::Hist(ref h) => h.quantile(u),
            Dist::Uniform { lo, hi } => lo + (hi - lo) * u,
            Dist::Normal { mean, sd } => mean + sd * normal_quantile(u),
            Dist::LogNormal { mean, sd } => {
                let (mu, sigma) = lognormal_params(mean, sd);
                (mu + sigma * normal_quantile(u)).exp()
            }
            Dist::Exponential { mean } => -mean * u.ln(),
            Dist::Gev { loc, scale, shape } => gev_quantile(loc, scale, shape, u),
            Dist::GPareto { loc, scale, shape } => gpareto_quantile(loc, scale, shape, u),
            Dist::EtcValue => {
                // The table's mass sits at the top of (0, 1]; below it, rescale u to (0, 1]
                // for the tail so that one uniform suffices.
                let mut acc = 0.0;
                let small: f64 = ETC_SMALL_VALUES.iter().sum();
                let v = 1.0 - u; // in [0, 1)
                for (size, p) in ETC_SMALL_VALUES.iter().enumerate() {
                    acc += p;
                    if v < acc {
                        return size as f64;
                    }
                }
                let w = ((v - small) / (1.0 - small)).clamp(0.0, 1.0);
                ETC_VALUE_TAIL.quantile((1.0 - w).max(f64::MIN_POSITIVE))
            }
        }
    }

    /// Draw one sample.
    pub fn sample(&self, rng: &mut impl Rng) -> f64 {
        match *self {
            Dist::Fixed(v) => v,
            _ => self.quantile(unit_open0(rng)),
        }
    }

    /// P(X <= x).
    pub fn cdf(&self, x: f64) -> f64 {
        match *self {
            Dist::Hist(ref h) => h.cdf(x),
            Dist::Fixed(v) => {
                if x >= v {
                    1.0
                } else {
                    0.0
                }
            }
            Dist::Uniform { lo, hi } => ((x - lo) / (hi - lo)).clamp(0.0, 1.0),
            Dist::Normal { mean, sd } => normal_cdf((x - mean) / sd),
            Dist::LogNormal { mean, sd } => {
                if x <= 0.0 {
                    return 0.0;
                }
                let (mu, sigma) = lognormal_params(mean, sd);
                normal_cdf((x.ln() - mu) / sigma)
            }
            Dist::Exponential { mean } => {
                if x <= 0.0 {
                    0.0
                } else {
                    1.0 - (-x / mean).exp()
                }
            }
            Dist::Gev { loc, scale, shape } => {
                let s = (x - loc) / scale;
                if shape.abs() < 1e-12 {
                    (-(-s).exp()).exp()
                } else {
                    let t = 1.0 + shape * s;
                    if t <= 0.0 {
                        return if shape > 0.0 { 0.0 } else { 1.0 };
                    }
                    (-t.powf(-1.0 / shape)).exp()
                }
            }
            Dist::GPareto { loc, scale, shape } => {
                if x < loc {
                    return 0.0;
                }
                let s = (x - loc) / scale;
                if shape.abs() < 1e-12 {
                    1.0 - (-s).exp()
                } else {
                    let t = 1.0 + shape * s;
                    if t <= 0.0 {
                        return 1.0;
                    }
                    1.0 - t.powf(-1.0 / shape)
                }
            }
            Dist::EtcValue => {
                let small: f64 = ETC_SMALL_VALUES.iter().sum();
                if x < 0.0 {
                    0.0
                } else if x < 15.0 {
                    let k = x.floor() as usize;
                    ETC_SMALL_VALUES[..=k.min(14)].iter().sum()
                } else {
                    small + (1.0 - small) * ETC_VALUE_TAIL.cdf(x)
                }
            }
        }
    }

    /// The mean, where it is finite.
    pub fn mean(&self) -> Option<f64> {
        match *self {
            Dist::Fixed(v) => Some(v),
            Dist::Uniform { lo, hi } => Some((lo + hi) / 2.0),
            Dist::Normal { mean, .. } | Dist::LogNormal { mean, .. } => Some(mean),
            Dist::Exponential { mean } => Some(mean),
            Dist::Hist(ref h) => Some(h.mean()),
            Dist::GPareto { loc, scale, shape } if shape < 1.0 => Some(loc + scale / (1.0 - shape)),
            Dist::EtcValue => {
                let small: f64 = ETC_SMALL_VALUES.iter().sum();
                let head: f64 = ETC_SMALL_VALUES
                    .iter()
                    .enumerate()
                    .map(|(i, p)| i as f64 * p)
                    .sum();
                Some(head + (1.0 - small) * ETC_VALUE_TAIL.mean()?)
            }
            _ => None,
        }
    }

    /// Parse `fixed:V`, a bare number, `uniform:LO,HI`, `normal:MEAN,SD`,
    /// `lognormal:MEAN,SD`, `exp:MEAN`, `gev:LOC,SCALE,SHAPE`, `gpareto:LOC,SCALE,SHAPE`,
    /// `etc-key`, `etc-value`, `hist:PATH` (reads the file), `hist-inline:SIZE:W,...`.
    /// Histogram sizes may be any integer >= 0; see [`Dist::parse_sizes`] for bounds.
    pub fn parse(spec: &str) -> Result<Dist, DistError> {
        Dist::parse_sizes(spec, 0, u64::MAX)
    }

    /// [`Dist::parse`], with a histogram's sizes required to lie in `lo..=hi` (key sizes
    /// 1..=250, value sizes 0..=the largest value); the other families are clamped later by
    /// their [`SizeDist`].
    pub fn parse_sizes(spec: &str, lo: u64, hi: u64) -> Result<Dist, DistError> {
        let spec = spec.trim();
        if let Ok(v) = spec.parse::<f64>() {
            return Ok(Dist::Fixed(v));
        }
        let (name, args) = spec.split_once(':').unwrap_or((spec, ""));
        match name {
            "hist" => {
                if args.is_empty() {
                    return Err(DistError::HistNeedsFile { spec: spec.into() });
                }
                let h = SizeHistogram::read_file(std::path::Path::new(args), lo, hi)?;
                return Ok(Dist::Hist(std::sync::Arc::new(h)));
            }
            "hist-inline" => {
                let h = SizeHistogram::parse_inline(args, lo, hi)?;
                return Ok(Dist::Hist(std::sync::Arc::new(h)));
            }
            _ => {}
        }
        let nums: Vec<f64> = if args.is_empty() {
            Vec::new()
        } else {
            args.split(',')
                .map(|a| a.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|source| DistError::Number {
                    spec: spec.into(),
                    source,
                })?
        };
        let want = |n: usize| {
            if nums.len() == n && nums.iter().all(|x| x.is_finite()) {
                Ok(())
            } else {
                Err(DistError::Parameters {
                    spec: spec.into(),
                    family: name.into(),
                    want: n,
                })
            }
        };
        let d = match name {
            "fixed" => {
                want(1)?;
                Dist::Fixed(nums[0])
            }
            "uniform" => {
                want(2)?;
                Dist::Uniform {
                    lo: nums[0],
                    hi: nums[1],
                }
            }
            "normal" => {
                want(2)?;
                Dist::Normal {
                    mean: nums[0],
                    sd: nums[1],
                }
            }
            "lognormal" => {
                want(2)?;
                if nums[0] <= 0.0 || nums[1] <= 0.0 {
                    return Err(DistError::LogNormal { spec: spec.into() });
                }
                Dist::LogNormal {
                    mean: nums[0],
                    sd: nums[1],
                }
            }
            "exp" | "exponential" => {
                want(1)?;
                Dist::Exponential { mean: nums[0] }
            }
            "gev" => {
                want(3)?;
                Dist::Gev {
                    loc: nums[0],
                    scale: nums[1],
                    shape: nums[2],
                }
            }
            "gpareto" | "pareto" => {
                want(3)?;
                Dist::GPareto {
                    loc: nums[0],
                    scale: nums[1],
                    shape: nums[2],
                }
            }
            "etc-key" => {
                want(0)?;
                ETC_KEY
            }
            "etc-value" => {
                want(0)?;
                Dist::EtcValue
            }
            _ => return Err(DistError::Unknown { spec: spec.into() }),
        };
        if let Dist::Uniform { lo, hi } = d {
            if hi < lo {
                return Err(DistError::UniformBounds { spec: spec.into() });
            }
        }
        Ok(d)
    }
}

/// The most lines a histogram file may have.
pub const MAX_HIST_LINES: usize = 1_000_000;
/// The largest histogram file (or inline list) accepted, in bytes.
pub const MAX_HIST_BYTES: u64 = 64 << 20;

/// An empirical size distribution: sizes with non-negative weights, as KV-Blaster configures
/// its traffic generators with histogram files and draws from them by inverse transform
/// sampling. The cumulative distribution is computed once; a draw is a binary search over it
/// (O(log n)), and [`SizeHistogram::quantile`] is monotone in `u`, so a key's size can be a
/// pure function of the key as for the other distributions.
///
/// The file format (kvblast's; KV-Blaster's paper does not publish one, only that a
/// histogram of sizes and frequencies is written to a file): text, one `SIZE WEIGHT` pair
/// per line, separated by whitespace (or a comma); `SIZE` a whole number of bytes, `WEIGHT` a
/// finite number >= 0 (a count or a probability: only ratios matter); `#` starts a comment;
/// blank lines are ignored; a size given twice has its weights added. The weights must not
/// all be zero. Sizes of weight zero are never drawn.
#[derive(Clone)]
pub struct SizeHistogram {
    /// Distinct sizes of positive weight, ascending.
    sizes: Vec<u64>,
    /// Their weights, as given (summed over repeated sizes).
    weights: Vec<f64>,
    /// cdf[i] = P(size <= sizes[i]); the last is exactly 1.
    cdf: Vec<f64>,
    /// Where it came from (a path or `hist-inline`), for messages.
    source: String,
}

impl PartialEq for SizeHistogram {
    /// The same distribution, wherever it was read from.
    fn eq(&self, o: &SizeHistogram) -> bool {
        self.sizes == o.sizes && self.weights == o.weights
    }
}

impl std::fmt::Debug for SizeHistogram {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hist({} sizes in {}..={}, mean {:.1}, from {})",
            self.sizes.len(),
            self.min_size(),
            self.max_size(),
            self.mean(),
            self.source
        )
    }
}

/// One `SIZE WEIGHT` entry, checked: a whole size in `lo..=hi` and a finite weight >= 0.
fn hist_entry(size: &str, weight: &str, lo: u64, hi: u64) -> Result<(u64, f64), HistEntryError> {
    let s: u64 = size
        .parse()
        .map_err(|_| HistEntryError::Size(size.into()))?;
    if s < lo || s > hi {
        return Err(HistEntryError::SizeRange { size: s, lo, hi });
    }
    let w: f64 = weight
        .parse()
        .map_err(|_| HistEntryError::Weight(weight.into()))?;
    if !w.is_finite() {
        return Err(HistEntryError::WeightNotFinite(weight.into()));
    }
    if w < 0.0 {
        return Err(HistEntryError::WeightNegative(weight.into()));
    }
    Ok((s, w))
}

impl SizeHistogram {
    /// Build from checked `(size, weight)` pairs.
    fn from_entries(
        entries: Vec<(u64, f64)>,
        source: &str,
    ) -> Result<SizeHistogram, SizeHistogramError> {
        let file = || source.to_string();
        if entries.is_empty() {
            return Err(SizeHistogramError::NoEntries { file: file() });
        }
        let mut by_size = std::collections::BTreeMap::new();
        for (s, w) in entries {
            *by_size.entry(s).or_insert(0.0) += w;
        }
        by_size.retain(|_, w| *w > 0.0);
        let total: f64 = by_size.values().sum();
        if by_size.is_empty() {
            return Err(SizeHistogramError::AllZero { file: file() });
        }
        if !total.is_finite() {
            return Err(SizeHistogramError::SumNotFinite { file: file() });
        }
        let (sizes, weights): (Vec<u64>, Vec<f64>) = by_size.into_iter().unzip();
        let mut acc = 0.0;
        let mut cdf: Vec<f64> = weights
            .iter()
            .map(|w| {
                acc += w;
                (acc / total).min(1.0)
            })
            .collect();
        if let Some(last) = cdf.last_mut() {
            *last = 1.0;
        }
        Ok(SizeHistogram {
            sizes,
            weights,
            cdf,
            source: source.to_string(),
        })
    }

    /// Parse the text of a histogram file (see the type's documentation); `source` names it
    /// in errors, which give the line: `PATH:LINE: message`.
    pub fn parse_text(
        text: &str,
        source: &str,
        lo: u64,
        hi: u64,
    ) -> Result<SizeHistogram, SizeHistogramError> {
        let mut entries = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            if i >= MAX_HIST_LINES {
                return Err(SizeHistogramError::TooManyLines {
                    file: source.into(),
                });
            }
            let line = raw.split('#').next().unwrap_or("");
            let mut fields = line
                .split(|c: char| c.is_whitespace() || c == ',')
                .filter(|f| !f.is_empty());
            let Some(size) = fields.next() else {
                continue;
            };
            let at = |e: HistEntryError| SizeHistogramError::Line {
                file: source.into(),
                line: i + 1,
                source: e,
            };
            let weight = fields
                .next()
                .ok_or_else(|| at(HistEntryError::Fields(line.trim().into())))?;
            if let Some(extra) = fields.next() {
                return Err(at(HistEntryError::ThirdField(extra.into())));
            }
            entries.push(hist_entry(size, weight, lo, hi).map_err(at)?);
        }
        SizeHistogram::from_entries(entries, source)
    }

    /// Read a histogram file (at most [`MAX_HIST_BYTES`] bytes and [`MAX_HIST_LINES`] lines).
    pub fn read_file(
        path: &std::path::Path,
        lo: u64,
        hi: u64,
    ) -> Result<SizeHistogram, SizeHistogramError> {
        use std::io::Read;
        let name = path.display().to_string();
        let io = |source| SizeHistogramError::Io {
            file: name.clone(),
            source,
        };
        let f = std::fs::File::open(path).map_err(io)?;
        if let Ok(m) = f.metadata() {
            if m.len() > MAX_HIST_BYTES {
                return Err(SizeHistogramError::FileTooLarge {
                    file: name,
                    bytes: m.len(),
                });
            }
        }
        let mut bytes = Vec::new();
        f.take(MAX_HIST_BYTES + 1)
            .read_to_end(&mut bytes)
            .map_err(io)?;
        if bytes.len() as u64 > MAX_HIST_BYTES {
            return Err(SizeHistogramError::ReadTooLarge { file: name });
        }
        let text = String::from_utf8(bytes).map_err(|source| SizeHistogramError::NotUtf8 {
            file: name.clone(),
            source,
        })?;
        SizeHistogram::parse_text(&text, &name, lo, hi)
    }

    /// Parse the inline form `SIZE:WEIGHT,SIZE:WEIGHT,...` (what a controller sends its agents
    /// in place of a file; see [`Self::to_inline`]).
    pub fn parse_inline(list: &str, lo: u64, hi: u64) -> Result<SizeHistogram, SizeHistogramError> {
        const SRC: &str = "hist-inline";
        if list.len() as u64 > MAX_HIST_BYTES {
            return Err(SizeHistogramError::InlineTooLong);
        }
        let mut entries = Vec::new();
        for (i, item) in list.split(',').enumerate() {
            if i >= MAX_HIST_LINES {
                return Err(SizeHistogramError::TooManyEntries);
            }
            let at = |e: HistEntryError| SizeHistogramError::Entry {
                entry: i + 1,
                source: e,
            };
            let item = item.trim();
            if item.is_empty() {
                continue;
            }
            let (size, weight) = item
                .split_once(':')
                .ok_or_else(|| at(HistEntryError::InlineFields(item.into())))?;
            entries.push(hist_entry(size.trim(), weight.trim(), lo, hi).map_err(at)?);
        }
        SizeHistogram::from_entries(entries, SRC)
    }

    /// The inline form, `SIZE:WEIGHT,...`: parsing it gives an equal histogram (weights are
    /// written in Rust's shortest round-trip form).
    pub fn to_inline(&self) -> String {
        let mut out = String::with_capacity(self.sizes.len() * 12);
        for (i, (s, w)) in self.sizes.iter().zip(&self.weights).enumerate() {
            use std::fmt::Write as _;
            if i > 0 {
                out.push(',');
            }
            let _ = write!(out, "{s}:{w:?}");
        }
        out
    }

    /// The size for uniform `u` in (0, 1]: the smallest size whose cumulative probability
    /// reaches `u` (inverse transform; a binary search).
    pub fn quantile(&self, u: f64) -> f64 {
        let i = self.cdf.partition_point(|&c| c < u);
        self.sizes[i.min(self.sizes.len() - 1)] as f64
    }

    /// P(size <= x).
    pub fn cdf(&self, x: f64) -> f64 {
        if x.is_nan() {
            return 0.0;
        }
        let i = self.sizes.partition_point(|&s| (s as f64) <= x);
        if i == 0 {
            0.0
        } else {
            self.cdf[i - 1]
        }
    }

    pub fn mean(&self) -> f64 {
        let total: f64 = self.weights.iter().sum();
        self.sizes
            .iter()
            .zip(&self.weights)
            .map(|(s, w)| *s as f64 * w / total)
            .sum()
    }

    /// The drawn sizes (weight > 0), ascending, and their probabilities.
    pub fn sizes(&self) -> &[u64] {
        &self.sizes
    }

    pub fn probabilities(&self) -> Vec<f64> {
        let total: f64 = self.weights.iter().sum();
        self.weights.iter().map(|w| w / total).collect()
    }

    pub fn min_size(&self) -> u64 {
        self.sizes.first().copied().unwrap_or(0)
    }

    pub fn max_size(&self) -> u64 {
        self.sizes.last().copied().unwrap_or(0)
    }
}

fn lognormal_params(mean: f64, sd: f64) -> (f64, f64) {
    let s2 = (1.0 + (sd * sd) / (mean * mean)).ln();
    (mean.ln() - s2 / 2.0, s2.sqrt())
}

/// A size in bytes: a distribution rounded to the nearest integer and clamped to [min, max].
#[derive(Debug, Clone, PartialEq)]
pub struct SizeDist {
    pub dist: Dist,
    pub min: usize,
    pub max: usize,
}

impl SizeDist {
    pub fn fixed(n: usize) -> SizeDist {
        SizeDist {
            dist: Dist::Fixed(n as f64),
            min: n,
            max: n,
        }
    }

    pub fn new(dist: Dist, min: usize, max: usize) -> SizeDist {
        SizeDist { dist, min, max }
    }

    pub fn quantile(&self, u: f64) -> usize {
        self.clamp(self.dist.quantile(u))
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        self.clamp(self.dist.sample(rng))
    }

    fn clamp(&self, x: f64) -> usize {
        if x.is_nan() {
            return self.min;
        }
        // `as` saturates for out-of-range floats.
        (x.round().max(0.0) as usize).clamp(self.min, self.max.max(self.min))
    }
}

/// An alias table (Vose): draws index i with probability weights[i] / sum in O(1).
#[derive(Debug, Clone)]
pub struct AliasTable {
    prob: Vec<f64>,
    alias: Vec<u32>,
}

impl AliasTable {
    /// Build from non-negative weights (at least one positive, at most 2^32 of them).
    pub fn new(weights: &[f64]) -> Result<AliasTable, DistError> {
        let n = weights.len();
        if n == 0 || n > u32::MAX as usize {
            return Err(DistError::AliasSize(n));
        }
        let sum: f64 = weights.iter().sum();
        if !(sum > 0.0 && sum.is_finite()) || weights.iter().any(|w| w.is_nan() || *w < 0.0) {
            return Err(DistError::AliasWeights);
        }
        let mut prob: Vec<f64> = weights.iter().map(|w| w * n as f64 / sum).collect();
        let mut alias = vec![0u32; n];
        let mut small: Vec<u32> = Vec::new();
        let mut large: Vec<u32> = Vec::new();
        for (i, p) in prob.iter().enumerate() {
            if *p < 1.0 {
                small.push(i as u32);
            } else {
                large.push(i as u32);
            }
        }
        while let (Some(&s), Some(&l)) = (small.last(), large.last()) {
            small.pop();
            alias[s as usize] = l;
            let pl = prob[l as usize] + prob[s as usize] - 1.0;
            prob[l as usize] = pl;
            if pl < 1.0 {
                large.pop();
                small.push(l);
            }
        }
        // Leftovers are 1 up to rounding.
        for i in small.into_iter().chain(large) {
            prob[i as usize] = 1.0;
        }
        Ok(AliasTable { prob, alias })
    }

    pub fn len(&self) -> usize {
        self.prob.len()
    }

    pub fn is_empty(&self) -> bool {
        self.prob.is_empty()
    }

    pub fn sample(&self, rng: &mut impl Rng) -> usize {
        let x = rng.next_u64();
        // High bits pick the column, low 53 bits the coin.
        let i = ((u128::from(x) * self.prob.len() as u128) >> 64) as usize;
        let coin = (x & ((1 << 53) - 1)) as f64 * (1.0 / (1u64 << 53) as f64);
        if coin < self.prob[i] {
            i
        } else {
            self.alias[i] as usize
        }
    }
}

/// How keys are chosen: the popularity of key ranks.
#[derive(Debug, Clone, PartialEq)]
pub enum Popularity {
    Uniform,
    /// P(rank k) ∝ 1/k^alpha, k = 1..=n.
    Zipf {
        alpha: f64,
    },
    /// KV-Cache (KV-Blaster): keys in buckets of `size`; the popularity of the bucket at
    /// position x (evenly spaced in [xmin, 1]) is PDF(x) = αx^(α−1); the buckets' order is
    /// shuffled; a key within a bucket is uniform.
    Buckets {
        size: u64,
        alpha: f64,
        xmin: f64,
    },
    /// Keys 0, 1, 2, ... in turn (each thread starts at its own offset).
    Sequential,
}

impl Popularity {
    /// KV-Cache's Table 2 setting: buckets of 25 keys, α = 0.01, 0.001 <= x <= 1.
    pub const KVCACHE: Popularity = Popularity::Buckets {
        size: 25,
        alpha: 0.01,
        xmin: 0.001,
    };

    /// Parse `uniform`, `zipf:ALPHA`, `buckets`, `buckets:SIZE,ALPHA,XMIN`, `sequential`.
    pub fn parse(spec: &str) -> Result<Popularity, DistError> {
        let (name, args) = spec.trim().split_once(':').unwrap_or((spec.trim(), ""));
        let nums: Vec<f64> = if args.is_empty() {
            Vec::new()
        } else {
            args.split(',')
                .map(|a| a.trim().parse::<f64>())
                .collect::<Result<_, _>>()
                .map_err(|source| DistError::PopularityNumber {
                    spec: spec.into(),
                    source,
                })?
        };
        match (name, nums.as_slice()) {
            ("uniform", []) => Ok(Popularity::Uniform),
            ("sequential", []) => Ok(Popularity::Sequential),
            ("zipf", [a]) if a.is_finite() && *a >= 0.0 => Ok(Popularity::Zipf { alpha: *a }),
            ("buckets", []) => Ok(Popularity::KVCACHE),
            ("buckets", [s, a, x])
                if *s >= 1.0 && s.fract() == 0.0 && *a > 0.0 && *x > 0.0 && *x < 1.0 =>
            {
                Ok(Popularity::Buckets {
                    size: *s as u64,
                    alpha: *a,
                    xmin: *x,
                })
            }
            _ => Err(DistError::Popularity { spec: spec.into() }),
        }
    }

    /// Relative weights of ranks (zipf) or buckets (buckets) for `n` keys, in rank order
    /// (before any shuffle); None for uniform and sequential.
    pub fn weights(&self, n: u64) -> Option<Vec<f64>> {
        match *self {
            Popularity::Zipf { alpha } => Some((1..=n).map(|k| (k as f64).powf(-alpha)).collect()),
            Popularity::Buckets { size, alpha, xmin } => {
                let buckets = n.div_ceil(size).max(1);
                let step = if buckets > 1 {
                    (1.0 - xmin) / (buckets - 1) as f64
                } else {
                    0.0
                };
                Some(
                    (0..buckets)
                        .map(|b| {
                            let x = xmin + step * b as f64;
                            alpha * x.powf(alpha - 1.0)
                        })
                        .collect(),
                )
            }
            Popularity::Uniform | Popularity::Sequential => None,
        }
    }
}

/// Draws key indices in [0, n) with a given popularity. Popular ranks are scattered over the
/// key space by a fixed bijection (zipf) or a seeded shuffle of buckets (buckets), so the
/// hottest keys are not neighbours (and not all on one server).
#[derive(Debug, Clone)]
pub struct KeyChooser {
    n: u64,
    kind: Popularity,
    table: Option<std::sync::Arc<AliasTable>>,
    /// Bucket order for `Buckets`: position -> bucket number.
    bucket_of: Option<std::sync::Arc<Vec<u32>>>,
    mult: u64,
    next_seq: u64,
    /// Draw only keys `k` with `k % parts == part` (a participant's share of the key space,
    /// see [`Self::set_partition`]); `parts == 1` draws every key.
    part: u64,
    parts: u64,
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl KeyChooser {
    pub fn new(n: u64, kind: &Popularity, seed: u64) -> Result<KeyChooser, DistError> {
        if n == 0 {
            return Err(DistError::NoKeys);
        }
        let (table, bucket_of) = match kind.weights(n) {
            None => (None, None),
            Some(w) => {
                let t = AliasTable::new(&w)?;
                let order = if matches!(kind, Popularity::Buckets { .. }) {
                    // A seeded Fisher-Yates shuffle, as KV-Cache shuffles its ranks.
                    let mut order: Vec<u32> = (0..w.len() as u32).collect();
                    let mut s = seed ^ 0xB0C4_E75E_ED00_0001;
                    for i in (1..order.len()).rev() {
                        s = mix64(s);
                        let j = ((u128::from(s) * (i as u128 + 1)) >> 64) as usize;
                        order.swap(i, j);
                    }
                    Some(std::sync::Arc::new(order))
                } else {
                    None
                };
                (Some(std::sync::Arc::new(t)), order)
            }
        };
        // A multiplier coprime to n makes rank -> (rank * mult) mod n a bijection.
        let mut mult = (0x9E37_79B9_7F4A_7C15u64 % n).max(1);
        while gcd(mult, n) != 1 {
            mult += 1;
        }
        Ok(KeyChooser {
            n,
            kind: kind.clone(),
            table,
            bucket_of,
            mult,
            next_seq: 0,
            part: 0,
            parts: 1,
        })
    }

    /// Draw only the keys `k` with `k % parts == part` from now on: the popularity
    /// distribution conditioned on that share of the key space (by rejection, which keeps
    /// the relative popularity of the keys in the share exactly; uniform popularity draws a
    /// key of the share directly). The share must hold at least one key.
    pub fn set_partition(&mut self, part: u64, parts: u64) -> Result<(), DistError> {
        if parts == 0 || part >= parts || part >= self.n {
            return Err(DistError::EmptyShare {
                part,
                parts,
                keys: self.n,
            });
        }
        self.part = part;
        self.parts = parts;
        Ok(())
    }

    /// The probability mass of each share `k % parts == i` of the key space under this
    /// popularity (what fraction of the workload's requests fall on share `i`).
    pub fn partition_mass(&self, parts: u64) -> Vec<f64> {
        let parts = parts.max(1);
        let mut mass = vec![0.0f64; parts as usize];
        let n = self.n;
        match (&self.kind, self.kind.weights(n)) {
            (Popularity::Zipf { .. }, Some(w)) => {
                for (r, wr) in w.iter().enumerate() {
                    mass[(self.rank_to_key(r as u64) % parts) as usize] += wr;
                }
            }
            (Popularity::Buckets { size, .. }, Some(w)) => {
                for (pos, wp) in w.iter().enumerate() {
                    let bucket = match &self.bucket_of {
                        Some(order) => u64::from(order.get(pos).copied().unwrap_or(0)),
                        None => pos as u64,
                    };
                    // As in `next`: a key uniform within the bucket, clamped to the space.
                    let first = bucket * size;
                    let width = (*size).min(n.saturating_sub(first)).max(1);
                    for j in 0..width {
                        let k = (first + j).min(n - 1);
                        mass[(k % parts) as usize] += wp / width as f64;
                    }
                }
            }
            _ => {
                for (i, m) in mass.iter_mut().enumerate() {
                    *m = Self::share_len(n, i as u64, parts) as f64;
                }
            }
        }
        let total: f64 = mass.iter().sum();
        if total > 0.0 {
            for m in &mut mass {
                *m /= total;
            }
        }
        mass
    }

    /// How many keys `k < n` have `k % parts == part`.
    fn share_len(n: u64, part: u64, parts: u64) -> u64 {
        if part >= n {
            0
        } else {
            (n - part).div_ceil(parts)
        }
    }

    /// Start a sequential chooser at `offset` (so threads do not walk in step).
    pub fn set_sequence_start(&mut self, offset: u64) {
        self.next_seq = offset % self.n;
    }

    pub fn key_count(&self) -> u64 {
        self.n
    }

    /// The key index of a zipf rank (0-based).
    pub fn rank_to_key(&self, rank: u64) -> u64 {
        ((u128::from(rank) * u128::from(self.mult)) % u128::from(self.n)) as u64
    }

    /// Draw a rank (zipf), a bucket position (buckets) or a key (others); see [`Self::next`].
    pub fn next_rank(&mut self, rng: &mut impl Rng) -> u64 {
        match self.kind {
            Popularity::Uniform => below(rng, self.n),
            Popularity::Sequential => {
                let k = self.next_seq;
                self.next_seq = if k + 1 >= self.n { 0 } else { k + 1 };
                k
            }
            Popularity::Zipf { .. } | Popularity::Buckets { .. } => match &self.table {
                Some(t) => t.sample(rng) as u64,
                None => below(rng, self.n),
            },
        }
    }

    /// Draw a key index in [0, n) (of this chooser's share, if it has one).
    pub fn next(&mut self, rng: &mut impl Rng) -> u64 {
        if self.parts <= 1 {
            return self.next_any(rng);
        }
        if self.kind == Popularity::Uniform {
            let j = below(rng, Self::share_len(self.n, self.part, self.parts));
            return self.part + j * self.parts;
        }
        // Rejection: the expected number of draws is 1 / (the share's mass), about `parts`.
        // The bound is never reached in practice; past it, the drawn key's neighbour in the
        // share stands in (still a key of the share).
        for _ in 0..(1u64 << 20) {
            let k = self.next_any(rng);
            if k % self.parts == self.part {
                return k;
            }
        }
        let k = self.next_any(rng);
        let k = k - k % self.parts + self.part;
        if k < self.n {
            k
        } else {
            self.part
        }
    }

    fn next_any(&mut self, rng: &mut impl Rng) -> u64 {
        let r = self.next_rank(rng);
        match self.kind {
            Popularity::Zipf { .. } => self.rank_to_key(r),
            Popularity::Buckets { size, .. } => {
                let bucket = match &self.bucket_of {
                    Some(order) => u64::from(order.get(r as usize).copied().unwrap_or(0)),
                    None => r,
                };
                let first = bucket * size;
                let width = size.min(self.n.saturating_sub(first)).max(1);
                (first + below(rng, width)).min(self.n - 1)
            }
            _ => r,
        }
    }
}

/// How open-loop requests are spaced in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Arrival {
    /// Exponential gaps (a Poisson process).
    Poisson,
    /// Equal gaps.
    Fixed,
    /// ETC's generalized Pareto gaps (shape 0.154971, location 0), scaled to the rate.
    Etc,
}

impl Arrival {
    pub fn parse(s: &str) -> Result<Arrival, BadChoice> {
        match s {
            "poisson" | "exp" => Ok(Arrival::Poisson),
            "fixed" | "uniform" => Ok(Arrival::Fixed),
            "etc" => Ok(Arrival::Etc),
            _ => Err(BadChoice {
                setting: "arrival",
                given: s.to_string(),
                choices: "poisson | fixed | etc",
            }),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Arrival::Poisson => "poisson",
            Arrival::Fixed => "fixed",
            Arrival::Etc => "etc",
        }
    }

    /// The gap distribution, in nanoseconds, for `rate` requests per second.
    pub fn gaps(self, rate: f64) -> Dist {
        let mean = 1e9 / rate;
        match self {
            Arrival::Poisson => Dist::Exponential { mean },
            Arrival::Fixed => Dist::Fixed(mean),
            // A GPD with location 0 has mean σ/(1−ξ): choose σ so that it is 1/rate.
            Arrival::Etc => Dist::GPareto {
                loc: 0.0,
                scale: mean * (1.0 - ETC_IA_SHAPE),
                shape: ETC_IA_SHAPE,
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::rngs::Xoshiro256PlusPlus;
    use rand::SeedableRng;

    fn rng(seed: u64) -> Xoshiro256PlusPlus {
        Xoshiro256PlusPlus::seed_from_u64(seed)
    }

    /// Kolmogorov–Smirnov statistic of `samples` against `cdf`.
    fn ks(mut samples: Vec<f64>, cdf: impl Fn(f64) -> f64) -> f64 {
        samples.sort_by(|a, b| a.total_cmp(b));
        let n = samples.len() as f64;
        let mut d: f64 = 0.0;
        let mut i = 0;
        while i < samples.len() {
            // Treat ties as one step so that discrete distributions are handled correctly.
            let x = samples[i];
            let mut j = i;
            while j < samples.len() && samples[j] == x {
                j += 1;
            }
            // Just below x the empirical CDF is i/n; at x it is j/n.
            d = d.max((cdf(x - 1e-9) - i as f64 / n).abs());
            d = d.max((j as f64 / n - cdf(x)).abs());
            i = j;
        }
        d
    }

    /// The KS critical value at significance 0.001 for n samples.
    fn critical(n: usize) -> f64 {
        1.95 / (n as f64).sqrt()
    }

    fn check(d: &Dist, seed: u64) {
        let n = 20_000;
        let mut r = rng(seed);
        let samples: Vec<f64> = (0..n).map(|_| d.sample(&mut r)).collect();
        let stat = ks(samples, |x| d.cdf(x));
        assert!(stat < critical(n), "{d:?}: KS {stat} >= {}", critical(n));
    }

    #[test]
    fn continuous_distributions_pass_ks() {
        let rows = [
            Dist::Uniform { lo: 1.0, hi: 100.0 },
            Dist::Normal {
                mean: 1024.0,
                sd: 266.0,
            },
            Dist::LogNormal {
                mean: 25600.0,
                sd: 12700.0,
            },
            Dist::Exponential { mean: 20_000.0 },
            ETC_KEY,
            ETC_VALUE_TAIL,
            Arrival::Etc.gaps(50_000.0),
            Dist::Gev {
                loc: 0.0,
                scale: 1.0,
                shape: -0.2,
            },
        ];
        for (i, d) in rows.iter().enumerate() {
            check(d, 1000 + i as u64);
        }
    }

    /// Two-sample Kolmogorov-Smirnov statistic.
    fn ks2(mut a: Vec<u64>, mut b: Vec<u64>) -> f64 {
        a.sort_unstable();
        b.sort_unstable();
        let (mut i, mut j, mut d) = (0, 0, 0.0f64);
        while i < a.len() && j < b.len() {
            let x = a[i].min(b[j]);
            while i < a.len() && a[i] == x {
                i += 1;
            }
            while j < b.len() && b[j] == x {
                j += 1;
            }
            d = d.max((i as f64 / a.len() as f64 - j as f64 / b.len() as f64).abs());
        }
        d
    }

    /// A participant's share of the key space: every key drawn is in the share; the keys it
    /// draws follow the full distribution conditioned on the share (two-sample KS against
    /// the full chooser's draws that fell in the share); and the share's mass is the fraction
    /// of the full chooser's draws that fall in it.
    #[test]
    fn key_shares_draw_the_conditional_distribution() {
        let n = 997;
        let parts = 3u64;
        for (pi, pop) in [
            Popularity::Uniform,
            Popularity::Zipf { alpha: 0.99 },
            Popularity::Buckets {
                size: 10,
                alpha: 0.01,
                xmin: 0.001,
            },
        ]
        .iter()
        .enumerate()
        {
            let full = KeyChooser::new(n, pop, 4).unwrap_or_else(|e| panic!("{e}"));
            let mass = full.partition_mass(parts);
            assert!(
                (mass.iter().sum::<f64>() - 1.0).abs() < 1e-9,
                "{pop:?}: {mass:?}"
            );
            let m = 300_000;
            let mut r = rng(50 + pi as u64);
            let mut f = full.clone();
            let all: Vec<u64> = (0..m).map(|_| f.next(&mut r)).collect();
            for i in 0..parts {
                let in_share: Vec<u64> = all.iter().copied().filter(|k| k % parts == i).collect();
                let frac = in_share.len() as f64 / m as f64;
                let sd = (mass[i as usize] * (1.0 - mass[i as usize]) / m as f64).sqrt();
                assert!(
                    (frac - mass[i as usize]).abs() < 5.0 * sd,
                    "{pop:?} share {i}: drawn {frac}, mass {}",
                    mass[i as usize]
                );
                let mut c = full.clone();
                c.set_partition(i, parts).unwrap_or_else(|e| panic!("{e}"));
                let mine: Vec<u64> = (0..50_000).map(|_| c.next(&mut r)).collect();
                assert!(mine.iter().all(|k| k % parts == i && *k < n), "{pop:?}");
                let (n1, n2) = (mine.len() as f64, in_share.len() as f64);
                let crit = 1.95 * ((n1 + n2) / (n1 * n2)).sqrt();
                let d = ks2(mine, in_share);
                assert!(d < crit, "{pop:?} share {i}: KS {d} >= {crit}");
            }
        }
        // Zipf's hottest keys make the shares' masses unequal; uniform's are the key counts.
        let z = KeyChooser::new(1000, &Popularity::Zipf { alpha: 1.2 }, 1)
            .unwrap_or_else(|e| panic!("{e}"));
        let zm = z.partition_mass(2);
        assert!((zm[0] - zm[1]).abs() > 0.05, "{zm:?}");
        let u = KeyChooser::new(10, &Popularity::Uniform, 1).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(u.partition_mass(3), [0.4, 0.3, 0.3]);
        let mut e = u.clone();
        assert!(e.set_partition(3, 3).is_err());
        let mut tiny =
            KeyChooser::new(2, &Popularity::Uniform, 1).unwrap_or_else(|e| panic!("{e}"));
        assert!(tiny.set_partition(2, 3).is_err(), "a share with no keys");
    }

    #[test]
    fn ks_detects_a_wrong_distribution() {
        // The test itself must be able to fail: samples of one GEV against another's CDF.
        let mut r = rng(7);
        let samples: Vec<f64> = (0..20_000).map(|_| ETC_KEY.sample(&mut r)).collect();
        let other = Dist::Gev {
            loc: 31.5,
            scale: 8.20449,
            shape: 0.078688,
        };
        assert!(ks(samples, |x| other.cdf(x)) > critical(20_000));
    }

    #[test]
    fn quantile_inverts_cdf() {
        for d in [ETC_KEY, ETC_VALUE_TAIL, Dist::Normal { mean: 5.0, sd: 2.0 }] {
            for u in [0.01, 0.1, 0.5, 0.9, 0.99] {
                let x = d.quantile(u);
                let f = d.cdf(x);
                // GEV and GPD quantiles as published map u to the upper tail for GPD.
                let ok = (f - u).abs() < 1e-6 || (f - (1.0 - u)).abs() < 1e-6;
                assert!(ok, "{d:?} u={u} x={x} F(x)={f}");
            }
        }
    }

    #[test]
    fn unit_of_key_is_fixed_and_uniform() {
        assert_eq!(unit_of_key(7), unit_of_key(7));
        assert_ne!(unit_of_key(7), unit_of_key(8));
        let n = 100_000;
        let mut tenths = [0u32; 10];
        for k in 0..n {
            let u = unit_of_key(k);
            assert!(u > 0.0 && u <= 1.0, "{u}");
            tenths[((u * 10.0) as usize).min(9)] += 1;
        }
        // Each tenth holds 10% of the keys, within 0.5% of all of them.
        for t in tenths {
            assert!(t.abs_diff(10_000) < 500, "{tenths:?}");
        }
    }

    #[test]
    fn etc_value_sizes_match_the_table_and_tail() {
        let n = 200_000;
        let mut r = rng(42);
        let samples: Vec<f64> = (0..n).map(|_| Dist::EtcValue.sample(&mut r)).collect();
        for (size, p) in ETC_SMALL_VALUES.iter().enumerate() {
            let got = samples.iter().filter(|&&x| x == size as f64).count() as f64 / n as f64;
            // 4 standard deviations of a binomial proportion.
            let tol = 4.0 * (p * (1.0 - p) / n as f64).sqrt() + 1e-5;
            assert!((got - p).abs() < tol, "size {size}: {got} vs {p}");
        }
        let tail: Vec<f64> = samples.into_iter().filter(|&x| x >= 15.0).collect();
        let m = tail.len();
        assert!(ks(tail, |x| ETC_VALUE_TAIL.cdf(x)) < critical(m));
        // And the whole mixture against its CDF (sizes rounded as a SizeDist does).
        let sd = SizeDist::new(Dist::EtcValue, 0, 1 << 20);
        let mut r = rng(43);
        let sizes: Vec<f64> = (0..20_000).map(|_| sd.sample(&mut r) as f64).collect();
        let stat = ks(sizes, |x| {
            if x < 15.0 {
                Dist::EtcValue.cdf(x)
            } else {
                Dist::EtcValue.cdf(x + 0.5)
            }
        });
        assert!(stat < critical(20_000), "mixture KS {stat}");
    }

    #[test]
    fn etc_value_mean_is_plausible() {
        // ETC values average a few hundred bytes.
        let m = Dist::EtcValue.mean().unwrap_or(0.0);
        assert!((150.0..400.0).contains(&m), "{m}");
    }

    fn discrete_ks(chooser: &mut KeyChooser, weights: &[f64], seed: u64) {
        let n = 50_000;
        let mut r = rng(seed);
        let samples: Vec<f64> = (0..n).map(|_| chooser.next_rank(&mut r) as f64).collect();
        let total: f64 = weights.iter().sum();
        let mut cum = Vec::with_capacity(weights.len());
        let mut acc = 0.0;
        for w in weights {
            acc += w / total;
            cum.push(acc);
        }
        let stat = ks(samples, |x| {
            if x < 0.0 {
                0.0
            } else {
                cum[(x.floor() as usize).min(cum.len() - 1)]
            }
        });
        assert!(stat < critical(n), "KS {stat}");
    }

    #[test]
    fn zipf_ranks_pass_ks() {
        for (alpha, seed) in [(0.99, 1u64), (0.5, 2), (1.2, 3)] {
            let pop = Popularity::Zipf { alpha };
            let mut c = KeyChooser::new(10_000, &pop, 9).unwrap_or_else(|e| panic!("{e}"));
            let w = pop.weights(10_000).unwrap_or_default();
            discrete_ks(&mut c, &w, seed);
        }
    }

    #[test]
    fn bucket_power_law_passes_ks() {
        let pop = Popularity::KVCACHE;
        let mut c = KeyChooser::new(250_000, &pop, 5).unwrap_or_else(|e| panic!("{e}"));
        let w = pop.weights(250_000).unwrap_or_default();
        assert_eq!(w.len(), 10_000);
        // The most popular bucket (x = 0.001) is 1000^0.99 times the least popular.
        let ratio = w[0] / w[w.len() - 1];
        assert!((ratio - 1000f64.powf(0.99)).abs() / ratio < 1e-9);
        discrete_ks(&mut c, &w, 11);
        // Keys stay in range and within their bucket.
        let mut r = rng(12);
        for _ in 0..10_000 {
            assert!(c.next(&mut r) < 250_000);
        }
    }

    #[test]
    fn uniform_keys_pass_ks() {
        let mut c =
            KeyChooser::new(1000, &Popularity::Uniform, 1).unwrap_or_else(|e| panic!("{e}"));
        discrete_ks(&mut c, &[1.0; 1000], 21);
    }

    #[test]
    fn zipf_rank_to_key_is_a_bijection() {
        for n in [1u64, 2, 10, 97, 1000, 1024] {
            let c = KeyChooser::new(n, &Popularity::Zipf { alpha: 1.0 }, 0)
                .unwrap_or_else(|e| panic!("{e}"));
            let mut seen = vec![false; n as usize];
            for r in 0..n {
                let k = c.rank_to_key(r) as usize;
                assert!(!seen[k], "n={n} rank {r}");
                seen[k] = true;
            }
        }
    }

    #[test]
    fn sequential_wraps() {
        let mut c =
            KeyChooser::new(3, &Popularity::Sequential, 0).unwrap_or_else(|e| panic!("{e}"));
        c.set_sequence_start(2);
        let mut r = rng(0);
        let got: Vec<u64> = (0..5).map(|_| c.next(&mut r)).collect();
        assert_eq!(got, [2, 0, 1, 2, 0]);
    }

    #[test]
    fn arrival_gaps_have_the_requested_mean() {
        for a in [Arrival::Poisson, Arrival::Fixed, Arrival::Etc] {
            let d = a.gaps(50_000.0);
            let mean = d.mean().unwrap_or(0.0);
            assert!((mean - 20_000.0).abs() < 1e-6, "{a:?}: {mean}");
            let mut r = rng(3);
            let n = 200_000;
            let s: f64 = (0..n).map(|_| d.sample(&mut r)).sum::<f64>() / n as f64;
            assert!(
                (s - 20_000.0).abs() / 20_000.0 < 0.02,
                "{a:?}: sample mean {s}"
            );
        }
    }

    #[test]
    fn parse_specs() {
        assert_eq!(Dist::parse("128").ok(), Some(Dist::Fixed(128.0)));
        assert_eq!(Dist::parse("etc-key").ok(), Some(ETC_KEY));
        assert_eq!(
            Dist::parse("gpareto:15,214.476,0.348238").ok(),
            Some(ETC_VALUE_TAIL)
        );
        assert!(Dist::parse("gev:1,2").is_err());
        assert!(Dist::parse("uniform:5,1").is_err());
        assert!(Dist::parse("nope").is_err());
        assert_eq!(
            Popularity::parse("zipf:0.99").ok(),
            Some(Popularity::Zipf { alpha: 0.99 })
        );
        assert_eq!(Popularity::parse("buckets").ok(), Some(Popularity::KVCACHE));
        assert!(Popularity::parse("zipf").is_err());
    }

    #[test]
    fn size_dist_clamps_and_rounds() {
        let s = SizeDist::new(ETC_KEY, 1, 250);
        for u in [1e-300, 1e-9, 0.5, 1.0] {
            let k = s.quantile(u);
            assert!((1..=250).contains(&k));
        }
        assert_eq!(SizeDist::fixed(19).quantile(0.3), 19);
    }

    fn hist(text: &str) -> Result<SizeHistogram, SizeHistogramError> {
        SizeHistogram::parse_text(text, "h.txt", 0, u64::MAX)
    }

    /// A histogram's error as the user reads it (None: no error).
    fn hist_err(text: &str) -> Option<String> {
        hist(text).err().map(|e| e.to_string())
    }

    #[test]
    fn histogram_text_parses() {
        let h =
            hist("# size  count\n\n100 5\r\n  300\t3   # tail\n100,1\n200 0\n1000 2e0\n0 0.5\n")
                .unwrap_or_else(|e| panic!("{e}"));
        // Repeated sizes add up; zero weights are never drawn.
        assert_eq!(h.sizes(), [0, 100, 300, 1000]);
        let p = h.probabilities();
        let want = [0.5 / 11.5, 6.0 / 11.5, 3.0 / 11.5, 2.0 / 11.5];
        for (a, b) in p.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{p:?}");
        }
        assert_eq!((h.min_size(), h.max_size()), (0, 1000));
        assert!((h.mean() - (600.0 + 900.0 + 2000.0) / 11.5).abs() < 1e-9);
        // Quantile: monotone, every drawn size reachable, the extremes of (0, 1].
        assert_eq!(h.quantile(f64::MIN_POSITIVE), 0.0);
        assert_eq!(h.quantile(1.0), 1000.0);
        assert_eq!(h.quantile(0.5), 100.0);
        assert_eq!(h.quantile(p[0] + p[1] + 1e-9), 300.0);
        let mut last = 0.0;
        for i in 1..=1000 {
            let q = h.quantile(i as f64 / 1000.0);
            assert!(q >= last);
            last = q;
        }
        assert_eq!(h.cdf(99.9), p[0]);
        assert_eq!(h.cdf(1000.0), 1.0);
        assert_eq!(h.cdf(-1.0), 0.0);
        // The inline form gives the same histogram back, and so does the spec.
        let inline = h.to_inline();
        let back =
            SizeHistogram::parse_inline(&inline, 0, u64::MAX).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(back, h);
        assert_eq!(
            Dist::parse(&format!("hist-inline:{inline}")).ok(),
            Some(Dist::Hist(std::sync::Arc::new(h)))
        );
        let tiny =
            SizeHistogram::parse_inline("5:1e-300,7:3", 0, 9).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            SizeHistogram::parse_inline(&tiny.to_inline(), 0, 9).ok(),
            Some(tiny)
        );
    }

    #[test]
    fn histogram_errors_name_the_file_and_line() {
        let cases: [(&str, &str); 12] = [
            ("", "h.txt: no SIZE WEIGHT entries"),
            ("# only a comment\n\n", "h.txt: no SIZE WEIGHT entries"),
            ("1 0\n2 0.0\n", "h.txt: every weight is zero"),
            ("1 1\n2 -1\n", "h.txt:2: weight -1 is negative"),
            ("1 1\n\n3 NaN\n", "h.txt:3: weight \"NaN\" is not finite"),
            ("1 inf\n", "h.txt:1: weight \"inf\" is not finite"),
            (
                "1 1\n12.5 1\n",
                "h.txt:2: size \"12.5\" is not a whole number >= 0",
            ),
            ("-3 1\n", "h.txt:1: size \"-3\" is not a whole number >= 0"),
            ("100\n", "h.txt:1: expected SIZE WEIGHT, got \"100\""),
            ("1 2 3\n", "h.txt:1: unexpected third field \"3\""),
            ("1 lots\n", "h.txt:1: weight \"lots\" is not a number"),
            (
                "1 1e308\n2 1e308\n",
                "h.txt: the weights' sum is not finite",
            ),
        ];
        for (text, want) in cases {
            assert_eq!(hist_err(text), Some(want.to_string()), "{text:?}");
        }
        // Key sizes are 1..=250.
        let keys = |t: &str| {
            SizeHistogram::parse_text(t, "k.txt", 1, 250)
                .map(|_| ())
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            keys("10 1\n251 1\n"),
            Err("k.txt:2: size 251 is outside 1..=250".into())
        );
        assert_eq!(
            keys("0 1\n"),
            Err("k.txt:1: size 0 is outside 1..=250".into())
        );
        assert_eq!(keys("250 1\n1 1\n"), Ok(()));
        // Inline errors name the entry.
        let e = SizeHistogram::parse_inline("1:1,2", 0, 9)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert_eq!(
            e,
            Err("hist-inline entry 2: expected SIZE:WEIGHT, got \"2\"".into())
        );
        assert!(SizeHistogram::parse_inline("", 0, 9).is_err());
        assert!(SizeHistogram::parse_inline("10:1", 0, 9).is_err());
        // Too many lines.
        let long = "1 1\n".repeat(MAX_HIST_LINES + 1);
        assert_eq!(
            hist_err(&long),
            Some(format!("h.txt: more than {MAX_HIST_LINES} lines"))
        );
        assert!(hist(&"1 1\n".repeat(1000)).is_ok());
        // Files: missing, too large (sparse, never read), not text; and a good one.
        let dir = std::env::temp_dir().join(format!("kvblast-hist-{}", std::process::id()));
        let _ = std::fs::create_dir_all(&dir);
        let missing = Dist::parse(&format!("hist:{}", dir.join("nope").display()));
        assert!(
            matches!(&missing, Err(e @ DistError::Histogram(SizeHistogramError::Io { .. }))
                if e.to_string().contains("nope")),
            "{missing:?}"
        );
        let big = dir.join("big.txt");
        let f = std::fs::File::create(&big).unwrap_or_else(|e| panic!("{e}"));
        f.set_len(MAX_HIST_BYTES + 1)
            .unwrap_or_else(|e| panic!("{e}"));
        let e = SizeHistogram::read_file(&big, 0, 9)
            .map(|_| ())
            .map_err(|e| e.to_string());
        assert!(
            matches!(&e, Err(m) if m.contains("big.txt") && m.contains("bytes")),
            "{e:?}"
        );
        let bin = dir.join("bin.txt");
        let _ = std::fs::write(&bin, [0xffu8, 0xfe, b'\n']);
        assert!(matches!(
            SizeHistogram::read_file(&bin, 0, 9),
            Err(SizeHistogramError::NotUtf8 { .. })
        ));
        let good = dir.join("good.txt");
        let _ = std::fs::write(&good, "1 1\n2 x\n");
        let spec = format!("hist:{}", good.display());
        assert_eq!(
            Dist::parse(&spec).map(|_| ()).map_err(|e| e.to_string()),
            Err(format!(
                "{}:2: weight \"x\" is not a number",
                good.display()
            ))
        );
        let _ = std::fs::write(&good, "7 1\n9 3\n");
        let d = Dist::parse_sizes(&spec, 1, 250).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(d.mean(), Some(8.5));
        assert!(Dist::parse("hist:").is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }

    /// Pearson's chi-square statistic of the counts of `sizes` drawn against probabilities.
    fn chi_square(d: &Dist, sizes: &[u64], probs: &[f64], n: usize, seed: u64) -> f64 {
        let mut r = rng(seed);
        let mut counts = vec![0u64; sizes.len()];
        for _ in 0..n {
            let x = d.sample(&mut r) as u64;
            let i = sizes
                .iter()
                .position(|s| *s == x)
                .unwrap_or_else(|| panic!("drew {x}, not in the histogram"));
            counts[i] += 1;
        }
        counts
            .iter()
            .zip(probs)
            .map(|(c, p)| {
                let e = p * n as f64;
                (*c as f64 - e).powi(2) / e
            })
            .sum()
    }

    #[test]
    fn histogram_samples_follow_the_weights() {
        let h = hist("100 5\n200 0\n300 3\n1000 2\n1 0.25\n").unwrap_or_else(|e| panic!("{e}"));
        let probs = h.probabilities();
        let sizes = h.sizes().to_vec();
        let d = Dist::Hist(std::sync::Arc::new(h));
        let n = 100_000;
        // 4 outcomes, 3 degrees of freedom: 16.27 is the 0.001 critical value. Size 200
        // (weight 0) is never drawn (chi_square panics on a size outside the list).
        let stat = chi_square(&d, &sizes, &probs, n, 77);
        assert!(stat < 16.27, "chi-square {stat}");
        // The test can fail: the same draws against other weights.
        let wrong = [0.25 / 10.25, 4.0 / 10.25, 4.0 / 10.25, 2.0 / 10.25];
        assert!(chi_square(&d, &sizes, &wrong, n, 77) > 16.27);
        // And KS against the step CDF, through a SizeDist as the engine draws.
        check(&d, 78);
        let sd = SizeDist::new(d.clone(), 1, 1000);
        let mut r = rng(79);
        assert!((0..1000).all(|_| sizes.contains(&(sd.sample(&mut r) as u64))));
    }

    #[test]
    fn alias_table_rejects_bad_weights() {
        assert!(AliasTable::new(&[]).is_err());
        assert!(AliasTable::new(&[0.0, 0.0]).is_err());
        assert!(AliasTable::new(&[1.0, f64::NAN]).is_err());
        assert!(AliasTable::new(&[1.0, -1.0]).is_err());
    }
}
