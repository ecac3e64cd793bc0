//! Plots, drawn by `plotters` twice from one description: as SVG (text; the viewer's
//! sans-serif font) and as PNG (rasterized in pure Rust with DejaVu Sans, which the `dejavu`
//! crate embeds, and encoded by the `png` crate: no system fonts or libraries).
//!
//! Latency axes are logarithmic and labelled in µs, ms and s; throughput axes in k and M.
//!
//! - [`latency`] / [`percentiles`]: the HdrHistogram percentile-distribution plot, latency
//!   against percentile on a 1/(1−q) axis ("nines"), one line per request kind or per run,
//!   with the SLO as a dashed line;
//! - [`cdf`]: the latency CDF (fraction of requests at or under a latency, log latency axis);
//! - [`timeline`]: completions per second over the run;
//! - [`latency_timeline`]: p50 and p99 latency over the run;
//! - [`capacity`]: a capacity search, the objective's metric against the offered rate for
//!   every step in rate order, passes and failures marked, with the SLO and the capacity;
//! - [`capacity_curve`]: mean/p50/p99/p99.9/max latency against achieved throughput, from a
//!   capacity search's steps joined in offered-rate order;
//! - [`compare`]: several servers' p99 and mean latency against achieved throughput on one
//!   chart, a thin line per search and, bold, each server's median over its searches per
//!   offered rate ([`median_curve`]), one legend entry per server (`kvblast compare`,
//!   `kvblast plot`).

use std::ops::Range;
use std::sync::OnceLock;

use hdrhistogram::Histogram;
use plotters::coord::ranged1d::{DefaultFormatting, KeyPointHint, Ranged};
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::capacity::{Capacity, CapacityReport, Latencies};
use crate::stats::Report;

/// A plot that could not be drawn or written, or saved results that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("the embedded DejaVu Sans font did not load")]
    Font,
    /// plotters' error (its backend's, SVG or bitmap, inside).
    #[error("drawing the plot: {0}")]
    Draw(#[source] Box<dyn std::error::Error + Send + Sync>),
    #[error("png: {0}")]
    Png(#[source] png::EncodingError),
    #[error("{path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}: give a .png or .svg file name")]
    Extension { path: String },
    /// JSON, but not a capacity report of this kvblast.
    #[error(
        "not a capacity report ({0}; reports from before kvblast 0.1's plots lack their steps' \
         latencies)"
    )]
    NotCapacityReport(#[source] serde_json::Error),
    #[error("not JSON: {0}")]
    NotJson(#[source] serde_json::Error),
    #[error("not an HdrHistogram interval log (entry {entry}: {reason:?})")]
    LogEntry {
        entry: usize,
        reason: hdrhistogram::serialization::interval_log::LogIteratorError,
    },
    #[error("interval {entry}: bad base64: {source}")]
    LogBase64 {
        entry: usize,
        source: base64::DecodeError,
    },
    #[error("interval {entry}: bad histogram: {source:?}")]
    LogHistogram {
        entry: usize,
        source: hdrhistogram::serialization::DeserializeError,
    },
    #[error("interval {entry}: {source:?}")]
    LogAdd {
        entry: usize,
        source: hdrhistogram::AdditionError,
    },
    #[error("no histograms in it (an HdrHistogram interval log was expected)")]
    EmptyLog,
}
use crate::workload::Op;

/// Every plot's size in pixels.
pub const SIZE: (u32, u32) = (800, 480);
/// Text sizes are even: plotters places a glyph at half the size above its top edge,
/// truncated, so at odd sizes dots and commas come out a pixel above the baseline.
const FONT: &str = "sans-serif";
const COLOURS: [RGBColor; 8] = [
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0xff, 0x7f, 0x0e),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0x8c, 0x56, 0x4b),
    RGBColor(0xe3, 0x77, 0xc2),
    RGBColor(0x7f, 0x7f, 0x7f),
];
const GREY: RGBColor = RGBColor(0x55, 0x55, 0x55);
const PASS: RGBColor = RGBColor(0x2c, 0xa0, 0x2c);
const FAIL: RGBColor = RGBColor(0xd6, 0x27, 0x28);

fn colour(i: usize) -> RGBColor {
    COLOURS[i % COLOURS.len()]
}

/// Register DejaVu Sans (regular and bold) as the "sans-serif" family plotters draws text
/// with, once per process.
fn fonts() -> Result<(), PlotError> {
    static LOADED: OnceLock<bool> = OnceLock::new();
    let loaded = LOADED.get_or_init(|| {
        [
            (FontStyle::Normal, dejavu::sans::regular()),
            (FontStyle::Bold, dejavu::sans::bold()),
        ]
        .into_iter()
        .all(|(style, bytes)| plotters::style::register_font(FONT, style, bytes).is_ok())
    });
    if *loaded {
        Ok(())
    } else {
        Err(PlotError::Font)
    }
}

/// A number with at most 3 decimals and no trailing zeros: 0.2, 1.5, 20000.
fn num(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A latency given in µs, in the unit that reads best: "250 µs", "1.5 ms", "2 s".
pub fn latency_label(us: f64) -> String {
    let a = us.abs();
    if a >= 1e6 {
        format!("{} s", num(us / 1e6))
    } else if a >= 1e3 {
        format!("{} ms", num(us / 1e3))
    } else {
        format!("{} µs", num(us))
    }
}

/// A count to 3 significant digits: "800", "20k", "194k", "1.5M".
pub fn count_label(v: f64) -> String {
    let v = if v != 0.0 && v.is_finite() {
        let p = 10f64.powf(v.abs().log10().floor() - 2.0);
        (v / p).round() * p
    } else {
        v
    };
    let a = v.abs();
    if a >= 1e6 {
        format!("{}M", num(v / 1e6))
    } else if a >= 1e3 {
        format!("{}k", num(v / 1e3))
    } else {
        num(v)
    }
}

/// A percentile on the nines axis: t nines is the quantile 1 − 10^−t ("99.9%" at t = 3).
fn nines_label(t: f64) -> String {
    let pct = 100.0 * (1.0 - 10f64.powf(-t));
    let decimals = (t.ceil() as i64 - 2).clamp(0, 6) as usize;
    format!("{pct:.decimals$}%")
}

/// 1, 2 or 5 times a power of ten, at least `x` (1 for nothing sensible).
fn nice_step(x: f64) -> f64 {
    if !(x > 0.0 && x.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * p)
        .find(|s| *s >= x * (1.0 - 1e-12))
        .unwrap_or(10.0 * p)
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scale {
    /// Values as they are, from 0.
    Linear,
    /// log10 of the value; bounds on powers of ten.
    Log,
    /// The value is already a count of nines (see [`nines_label`]).
    Nines,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Unit {
    Plain,
    Count,
    Micros,
    Seconds,
    Nines,
}

/// One axis: its scale, the unit its ticks are labelled in, and its bounds (values).
#[derive(Debug, Clone)]
struct Axis {
    scale: Scale,
    unit: Unit,
    lo: f64,
    hi: f64,
    step: f64,
    desc: String,
}

impl Axis {
    /// From 0 to a multiple of a 1-2-5 step at least `max`, 4 to 8 steps.
    fn linear(max: f64, unit: Unit, desc: &str) -> Axis {
        let max = if max > 0.0 && max.is_finite() {
            max
        } else {
            1.0
        };
        let step = nice_step(max / 8.0);
        let step = if max / step > 8.0 {
            nice_step(step * 1.5)
        } else {
            step
        };
        Axis {
            scale: Scale::Linear,
            unit,
            lo: 0.0,
            hi: (max / step).ceil().max(1.0) * step,
            step,
            desc: desc.into(),
        }
    }

    /// Powers of ten around `min..max` (values at most 0 are left out).
    fn log(min: f64, max: f64, unit: Unit, desc: &str) -> Axis {
        let min = if min > 0.0 && min.is_finite() {
            min
        } else {
            1.0
        };
        let max = if max.is_finite() { max.max(min) } else { min };
        let lo = 10f64.powf(min.log10().floor());
        let hi = 10f64.powf(max.log10().ceil()).max(lo * 10.0);
        Axis {
            scale: Scale::Log,
            unit,
            lo,
            hi,
            step: 10.0,
            desc: desc.into(),
        }
    }

    /// Latencies in µs over `values` (and `also`, e.g. the SLO), on a log axis.
    fn latency(values: impl Iterator<Item = f64>, also: f64, desc: &str) -> Axis {
        let (lo, hi) = values
            .chain(std::iter::once(also))
            .filter(|v| *v > 0.0 && v.is_finite())
            .fold((f64::MAX, 0.0f64), |(lo, hi), v| (lo.min(v), hi.max(v)));
        if hi > 0.0 {
            Axis::log(lo, hi, Unit::Micros, desc)
        } else {
            Axis::log(1.0, 1000.0, Unit::Micros, desc)
        }
    }

    /// Percentiles from 0 to `nines` nines.
    fn nines(nines: u32) -> Axis {
        Axis {
            scale: Scale::Nines,
            unit: Unit::Nines,
            lo: 0.0,
            hi: nines.max(1) as f64,
            step: 1.0,
            desc: "percentile".into(),
        }
    }

    /// The chart coordinate of value `v` (NaN where it cannot be drawn).
    fn t(&self, v: f64) -> f64 {
        match self.scale {
            Scale::Linear | Scale::Nines => v,
            Scale::Log if v > 0.0 => v.log10(),
            Scale::Log => f64::NAN,
        }
    }

    /// The value at chart coordinate `t`.
    fn value(&self, t: f64) -> f64 {
        match self.scale {
            Scale::Log => 10f64.powf(t),
            _ => t,
        }
    }

    fn range(&self) -> Range<f64> {
        self.t(self.lo)..self.t(self.hi)
    }

    /// Labelled ticks (and grid lines), then light grid lines, in chart coordinates.
    fn ticks(&self) -> (Vec<f64>, Vec<f64>) {
        let (a, b) = (self.t(self.lo), self.t(self.hi));
        match self.scale {
            Scale::Log => {
                let bold: Vec<f64> = (a.round() as i64..=b.round() as i64)
                    .map(|e| e as f64)
                    .collect();
                let light = bold
                    .iter()
                    .take(bold.len().saturating_sub(1))
                    .flat_map(|e| (2..10).map(move |m| e + (m as f64).log10()))
                    .collect();
                (bold, light)
            }
            _ => {
                let n = ((self.hi - self.lo) / self.step).round() as i64;
                let bold = (0..=n).map(|i| self.lo + i as f64 * self.step).collect();
                let light = (0..n)
                    .map(|i| self.lo + (i as f64 + 0.5) * self.step)
                    .collect();
                (bold, light)
            }
        }
    }

    fn tick_label(&self, t: f64) -> String {
        let v = self.value(t);
        match self.unit {
            Unit::Plain => num(v),
            Unit::Count => count_label(v),
            Unit::Micros => latency_label(v),
            Unit::Seconds => format!("{} s", num(v)),
            Unit::Nines => nines_label(t),
        }
    }

    fn coord(&self) -> Coord {
        let (bold, light) = self.ticks();
        Coord {
            range: self.range(),
            bold,
            light,
        }
    }
}

/// An axis as plotters sees it: chart coordinates, linear, with the ticks [`Axis`] chose
/// (plotters' own log axis labels every decade in plain numbers, and it has no nines axis).
#[derive(Debug, Clone)]
struct Coord {
    range: Range<f64>,
    bold: Vec<f64>,
    light: Vec<f64>,
}

impl Ranged for Coord {
    type FormatOption = DefaultFormatting;
    type ValueType = f64;

    fn map(&self, v: &f64, (a, b): (i32, i32)) -> i32 {
        let span = self.range.end - self.range.start;
        if span.is_nan() || span <= 0.0 || !v.is_finite() {
            return a + (b - a) / 2;
        }
        // Far outside values are held a chart's width away, not turned into overflowing pixels.
        let f = ((v - self.range.start) / span).clamp(-1.0, 2.0);
        a + (f * f64::from(b - a)).round() as i32
    }

    fn key_points<H: KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Style {
    Solid,
    Dashed,
    Dots,
}

/// One series: values (not chart coordinates), how to draw them and an optional legend.
#[derive(Debug, Clone)]
struct Series {
    points: Vec<(f64, f64)>,
    colour: RGBColor,
    width: u32,
    alpha: f64,
    style: Style,
    label: Option<String>,
}

/// One chart: a title, two axes, series, and where the legend goes.
#[derive(Debug, Clone)]
pub struct Plot {
    title: String,
    x: Axis,
    y: Axis,
    series: Vec<Series>,
    legend: SeriesLabelPosition,
}

impl Plot {
    fn new(title: &str, x: Axis, y: Axis, legend: SeriesLabelPosition) -> Plot {
        Plot {
            title: title.into(),
            x,
            y,
            series: Vec::new(),
            legend,
        }
    }

    fn add(
        &mut self,
        points: Vec<(f64, f64)>,
        colour: RGBColor,
        style: Style,
        label: Option<String>,
    ) {
        self.series.push(Series {
            points,
            colour,
            width: 2,
            alpha: 1.0,
            style,
            label,
        });
    }

    fn line(&mut self, points: Vec<(f64, f64)>, colour: RGBColor, label: &str) {
        self.add(points, colour, Style::Solid, Some(label.to_string()));
    }

    /// A dashed horizontal line at value `y` across the chart.
    fn hline(&mut self, y: f64, colour: RGBColor, label: Option<String>) {
        self.add(
            vec![(self.x.lo, y), (self.x.hi, y)],
            colour,
            Style::Dashed,
            label,
        );
    }

    /// A dashed vertical line at value `x` up the chart.
    fn vline(&mut self, x: f64, colour: RGBColor, label: Option<String>) {
        self.add(
            vec![(x, self.y.lo), (x, self.y.hi)],
            colour,
            Style::Dashed,
            label,
        );
    }

    /// The legend's lines, in order (for tests and for the text output).
    pub fn legend_entries(&self) -> Vec<&str> {
        self.series
            .iter()
            .filter_map(|s| s.label.as_deref())
            .collect()
    }

    fn draw<DB: DrawingBackend>(&self, root: DrawingArea<DB, Shift>) -> Result<(), PlotError>
    where
        DB::ErrorType: 'static,
    {
        fonts()?;
        let err = |e: DrawingAreaErrorKind<DB::ErrorType>| PlotError::Draw(Box::new(e));
        root.fill(&WHITE).map_err(err)?;
        // The legend goes inside the plot area when its box, sized from its text, fits
        // there; otherwise below the chart, in a band sized from its lines, its font made
        // smaller until the widest line fits the page: legend text is never clipped.
        let labels: Vec<&str> = self.legend_entries();
        let width_at = |size: u32| -> Result<u32, PlotError> {
            let font: TextStyle = (FONT, size).into_font().into();
            labels.iter().try_fold(0u32, |w, l| {
                root.estimate_text_size(l, &font)
                    .map(|(lw, _)| w.max(lw))
                    .map_err(err)
            })
        };
        // The plot area's width (less the margins and the y labels), and the box's extra
        // width: the legend marks (30) and plotters' margins (2 × 5), with some slack.
        let inside = SIZE.0.saturating_sub(14 + 34 + 78 + 16);
        let fits = labels.is_empty() || width_at(12)? + 48 <= inside;
        let (root, band) = if fits {
            (root, None)
        } else {
            let mut size = 12;
            while size > 8 && width_at(size)? + 48 > SIZE.0 - 28 {
                size -= 1;
            }
            let line = size + 6;
            let height = line * labels.len() as u32 + 10;
            let (top, bottom) = root.split_vertically(SIZE.1.saturating_sub(height));
            (top, Some((bottom, size, line)))
        };
        let mut chart = ChartBuilder::on(&root)
            .caption(&self.title, (FONT, 18).into_font().style(FontStyle::Bold))
            .margin(14)
            .margin_right(34)
            .x_label_area_size(46)
            .y_label_area_size(78)
            .build_cartesian_2d(self.x.coord(), self.y.coord())
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc(self.x.desc.as_str())
            .y_desc(self.y.desc.as_str())
            .x_label_formatter(&|t| self.x.tick_label(*t))
            .y_label_formatter(&|t| self.y.tick_label(*t))
            .label_style((FONT, 12))
            .axis_desc_style((FONT, 14))
            .bold_line_style(RGBColor(0xcc, 0xcc, 0xcc))
            .light_line_style(RGBColor(0xee, 0xee, 0xee))
            .draw()
            .map_err(err)?;
        for s in &self.series {
            let pts: Vec<(f64, f64)> = s
                .points
                .iter()
                .map(|(x, y)| (self.x.t(*x), self.y.t(*y)))
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .collect();
            let style = ShapeStyle::from(s.colour.mix(s.alpha)).stroke_width(s.width);
            let anno = match s.style {
                Style::Solid => {
                    // A line of one or two points gets marks, so a short run still shows.
                    let marks = if pts.len() < 3 { 4 } else { 0 };
                    chart.draw_series(LineSeries::new(pts, style).point_size(marks))
                }
                Style::Dashed => chart.draw_series(DashedLineSeries::new(pts, 7, 4, style)),
                Style::Dots => chart.draw_series(
                    pts.into_iter()
                        .map(move |p| Circle::new(p, 4, style.filled())),
                ),
            }
            .map_err(err)?;
            if let Some(label) = &s.label {
                let anno = anno.label(label.as_str());
                match s.style {
                    Style::Solid => {
                        anno.legend(move |(x, y)| {
                            PathElement::new(vec![(x, y), (x + 22, y)], style)
                        });
                    }
                    Style::Dashed => {
                        anno.legend(move |(x, y)| {
                            EmptyElement::at((x, y))
                                + PathElement::new(vec![(0, 0), (7, 0)], style)
                                + PathElement::new(vec![(11, 0), (18, 0)], style)
                        });
                    }
                    Style::Dots => {
                        anno.legend(move |(x, y)| Circle::new((x + 11, y), 4, style.filled()));
                    }
                }
            }
        }
        if let Some((band, size, line)) = band {
            let font: TextStyle = (FONT, size).into_font().into();
            for (k, s) in self.series.iter().filter(|s| s.label.is_some()).enumerate() {
                let y = 5 + (k as u32 * line + line / 2) as i32;
                let style = ShapeStyle::from(s.colour.mix(s.alpha)).stroke_width(s.width);
                let x = 20;
                match s.style {
                    Style::Solid => band.draw(&PathElement::new(vec![(x, y), (x + 22, y)], style)),
                    Style::Dashed => band
                        .draw(&PathElement::new(vec![(x, y), (x + 7, y)], style))
                        .and_then(|()| {
                            band.draw(&PathElement::new(vec![(x + 11, y), (x + 18, y)], style))
                        }),
                    Style::Dots => band.draw(&Circle::new((x + 11, y), 4, style.filled())),
                }
                .map_err(err)?;
                let text = s.label.as_deref().unwrap_or("");
                let (_, h) = band.estimate_text_size(text, &font).map_err(err)?;
                band.draw(&Text::new(text, (x + 34, y - h as i32 / 2), font.clone()))
                    .map_err(err)?;
            }
        } else if self.series.iter().any(|s| s.label.is_some()) {
            chart
                .configure_series_labels()
                .position(self.legend.clone())
                .background_style(WHITE.mix(0.85))
                .border_style(RGBColor(0x99, 0x99, 0x99))
                .label_font((FONT, 12))
                .draw()
                .map_err(err)?;
        }
        root.present().map_err(err)
    }

    /// The plot as an SVG document.
    pub fn svg(&self) -> Result<String, PlotError> {
        let mut out = String::new();
        {
            let root = SVGBackend::with_string(&mut out, SIZE).into_drawing_area();
            self.draw(root)?;
        }
        Ok(out)
    }

    /// The plot as a PNG image (RGB, [`SIZE`]).
    pub fn png(&self) -> Result<Vec<u8>, PlotError> {
        let (w, h) = SIZE;
        let mut px = vec![0u8; w as usize * h as usize * 3];
        {
            let root = BitMapBackend::with_buffer(&mut px, SIZE).into_drawing_area();
            self.draw(root)?;
        }
        let mut out = Vec::new();
        let mut enc = png::Encoder::new(&mut out, w, h);
        enc.set_color(png::ColorType::Rgb);
        enc.set_depth(png::BitDepth::Eight);
        let mut writer = enc.write_header().map_err(PlotError::Png)?;
        writer.write_image_data(&px).map_err(PlotError::Png)?;
        writer.finish().map_err(PlotError::Png)?;
        Ok(out)
    }
}

/// The HdrHistogram percentile-distribution plot of several latency histograms (values in
/// ns), latency on a log axis against percentile on a 1/(1−q) axis, as far out in nines as
/// the largest histogram has samples for; `slo_us`, if any, as a dashed line.
pub fn percentiles(title: &str, hists: &[(String, &Histogram<u64>)], slo_us: Option<f64>) -> Plot {
    let most = hists.iter().map(|(_, h)| h.len()).max().unwrap_or(0).max(1);
    // Out to the percentile that still has ten samples above it.
    let nines = (((most as f64).log10() - 1.0).floor() as u32).clamp(2, 6);
    const PER_NINE: u32 = 40;
    let curves: Vec<(String, Vec<(f64, f64)>)> = hists
        .iter()
        .filter(|(_, h)| !h.is_empty())
        .map(|(name, h)| {
            let pts = (0..=nines * PER_NINE)
                .map(|i| {
                    let t = i as f64 / PER_NINE as f64;
                    let q = 1.0 - 10f64.powf(-t);
                    (t, h.value_at_quantile(q) as f64 / 1000.0)
                })
                .collect();
            (name.clone(), pts)
        })
        .collect();
    let y = Axis::latency(
        curves.iter().flat_map(|(_, c)| c.iter().map(|p| p.1)),
        slo_us.unwrap_or(0.0),
        "latency (log scale)",
    );
    let mut f = Plot::new(title, Axis::nines(nines), y, SeriesLabelPosition::UpperLeft);
    if let Some(slo) = slo_us {
        f.hline(slo, GREY, Some(format!("SLO {}", latency_label(slo))));
    }
    for (i, (name, pts)) in curves.into_iter().enumerate() {
        f.line(pts, colour(i), &name);
    }
    f
}

/// The latency histograms of a run worth plotting: one per request kind, and the probe's.
fn histograms(r: &Report) -> Vec<(String, &Histogram<u64>)> {
    let mut out: Vec<(String, &Histogram<u64>)> = Op::ALL
        .iter()
        .filter(|op| r.stats.op(**op).count > 0)
        .map(|op| (op.name().to_string(), &r.stats.op(*op).hist))
        .collect();
    if let Some(p) = &r.probe {
        for op in Op::ALL {
            if p.op(op).count > 0 {
                out.push((format!("probe-{}", op.name()), &p.op(op).hist));
            }
        }
    }
    out
}

/// The percentile-distribution plot of a run, one line per request kind.
pub fn latency(r: &Report) -> Plot {
    percentiles("Latency by percentile", &histograms(r), Some(r.slo_us))
}

/// The latency CDF of a run: the fraction of requests answered within each latency, one line
/// per request kind, latency on a log axis.
pub fn cdf(r: &Report) -> Plot {
    let hs = histograms(r);
    let x = Axis::latency(
        hs.iter()
            .flat_map(|(_, h)| [h.min().max(1) as f64 / 1000.0, h.max() as f64 / 1000.0]),
        r.slo_us,
        "latency (log scale)",
    );
    let y = Axis::linear(1.0, Unit::Plain, "fraction of requests");
    let mut f = Plot::new("Latency CDF", x, y, SeriesLabelPosition::LowerRight);
    f.vline(
        r.slo_us,
        GREY,
        Some(format!("SLO {}", latency_label(r.slo_us))),
    );
    for (i, (name, h)) in hs.iter().enumerate() {
        // Quantiles evenly spaced in q, then the tail on the 1/(1−q) scale.
        let mut pts: Vec<(f64, f64)> = (0..=100)
            .map(|i| i as f64 / 100.0)
            .chain((1..=40).map(|i| 1.0 - 10f64.powf(-2.0 - 4.0 * i as f64 / 40.0)))
            .map(|q| (h.value_at_quantile(q).max(1) as f64 / 1000.0, q))
            .collect();
        pts.sort_by(|a, b| a.1.total_cmp(&b.1));
        f.line(pts, colour(i), name);
    }
    f
}

/// Completions per second over a run (warm-up and drain included).
pub fn timeline(r: &Report) -> Plot {
    let x = Axis::linear(
        r.timeline.iter().map(|p| p.t).fold(1.0f64, f64::max),
        Unit::Seconds,
        "time",
    );
    let y = Axis::linear(
        r.timeline
            .iter()
            .map(|p| p.completed as f64)
            .fold(r.target_rate.unwrap_or(1.0) * 1.1, f64::max),
        Unit::Count,
        "requests completed per second",
    );
    let mut f = Plot::new(
        "Throughput over time",
        x,
        y,
        SeriesLabelPosition::LowerRight,
    );
    if let Some(rate) = r.target_rate {
        f.hline(rate, GREY, Some(format!("target {}/s", count_label(rate))));
    }
    let pts = r
        .timeline
        .iter()
        .map(|p| (p.t, p.completed as f64))
        .collect();
    f.line(pts, colour(0), "completed/s");
    if r.timeline.iter().any(|p| p.errors > 0) {
        let pts = r.timeline.iter().map(|p| (p.t, p.errors as f64)).collect();
        f.line(pts, colour(1), "errors/s");
    }
    f
}

/// p50 and p99 latency of the requests completed in each interval of a run.
pub fn latency_timeline(r: &Report) -> Plot {
    let pts = r.latency_timeline();
    let x = Axis::linear(
        pts.iter().map(|p| p.t).fold(1.0f64, f64::max),
        Unit::Seconds,
        "time",
    );
    let y = Axis::latency(
        pts.iter().flat_map(|p| [p.p50_us, p.p99_us]),
        r.slo_us,
        "latency (log scale)",
    );
    let mut f = Plot::new(
        &format!(
            "Latency over time (per {} s)",
            num(r.stats.interval_ns as f64 / 1e9)
        ),
        x,
        y,
        SeriesLabelPosition::UpperRight,
    );
    f.hline(
        r.slo_us,
        GREY,
        Some(format!("SLO {}", latency_label(r.slo_us))),
    );
    f.line(
        pts.iter().map(|p| (p.t, p.p99_us)).collect(),
        colour(0),
        "p99",
    );
    f.line(
        pts.iter().map(|p| (p.t, p.p50_us)).collect(),
        colour(1),
        "p50",
    );
    f
}

/// The capacity search: the objective's metric against the offered rate, steps in rate order
/// (not the order the bisection tried them), passes and failures marked.
pub fn capacity(c: &Capacity) -> Plot {
    let limit_us = c.target.limit.as_secs_f64() * 1e6;
    let mut steps: Vec<_> = c.steps.iter().collect();
    steps.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let x = Axis::linear(
        steps.iter().map(|s| s.rate).fold(1.0f64, f64::max),
        Unit::Count,
        "offered load (requests/s)",
    );
    let y = Axis::latency(
        steps.iter().map(|s| s.metric_us),
        limit_us,
        &format!("{} latency (log scale)", c.target.metric.name()),
    );
    let mut f = Plot::new(
        &format!(
            "Capacity search: {}/s at {}",
            count_label(c.capacity.round()),
            c.target.describe()
        ),
        x,
        y,
        SeriesLabelPosition::UpperLeft,
    );
    f.hline(
        limit_us,
        GREY,
        Some(format!("SLO {}", latency_label(limit_us))),
    );
    f.add(
        steps.iter().map(|s| (s.rate, s.metric_us)).collect(),
        colour(0),
        Style::Solid,
        None,
    );
    for (pass, colour, name) in [(true, PASS, "pass"), (false, FAIL, "fail")] {
        let pts: Vec<(f64, f64)> = steps
            .iter()
            .filter(|s| s.pass == pass)
            .map(|s| (s.rate, s.metric_us))
            .collect();
        if !pts.is_empty() {
            f.add(pts, colour, Style::Dots, Some(name.into()));
        }
    }
    if c.capacity > 0.0 {
        f.vline(
            c.capacity,
            PASS,
            Some(format!("capacity {}/s", count_label(c.capacity.round()))),
        );
    }
    f
}

/// One step of a capacity search as a curve draws it: the offered rate (the step's target),
/// the achieved throughput (the x axis) and the latencies.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Point {
    pub offered: f64,
    pub achieved: f64,
    pub latency: Latencies,
}

/// A search's points joined in offered-rate order: the order of the load the server was
/// given. Neither the order the bisection visited them (a zigzag) nor the achieved throughput
/// (an overloaded step achieves less than it was offered, so sorting by it folds the curve's
/// end back over itself).
pub fn sorted(points: &[Point]) -> Vec<Point> {
    let mut v: Vec<Point> = points
        .iter()
        .filter(|p| p.achieved.is_finite() && p.achieved > 0.0 && p.offered.is_finite())
        .copied()
        .collect();
    v.sort_by(|a, b| a.offered.total_cmp(&b.offered));
    v
}

/// A search's latencies at offered rate `r` within its range, by linear interpolation
/// between its two steps around `r` (latencies on the log scale they are drawn on, when
/// positive; the achieved throughput linearly). `pts` is [`sorted`]; None outside its range.
fn at_rate(pts: &[Point], r: f64) -> Option<Point> {
    let (first, last) = (pts.first()?, pts.last()?);
    if r < first.offered || r > last.offered {
        return None;
    }
    let i = pts.partition_point(|p| p.offered < r);
    let b = pts.get(i)?;
    if b.offered == r || i == 0 {
        return Some(*b);
    }
    let a = pts.get(i - 1)?;
    let f = (r - a.offered) / (b.offered - a.offered);
    let lin = |x: f64, y: f64| x + f * (y - x);
    let mix = |x: f64, y: f64| {
        if x > 0.0 && y > 0.0 {
            10f64.powf(lin(x.log10(), y.log10()))
        } else {
            lin(x, y)
        }
    };
    let (la, lb) = (a.latency, b.latency);
    Some(Point {
        offered: r,
        achieved: lin(a.achieved, b.achieved),
        latency: Latencies {
            mean_us: mix(la.mean_us, lb.mean_us),
            p50_us: mix(la.p50_us, lb.p50_us),
            p99_us: mix(la.p99_us, lb.p99_us),
            p999_us: mix(la.p999_us, lb.p999_us),
            max_us: mix(la.max_us, lb.max_us),
        },
    })
}

/// The median curve of several searches (rounds) of one server: at each offered rate, the
/// median across the rounds of the achieved throughput and of each latency, each taken on
/// its own.
///
/// Matching rates across rounds: a bisection visits the same rates in two rounds only while
/// every pass and fail agrees, and with the bracket's top from a closed-loop probe (no
/// `--high`) no two rounds share a rate at all. Rates present in every round would then
/// leave nothing, and fixed bins would put a round's overloaded step beside another's
/// comfortable one. So each round is read as the curve it is drawn as: at every rate any
/// round visited, within the range every round covers (no extrapolation), each round's
/// value comes from its own steps around that rate ([`at_rate`]: linear interpolation,
/// log-linear for latencies), and the median is taken over the rounds. Rounds that share
/// their rates get the plain per-rate median; at any rate the median lies within the
/// rounds' own values, so it cannot start far above all of them.
pub fn median_curve(searches: &[Vec<Point>]) -> Vec<Point> {
    let searches: Vec<Vec<Point>> = searches
        .iter()
        .map(|s| sorted(s))
        .filter(|s| !s.is_empty())
        .collect();
    let lo = searches
        .iter()
        .filter_map(|s| s.first().map(|p| p.offered))
        .fold(f64::MIN, f64::max);
    let hi = searches
        .iter()
        .filter_map(|s| s.last().map(|p| p.offered))
        .fold(f64::MAX, f64::min);
    let mut rates: Vec<f64> = searches
        .iter()
        .flatten()
        .map(|p| p.offered)
        .filter(|r| (lo..=hi).contains(r))
        .collect();
    rates.sort_by(f64::total_cmp);
    rates.dedup();
    rates
        .into_iter()
        .filter_map(|r| {
            let at: Vec<Point> = searches.iter().filter_map(|s| at_rate(s, r)).collect();
            if at.len() != searches.len() {
                return None;
            }
            let m = |pick: fn(&Point) -> f64| median(&at.iter().map(pick).collect::<Vec<_>>());
            Some(Point {
                offered: r,
                achieved: m(|p| p.achieved),
                latency: Latencies {
                    mean_us: m(|p| p.latency.mean_us),
                    p50_us: m(|p| p.latency.p50_us),
                    p99_us: m(|p| p.latency.p99_us),
                    p999_us: m(|p| p.latency.p999_us),
                    max_us: m(|p| p.latency.max_us),
                },
            })
        })
        .collect()
}

type Pick = fn(&Latencies) -> f64;

const PERCENTILES: [(&str, Pick); 5] = [
    ("max", |l| l.max_us),
    ("p99.9", |l| l.p999_us),
    ("p99", |l| l.p99_us),
    ("p50", |l| l.p50_us),
    ("mean", |l| l.mean_us),
];

/// Latency percentiles against achieved throughput, from a capacity search's steps.
pub fn capacity_curve(c: &Capacity) -> Plot {
    let pts: Vec<(f64, Latencies)> = sorted(
        &c.steps
            .iter()
            .map(|s| Point {
                offered: s.rate,
                achieved: s.achieved,
                latency: s.latency,
            })
            .collect::<Vec<_>>(),
    )
    .into_iter()
    .map(|p| (p.achieved, p.latency))
    .collect();
    let limit_us = c.target.limit.as_secs_f64() * 1e6;
    let x = Axis::linear(
        pts.iter().map(|p| p.0).fold(1.0f64, f64::max),
        Unit::Count,
        "achieved throughput (requests/s)",
    );
    let y = Axis::latency(
        pts.iter()
            .flat_map(|(_, l)| PERCENTILES.iter().map(move |(_, p)| p(l))),
        limit_us,
        "latency (log scale)",
    );
    let mut f = Plot::new(
        &format!(
            "Latency vs throughput (capacity {}/s at {})",
            count_label(c.capacity.round()),
            c.target.describe()
        ),
        x,
        y,
        SeriesLabelPosition::UpperLeft,
    );
    f.hline(
        limit_us,
        GREY,
        Some(format!("SLO {}", latency_label(limit_us))),
    );
    for (i, (name, pick)) in PERCENTILES.iter().enumerate() {
        f.line(
            pts.iter().map(|(a, l)| (*a, pick(l))).collect(),
            colour(i),
            name,
        );
    }
    f
}

/// The median of `v` (the mean of the middle two for an even count); 0 for none.
pub fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// One server's searches for [`compare`]: its label; per search, its steps (offered and
/// achieved requests/s, latencies) and the capacity found as (objective, requests/s).
#[derive(Debug, Clone, Default)]
pub struct Curve {
    pub label: String,
    pub searches: Vec<Vec<Point>>,
    pub capacities: Vec<(String, f64)>,
    pub slo_us: Option<f64>,
}

impl Curve {
    /// The legend line: the label and the median capacity per objective.
    fn legend(&self) -> String {
        let mut objectives: Vec<&str> = Vec::new();
        for (o, _) in &self.capacities {
            if !objectives.contains(&o.as_str()) {
                objectives.push(o);
            }
        }
        let caps: Vec<String> = objectives
            .iter()
            .map(|o| {
                let v: Vec<f64> = self
                    .capacities
                    .iter()
                    .filter(|(p, _)| p == o)
                    .map(|(_, c)| *c)
                    .collect();
                let n = if v.len() > 1 {
                    format!(", median of {}", v.len())
                } else {
                    String::new()
                };
                format!("{}/s at {o}{n}", count_label(median(&v).round()))
            })
            .collect();
        if caps.is_empty() {
            self.label.clone()
        } else {
            format!("{}: {}", self.label, caps.join("; "))
        }
    }

    /// Whether every search was for the same objective (rounds of one search), so that a
    /// median over them means something.
    fn one_objective(&self) -> bool {
        let mut objectives = self.capacities.iter().map(|(o, _)| o);
        let first = objectives.next();
        objectives.all(|o| Some(o) == first)
    }

    /// The search whose capacity is the median (the lower middle one for an even count).
    pub fn median_search(&self) -> Option<usize> {
        let mut order: Vec<usize> = (0..self.searches.len()).collect();
        let cap = |i: usize| self.capacities.get(i).map_or(0.0, |c| c.1);
        order.sort_by(|a, b| cap(*a).total_cmp(&cap(*b)));
        order.get(order.len().saturating_sub(1) / 2).copied()
    }
}

/// Several servers' p99 (solid) and mean (dashed) latency against achieved throughput: one
/// thin line per search, and bold, each server's median over its searches ([`median_curve`];
/// a single search is drawn bold itself), one legend entry per server. Every line joins its
/// points in offered-rate order.
pub fn compare(curves: &[Curve]) -> Plot {
    // Per server: its searches (sorted) and their median curve.
    type Lines<'a> = Vec<(&'a Curve, Vec<Vec<Point>>, Vec<Point>)>;
    let lines: Lines = curves
        .iter()
        .map(|c| {
            let searches: Vec<Vec<Point>> = c.searches.iter().map(|s| sorted(s)).collect();
            let median = if searches.len() > 1 && c.one_objective() {
                median_curve(&searches)
            } else {
                Vec::new()
            };
            (c, searches, median)
        })
        .collect();
    let all = || {
        lines
            .iter()
            .flat_map(|(_, s, m)| s.iter().flatten().chain(m.iter()))
    };
    let slo_us = curves.iter().find_map(|c| c.slo_us).unwrap_or(1000.0);
    let x = Axis::linear(
        all().map(|p| p.achieved).fold(1.0f64, f64::max),
        Unit::Count,
        "achieved throughput (requests/s)",
    );
    let y = Axis::latency(
        all().flat_map(|p| [p.latency.p99_us, p.latency.mean_us]),
        slo_us,
        "latency (log scale)",
    );
    let mut f = Plot::new(
        "Latency vs throughput: p99 (solid), mean (dashed)",
        x,
        y,
        SeriesLabelPosition::UpperLeft,
    );
    f.hline(slo_us, GREY, Some(format!("SLO {}", latency_label(slo_us))));
    for (i, (c, searches, median)) in lines.iter().enumerate() {
        // A search alone, or searches for different objectives (`bench/capacity.sh`), whose
        // median would mean nothing: each drawn bold itself.
        let single = searches.len() == 1 || !c.one_objective();
        let bold = searches.iter().filter(|_| single).chain(Some(median));
        let thin = searches.iter().filter(|_| !single);
        for (pts, width, alpha) in thin.map(|p| (p, 1, 0.45)).chain(bold.map(|p| (p, 2, 1.0))) {
            if pts.is_empty() {
                continue;
            }
            for (pick, style) in [
                ((|l| l.p99_us) as Pick, Style::Solid),
                (|l| l.mean_us, Style::Dashed),
            ] {
                f.series.push(Series {
                    points: pts.iter().map(|p| (p.achieved, pick(&p.latency))).collect(),
                    colour: colour(i),
                    width,
                    alpha,
                    style,
                    label: None,
                });
            }
        }
        f.series.push(Series {
            points: vec![],
            colour: colour(i),
            width: 2,
            alpha: 1.0,
            style: Style::Solid,
            label: Some(c.legend()),
        });
    }
    f
}

/// Add a capacity search's JSON report (`kvblast capacity --json`) to `curve` as one more
/// search ([`add_capacity`]). Malformed input is an error.
pub fn add_capacity_json(curve: &mut Curve, text: &str) -> Result<(), PlotError> {
    let report: CapacityReport = serde_json::from_str(text).map_err(|e| {
        if e.is_data() {
            PlotError::NotCapacityReport(e)
        } else {
            PlotError::NotJson(e)
        }
    })?;
    add_capacity(curve, &report);
    Ok(())
}

/// Add a capacity search's report to `curve` as one more search: its steps and its
/// capacity.
pub fn add_capacity(curve: &mut Curve, report: &CapacityReport) {
    let search = report
        .steps
        .iter()
        .map(|s| Point {
            // Reports from before the steps' rates were written lack them: their achieved
            // throughput stands in.
            offered: if s.rate.0 > 0.0 {
                s.rate.0
            } else {
                s.achieved.0
            },
            achieved: s.achieved.0,
            latency: Latencies {
                mean_us: s.mean_us.0,
                p50_us: s.p50_us.0,
                p99_us: s.p99_us.0,
                p999_us: s.p999_us.0,
                max_us: s.max_us.0,
            },
        })
        .collect();
    let slo = report.slo.as_str();
    let cap = report.capacity.0;
    curve.searches.push(search);
    curve.capacities.push((slo.to_string(), cap));
    if curve.slo_us.is_none() {
        // "p99<=1ms" and the like: the limit after "<=".
        curve.slo_us = slo
            .split_once("<=")
            .and_then(|(_, t)| crate::units::parse_duration(t).ok())
            .map(|d| d.as_secs_f64() * 1e6);
    }
}

/// The latency histograms in an HdrHistogram interval log (`kvblast run --hdr-log`, or any
/// tool's), one per tag (untagged ones as "all"), intervals of a tag added together.
pub fn read_hdr_log(bytes: &[u8]) -> Result<Vec<(String, Histogram<u64>)>, PlotError> {
    use base64::Engine as _;
    use hdrhistogram::serialization::interval_log::{IntervalLogIterator, LogEntry};
    use hdrhistogram::serialization::Deserializer;
    let mut out: Vec<(String, Histogram<u64>)> = Vec::new();
    let mut de = Deserializer::new();
    for (n, entry) in IntervalLogIterator::new(bytes).enumerate() {
        let entry_no = n + 1;
        let entry = entry.map_err(|reason| PlotError::LogEntry {
            entry: entry_no,
            reason,
        })?;
        let LogEntry::Interval(ilh) = entry else {
            continue;
        };
        let raw = base64::engine::general_purpose::STANDARD
            .decode(ilh.encoded_histogram())
            .map_err(|source| PlotError::LogBase64 {
                entry: entry_no,
                source,
            })?;
        let h: Histogram<u64> =
            de.deserialize(&mut raw.as_slice())
                .map_err(|source| PlotError::LogHistogram {
                    entry: entry_no,
                    source,
                })?;
        let tag = ilh.tag().map_or("all", |t| t.as_str()).to_string();
        match out.iter_mut().find(|(t, _)| *t == tag) {
            Some((_, acc)) => acc.add(&h).map_err(|source| PlotError::LogAdd {
                entry: entry_no,
                source,
            })?,
            None => out.push((tag, h)),
        }
    }
    if out.is_empty() {
        return Err(PlotError::EmptyLog);
    }
    Ok(out)
}

/// Write a plot as `PREFIX-NAME.svg` and `PREFIX-NAME.png`; returns the files written.
pub fn write_both(prefix: &str, name: &str, p: &Plot) -> Result<Vec<String>, PlotError> {
    let svg = format!("{prefix}-{name}.svg");
    write_file(&svg, p.svg()?.as_bytes())?;
    let png = format!("{prefix}-{name}.png");
    write_file(&png, &p.png()?)?;
    Ok(vec![svg, png])
}

fn write_file(path: &str, bytes: &[u8]) -> Result<(), PlotError> {
    std::fs::write(path, bytes).map_err(|source| PlotError::Write {
        path: path.into(),
        source,
    })
}

/// Write a plot to `path`, as PNG or SVG by its extension.
pub fn write_one(path: &str, p: &Plot) -> Result<(), PlotError> {
    let bytes = if path.ends_with(".svg") {
        p.svg()?.into_bytes()
    } else if path.ends_with(".png") {
        p.png()?
    } else {
        return Err(PlotError::Extension { path: path.into() });
    };
    write_file(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;

    #[test]
    fn axes_have_nice_bounds_and_ticks() {
        let a = Axis::linear(1001.0, Unit::Count, "");
        assert_eq!((a.lo, a.hi, a.step), (0.0, 1200.0, 200.0));
        assert_eq!(a.ticks().0.len(), 7);
        let a = Axis::linear(0.0, Unit::Plain, "");
        assert_eq!(a.hi, 1.0);
        let l = Axis::log(35.0, 2500.0, Unit::Micros, "");
        assert_eq!((l.lo, l.hi), (10.0, 10_000.0));
        let (bold, light) = l.ticks();
        assert_eq!(bold, vec![1.0, 2.0, 3.0, 4.0]);
        assert_eq!(light.len(), 3 * 8);
        let labels: Vec<String> = bold.iter().map(|t| l.tick_label(*t)).collect();
        assert_eq!(labels, ["10 µs", "100 µs", "1 ms", "10 ms"]);
        let n = Axis::nines(3);
        let labels: Vec<String> = n.ticks().0.iter().map(|t| n.tick_label(*t)).collect();
        assert_eq!(labels, ["0%", "90%", "99%", "99.9%"]);
    }

    #[test]
    fn labels_read_as_people_write_them() {
        assert_eq!(latency_label(250.0), "250 µs");
        assert_eq!(latency_label(1500.0), "1.5 ms");
        assert_eq!(latency_label(2e6), "2 s");
        assert_eq!(latency_label(0.1), "0.1 µs");
        assert_eq!(count_label(800.0), "800");
        assert_eq!(count_label(20_000.0), "20k");
        assert_eq!(count_label(1_500_000.0), "1.5M");
        assert_eq!(count_label(194_062.0), "194k");
        assert_eq!(count_label(1_234_567.0), "1.23M");
        assert_eq!(count_label(0.0), "0");
        assert_eq!(nines_label(5.0), "99.999%");
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    fn report() -> Report {
        let mut st = Stats::default();
        for op in [Op::Get, Op::Set] {
            let o = &mut st.ops[op.index()];
            for v in 1..1000u64 {
                o.hist.saturating_record(v * 1000);
                o.count += 1;
            }
        }
        st.interval_ns = 1_000_000_000;
        for i in 0..3u64 {
            let mut h = crate::stats::new_interval_histogram();
            h.saturating_record(100 * (i + 1));
            st.intervals.push(h);
        }
        Report {
            settings: vec![],
            pipeline: crate::stats::Pipeline::Window,
            depth: 1,
            seconds: 1.0,
            target_rate: None,
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

    /// The text elements of an SVG document.
    fn texts(svg: &str) -> Vec<String> {
        svg.split("<text")
            .skip(1)
            .filter_map(|t| t.split_once('>'))
            .filter_map(|(_, rest)| rest.split_once("</text>"))
            .map(|(text, _)| text.trim().to_string())
            .collect()
    }

    #[test]
    fn latency_plot_has_a_line_per_kind_and_the_slo() {
        let p = latency(&report());
        assert_eq!(p.legend_entries(), ["SLO 1 ms", "get", "set"]);
        // 999 samples: percentiles out to 99% (ten samples above it).
        assert_eq!(p.x.hi, 2.0);
        let svg = p.svg().unwrap_or_else(|e| panic!("{e}"));
        assert!(svg.starts_with("<svg"), "{svg}");
        assert!(svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        for text in [
            "get",
            "set",
            "99%",
            "1 ms",
            "SLO 1 ms",
            "Latency by percentile",
        ] {
            assert!(texts.iter().any(|t| t == text), "{text} missing: {texts:?}");
        }
    }

    fn dark_pixels(png: &[u8]) -> usize {
        let mut dec = png::Decoder::new(std::io::Cursor::new(png))
            .read_info()
            .unwrap_or_else(|e| panic!("{e}"));
        let mut buf = vec![0; dec.output_buffer_size().unwrap_or(0)];
        let info = dec.next_frame(&mut buf).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((info.width, info.height), SIZE);
        buf.chunks(3).filter(|p| p.iter().all(|&c| c < 100)).count()
    }

    #[test]
    fn plots_render_as_png_with_text() {
        let r = report();
        for p in [latency(&r), cdf(&r), timeline(&r), latency_timeline(&r)] {
            let png = p.png().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
            // Axes, tick labels and the title are dark; a blank page has none.
            assert!(dark_pixels(&png) > 1000, "{}", p.title);
        }
        // Text is rasterized: a longer title darkens more pixels.
        let short = Plot::new(
            "a",
            Axis::nines(2),
            Axis::nines(2),
            SeriesLabelPosition::UpperLeft,
        );
        let mut long = short.clone();
        long.title = "Latency by percentile, µs".into();
        let count = |p: &Plot| dark_pixels(&p.png().unwrap_or_else(|e| panic!("{e}")));
        assert!(count(&long) > count(&short) + 200);
    }

    fn capacity_json(slo: &str, cap: f64, scale: f64) -> String {
        let steps: Vec<String> = [(3.0, 10.0), (1.0, 5.0), (2.0, 8.0)]
            .iter()
            .map(|(a, p)| {
                format!(
                    r#"{{"achieved": {}, "mean_us": {}, "p50_us": 1, "p99_us": {}, "p999_us": 1, "max_us": 1}}"#,
                    a * scale,
                    p / 2.0,
                    p
                )
            })
            .collect();
        format!(
            r#"{{"slo": "{slo}", "capacity": {cap}, "steps": [{}]}}"#,
            steps.join(",")
        )
    }

    #[test]
    fn compare_has_a_legend_line_per_server_and_lines_in_throughput_order() {
        let mut one = Curve {
            label: "one".into(),
            ..Default::default()
        };
        let mut two = Curve {
            label: "two".into(),
            ..Default::default()
        };
        for (cap, scale) in [(30e3, 1e4), (10e3, 0.9e4), (20e3, 1.1e4)] {
            add_capacity_json(&mut one, &capacity_json("p99<=20us", cap, scale))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        add_capacity_json(&mut two, &capacity_json("p99<=20us", 5e5, 1e5))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(one.median_search(), Some(2));
        let p = compare(&[one, two]);
        assert_eq!(
            p.legend_entries(),
            [
                "SLO 20 µs",
                "one: 20k/s at p99<=20us, median of 3",
                "two: 500k/s at p99<=20us"
            ]
        );
        // The SLO line; two lines per search of "one", two for its median and its legend
        // entry; two for the single search of "two" and its legend entry.
        assert_eq!(p.series.len(), 1 + 2 * 3 + 2 + 1 + 2 + 1);
        let line = &p.series[1].points;
        assert!(line.windows(2).all(|w| w[0].0 <= w[1].0), "{line:?}");
        let svg = p.svg().unwrap_or_else(|e| panic!("{e}"));
        assert!(
            texts(&svg).contains(&"two: 500k/s at p99&lt;=20us".to_string()),
            "{svg}"
        );
        assert!(matches!(
            add_capacity_json(&mut Curve::default(), "{}"),
            Err(PlotError::NotCapacityReport(_))
        ));
        assert!(matches!(
            add_capacity_json(&mut Curve::default(), "nope"),
            Err(PlotError::NotJson(_))
        ));
    }

    /// `bench/capacity.sh` plots one search per objective for each server: no median over
    /// searches for different objectives, each search drawn bold.
    #[test]
    fn searches_for_different_objectives_have_no_median() {
        let mut c = Curve {
            label: "server".into(),
            ..Default::default()
        };
        for (slo, cap, scale) in [("avg<=1ms", 30e3, 1e4), ("p99<=10ms", 60e3, 2e4)] {
            add_capacity_json(&mut c, &capacity_json(slo, cap, scale))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let p = compare(&[c]);
        // The SLO line; two bold lines per search; the legend entry.
        assert_eq!(p.series.len(), 1 + 2 * 2 + 1);
        assert!(p.series.iter().skip(1).all(|s| s.width == 2));
    }

    fn point(offered: f64, achieved: f64, p99_us: f64) -> Point {
        Point {
            offered,
            achieved,
            latency: Latencies {
                mean_us: p99_us / 2.0,
                p50_us: p99_us / 3.0,
                p99_us,
                p999_us: p99_us * 2.0,
                max_us: p99_us * 4.0,
            },
        }
    }

    /// A search as the bisection visits it (20k passes, 210k fails overloaded and achieves
    /// only 150k, then 115k, 162k, ...): its lines join the steps in offered-rate order, so
    /// latency rises with the load and no line zigzags back.
    #[test]
    fn curves_join_their_points_by_offered_rate() {
        let visited = [
            point(20e3, 20e3, 140.0),
            point(210e3, 150e3, 50_000.0),
            point(115e3, 115e3, 200.0),
            point(162e3, 158e3, 3000.0),
            point(138e3, 138e3, 400.0),
        ];
        let offered: Vec<f64> = sorted(&visited).iter().map(|p| p.offered).collect();
        assert_eq!(offered, [20e3, 115e3, 138e3, 162e3, 210e3]);
        let mut c = Curve {
            label: "one".into(),
            ..Default::default()
        };
        c.searches.push(visited.to_vec());
        let p = compare(&[c]);
        let p99: Vec<(f64, f64)> = p.series[1].points.clone();
        assert_eq!(
            p99,
            [
                (20e3, 140.0),
                (115e3, 200.0),
                (138e3, 400.0),
                (158e3, 3000.0),
                (150e3, 50_000.0)
            ]
        );
        // The capacity report's steps carry their rates; an older report's achieved
        // throughput stands in for them.
        let mut c = Curve::default();
        add_capacity_json(
            &mut c,
            r#"{"steps": [{"rate": 200, "achieved": 150, "mean_us": 1, "p50_us": 1, "p99_us": 9, "p999_us": 1, "max_us": 1},
                {"achieved": 120, "mean_us": 1, "p50_us": 1, "p99_us": 2, "p999_us": 1, "max_us": 1}]}"#,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let offered: Vec<f64> = sorted(&c.searches[0]).iter().map(|p| p.offered).collect();
        assert_eq!(offered, [120.0, 200.0]);
    }

    /// The median curve takes the median per offered rate across rounds: a round disturbed
    /// at one rate does not carry the curve with it (the median search, drawn whole, did:
    /// 1 ms at 20k while the other rounds measured 140 µs there).
    #[test]
    fn the_median_curve_is_the_median_at_each_rate() {
        let same = vec![
            vec![point(20e3, 20e3, 140.0), point(100e3, 99e3, 300.0)],
            vec![point(20e3, 20e3, 1000.0), point(100e3, 98e3, 280.0)],
            vec![point(20e3, 20e3, 150.0), point(100e3, 97e3, 900.0)],
        ];
        let m = median_curve(&same);
        let got: Vec<(f64, f64, f64)> = m
            .iter()
            .map(|p| (p.offered, p.achieved, p.latency.p99_us))
            .collect();
        assert_eq!(got, [(20e3, 20e3, 150.0), (100e3, 98e3, 300.0)]);
        // Every latency is a median of its own (mean: 75, 500, 70 -> 75).
        assert_eq!(m[0].latency.mean_us, 75.0);
        // Rounds that visited different rates: each round read at every rate any round
        // visited within the range all cover (50k..=100k here; 20k and 120k are left out),
        // between its own steps on the log scale; the median lies among the rounds' values.
        let differ = vec![
            vec![point(20e3, 20e3, 100.0), point(100e3, 100e3, 1000.0)],
            vec![point(50e3, 50e3, 200.0), point(100e3, 100e3, 400.0)],
            vec![point(40e3, 40e3, 150.0), point(120e3, 110e3, 10_000.0)],
        ];
        let m = median_curve(&differ);
        let rates: Vec<f64> = m.iter().map(|p| p.offered).collect();
        assert_eq!(rates, [50e3, 100e3]);
        // At 50k: round 1 at 10^(2 + 30/80) = 237 µs, round 2 200 µs, round 3 at 10^(log 150
        // + (1/8) log(10000/150)) = 253 µs: the median is round 1's.
        let r1 = 10f64.powf(2.0 + 30.0 / 80.0);
        assert!((m[0].latency.p99_us - r1).abs() < 1e-6, "{:?}", m[0]);
        for p in &m {
            let each: Vec<f64> = differ
                .iter()
                .filter_map(|s| at_rate(s, p.offered).map(|q| q.latency.p99_us))
                .collect();
            let (lo, hi) = each
                .iter()
                .fold((f64::MAX, 0f64), |(a, b), v| (a.min(*v), b.max(*v)));
            assert!(
                lo <= p.latency.p99_us && p.latency.p99_us <= hi,
                "{p:?} {each:?}"
            );
        }
        // Rounds with no rate in common range give no median curve; one round is itself.
        let apart = vec![vec![point(1e3, 1e3, 1.0)], vec![point(2e3, 2e3, 1.0)]];
        assert!(median_curve(&apart).is_empty());
        assert_eq!(median_curve(&same[..1]), sorted(&same[0]));
    }

    /// A legend too wide for the plot area goes below it, in full.
    #[test]
    fn long_legends_are_not_clipped() {
        let mut c = Curve {
            label: "kvcached-built-from-a-branch-with-a-long-name".into(),
            ..Default::default()
        };
        for slo in ["avg<=1ms", "p99<=10ms", "p99.9<=20ms"] {
            add_capacity_json(&mut c, &capacity_json(slo, 123_456.0, 1e4))
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let p = compare(&[c]);
        let label = p.legend_entries()[1].to_string();
        assert!(label.len() > 100, "{label}");
        let svg = p.svg().unwrap_or_else(|e| panic!("{e}"));
        let label = label.replace('<', "&lt;");
        assert!(texts(&svg).contains(&label), "{svg}");
        let png = p.png().unwrap_or_else(|e| panic!("{e}"));
        if let Some(dir) = std::env::var_os("KVBLAST_PLOT_DIR") {
            let _ = std::fs::write(std::path::Path::new(&dir).join("long-legend.png"), &png);
        }
        assert!(dark_pixels(&png) > 1000);
    }

    #[test]
    fn hdr_logs_read_back_by_tag() {
        let r = report();
        let log = r.hdr_log().unwrap_or_else(|e| panic!("{e}"));
        let hs = read_hdr_log(&log).unwrap_or_else(|e| panic!("{e}"));
        let tags: Vec<&str> = hs.iter().map(|(t, _)| t.as_str()).collect();
        assert_eq!(tags, ["get", "set"]);
        assert_eq!(hs[0].1, r.stats.op(Op::Get).hist);
        assert!(matches!(read_hdr_log(b""), Err(PlotError::EmptyLog)));
        assert!(read_hdr_log(b"#[StartTime: 1\nTag=x,0.1,1.0,1.0,!!!\n").is_err());
    }
}
