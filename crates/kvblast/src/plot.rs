//! Plots, each drawn once as a list of shapes and rendered two ways: SVG (text, no
//! dependencies; fonts are the viewer's) and PNG (rasterized in pure Rust by
//! embedded-graphics with its built-in ISO 8859-1 bitmap font, encoded by the `png` crate: no
//! system fonts or libraries).
//!
//! - [`latency`]: the HdrHistogram percentile-distribution plot, latency against percentile
//!   on a 1/(1−q) axis, one line per request kind, with the SLO as a dashed line;
//! - [`cdf`]: the latency CDF (fraction of requests at or under a latency, log latency axis);
//! - [`timeline`]: completions per second over the run;
//! - [`latency_timeline`]: p50 and p99 latency over the run;
//! - [`capacity`]: a capacity search, the objective's metric against the offered rate for
//!   every step, passes and failures marked, with the SLO and the capacity found;
//! - [`capacity_curve`]: mean/p50/p99/p99.9/max latency against achieved throughput, from a
//!   capacity search's steps;
//! - [`compare`]: several servers' p99 and mean latency against achieved throughput on one
//!   plot (`kvblast plot`).

use std::convert::Infallible;
use std::fmt::Write as _;

use embedded_graphics::mono_font::iso_8859_1::{FONT_7X13, FONT_9X15_BOLD};
use embedded_graphics::mono_font::{MonoFont, MonoTextStyle};
use embedded_graphics::pixelcolor::Rgb888;
use embedded_graphics::prelude::*;
use embedded_graphics::primitives::{Circle, Line, PrimitiveStyle, Rectangle};
use embedded_graphics::text::{Alignment, Baseline, Text, TextStyleBuilder};
use hdrhistogram::Histogram;

use crate::capacity::{Capacity, Latencies};
use crate::stats::Report;
use crate::workload::Op;

const W: f64 = 800.0;
const H: f64 = 480.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 170.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];
const GREY: &str = "#555555";
const GRID: &str = "#dddddd";
const BLACK: &str = "#000000";
const PASS: &str = "#2ca02c";
const FAIL: &str = "#d62728";

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A "nice" upper bound for an axis: 1, 2 or 5 times a power of ten, at least `x`.
fn nice_ceil(x: f64) -> f64 {
    if !(x > 0.0 && x.is_finite()) {
        return 1.0;
    }
    let p = 10f64.powf(x.log10().floor());
    for m in [1.0, 2.0, 5.0, 10.0] {
        if m * p >= x {
            return m * p;
        }
    }
    10.0 * p
}

/// A tick label: integers as integers, else up to 3 decimals without trailing zeros.
fn label(v: f64) -> String {
    if (v - v.round()).abs() < 1e-9 {
        format!("{}", v.round() as i64)
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// An axis: linear from 0 to `hi`, or logarithmic between two powers of ten.
#[derive(Debug, Clone, Copy)]
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
}

impl Scale {
    fn linear(max: f64) -> Scale {
        Scale {
            lo: 0.0,
            hi: nice_ceil(max),
            log: false,
        }
    }

    /// Powers of ten around `min..max` (values at most 0 are left out by the caller).
    fn log(min: f64, max: f64) -> Scale {
        let lo = 10f64.powf(min.max(1e-3).log10().floor());
        let hi = 10f64.powf(max.max(lo * 10.0).log10().ceil());
        Scale {
            lo,
            hi: hi.max(lo * 10.0),
            log: true,
        }
    }

    fn frac(&self, v: f64) -> f64 {
        if self.log {
            (v.max(self.lo * 1e-3).log10() - self.lo.log10()) / (self.hi.log10() - self.lo.log10())
        } else {
            (v - self.lo) / (self.hi - self.lo)
        }
    }

    fn ticks(&self) -> Vec<(f64, String)> {
        if self.log {
            let n = (self.hi / self.lo).log10().round() as i32;
            (0..=n)
                .map(|i| {
                    let v = self.lo * 10f64.powi(i);
                    (self.frac(v), label(v))
                })
                .collect()
        } else {
            (0..=5)
                .map(|i| {
                    let v = self.hi * i as f64 / 5.0;
                    (i as f64 / 5.0, label(v))
                })
                .collect()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Anchor {
    Start,
    Middle,
    End,
}

#[derive(Debug, Clone)]
enum Shape {
    Line {
        pts: Vec<(f64, f64)>,
        colour: &'static str,
        width: u32,
        dashed: bool,
    },
    Rect {
        x: f64,
        y: f64,
        w: f64,
        h: f64,
    },
    Text {
        x: f64,
        y: f64,
        text: String,
        anchor: Anchor,
        big: bool,
        vertical: bool,
    },
    Dot {
        x: f64,
        y: f64,
        colour: &'static str,
        title: String,
    },
}

/// One plot: a title, axis labels, and shapes in pixel coordinates.
#[derive(Debug, Clone)]
pub struct Plot {
    shapes: Vec<Shape>,
    pw: f64,
    ph: f64,
    legends: usize,
}

impl Plot {
    fn new(title: &str, xlabel: &str, ylabel: &str) -> Plot {
        let cx = (LEFT + W - RIGHT) / 2.0;
        Plot {
            shapes: vec![
                Shape::Text {
                    x: cx,
                    y: 24.0,
                    text: title.into(),
                    anchor: Anchor::Middle,
                    big: true,
                    vertical: false,
                },
                Shape::Text {
                    x: cx,
                    y: H - 14.0,
                    text: xlabel.into(),
                    anchor: Anchor::Middle,
                    big: false,
                    vertical: false,
                },
                Shape::Text {
                    x: 18.0,
                    y: (TOP + H - BOTTOM) / 2.0,
                    text: ylabel.into(),
                    anchor: Anchor::Middle,
                    big: false,
                    vertical: true,
                },
            ],
            pw: W - LEFT - RIGHT,
            ph: H - TOP - BOTTOM,
            legends: 0,
        }
    }

    /// Pixel position of a point given as fractions of the plot area (0..1 each).
    fn at(&self, fx: f64, fy: f64) -> (f64, f64) {
        (
            LEFT + fx.clamp(0.0, 1.0) * self.pw,
            TOP + (1.0 - fy.clamp(0.0, 1.0)) * self.ph,
        )
    }

    fn text(&mut self, x: f64, y: f64, text: String, anchor: Anchor) {
        self.shapes.push(Shape::Text {
            x,
            y,
            text,
            anchor,
            big: false,
            vertical: false,
        });
    }

    fn axes(&mut self, xticks: &[(f64, String)], yticks: &[(f64, String)]) {
        for (f, label) in xticks {
            let (x, y) = self.at(*f, 0.0);
            self.shapes.push(Shape::Line {
                pts: vec![(x, TOP), (x, y)],
                colour: GRID,
                width: 1,
                dashed: false,
            });
            self.text(x, y + 16.0, label.clone(), Anchor::Middle);
        }
        for (f, label) in yticks {
            let (x, y) = self.at(0.0, *f);
            self.shapes.push(Shape::Line {
                pts: vec![(x, y), (LEFT + self.pw, y)],
                colour: GRID,
                width: 1,
                dashed: false,
            });
            self.text(x - 6.0, y + 4.0, label.clone(), Anchor::End);
        }
        self.shapes.push(Shape::Rect {
            x: LEFT,
            y: TOP,
            w: self.pw,
            h: self.ph,
        });
    }

    /// A line through points given as fractions of the plot area.
    fn polyline(&mut self, pts: &[(f64, f64)], colour: &'static str, dashed: bool) {
        if pts.is_empty() {
            return;
        }
        let pts = pts.iter().map(|(fx, fy)| self.at(*fx, *fy)).collect();
        self.shapes.push(Shape::Line {
            pts,
            colour,
            width: if dashed { 1 } else { 2 },
            dashed,
        });
    }

    fn dot(&mut self, fx: f64, fy: f64, colour: &'static str, title: String) {
        let (x, y) = self.at(fx, fy);
        self.shapes.push(Shape::Dot {
            x,
            y,
            colour,
            title,
        });
    }

    /// The next legend entry: a short line (or a dot) and its label, right of the plot.
    fn legend(&mut self, colour: &'static str, label: &str, dashed: bool) {
        let x = LEFT + self.pw + 12.0;
        let y = TOP + 14.0 + 18.0 * self.legends as f64;
        self.legends += 1;
        self.shapes.push(Shape::Line {
            pts: vec![(x, y), (x + 20.0, y)],
            colour,
            width: if dashed { 1 } else { 2 },
            dashed,
        });
        self.text(x + 26.0, y + 4.0, label.into(), Anchor::Start);
    }

    fn legend_dot(&mut self, colour: &'static str, label: &str) {
        let x = LEFT + self.pw + 12.0;
        let y = TOP + 14.0 + 18.0 * self.legends as f64;
        self.legends += 1;
        self.shapes.push(Shape::Dot {
            x: x + 10.0,
            y,
            colour,
            title: String::new(),
        });
        self.text(x + 26.0, y + 4.0, label.into(), Anchor::Start);
    }

    /// The plot as a self-contained SVG document.
    pub fn svg(&self) -> String {
        let mut s = format!(
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        );
        for shape in &self.shapes {
            match shape {
                Shape::Line {
                    pts,
                    colour,
                    width,
                    dashed,
                } => {
                    let mut p = String::new();
                    for (x, y) in pts {
                        let _ = write!(p, "{x:.1},{y:.1} ");
                    }
                    let _ = writeln!(
                        s,
                        "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"{width}\"{}/>",
                        p.trim_end(),
                        if *dashed {
                            " stroke-dasharray=\"6,4\""
                        } else {
                            ""
                        }
                    );
                }
                Shape::Rect { x, y, w, h } => {
                    let _ = writeln!(
                        s,
                        "<rect x=\"{x}\" y=\"{y}\" width=\"{w}\" height=\"{h}\" fill=\"none\" stroke=\"black\"/>"
                    );
                }
                Shape::Text {
                    x,
                    y,
                    text,
                    anchor,
                    big,
                    vertical,
                } => {
                    let anchor = match anchor {
                        Anchor::Start => "start",
                        Anchor::Middle => "middle",
                        Anchor::End => "end",
                    };
                    let size = if *big { " font-size=\"15\"" } else { "" };
                    if *vertical {
                        let _ = writeln!(
                            s,
                            "<text transform=\"translate({x:.1},{y:.1}) rotate(-90)\" text-anchor=\"{anchor}\"{size}>{}</text>",
                            esc(text)
                        );
                    } else {
                        let _ = writeln!(
                            s,
                            "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\"{size}>{}</text>",
                            esc(text)
                        );
                    }
                }
                Shape::Dot {
                    x,
                    y,
                    colour,
                    title,
                } => {
                    let _ = writeln!(
                        s,
                        "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{colour}\"><title>{}</title></circle>",
                        esc(title)
                    );
                }
            }
        }
        s.push_str("</svg>\n");
        s
    }

    /// The plot as a PNG image (800×480, RGB).
    pub fn png(&self) -> Result<Vec<u8>, String> {
        let mut c = Canvas::new(W as u32, H as u32);
        for shape in &self.shapes {
            match shape {
                Shape::Line {
                    pts,
                    colour,
                    width,
                    dashed,
                } => {
                    let style = PrimitiveStyle::with_stroke(rgb(colour), *width);
                    let segments = if *dashed {
                        dashes(pts, 6.0, 4.0)
                    } else {
                        pts.windows(2).map(|w| (w[0], w[1])).collect()
                    };
                    for (a, b) in segments {
                        let _ = Line::new(point(a), point(b))
                            .into_styled(style)
                            .draw(&mut c);
                    }
                }
                Shape::Rect { x, y, w, h } => {
                    let _ =
                        Rectangle::new(point((*x, *y)), Size::new(*w as u32 + 1, *h as u32 + 1))
                            .into_styled(PrimitiveStyle::with_stroke(rgb(BLACK), 1))
                            .draw(&mut c);
                }
                Shape::Text {
                    x,
                    y,
                    text,
                    anchor,
                    big,
                    vertical,
                } => {
                    let font = if *big { &FONT_9X15_BOLD } else { &FONT_7X13 };
                    let text = latin1(text);
                    if *vertical {
                        c.vertical_text(&text, font, (*x, *y));
                    } else {
                        c.text(&text, font, (*x, *y), *anchor);
                    }
                }
                Shape::Dot { x, y, colour, .. } => {
                    let _ = Circle::with_center(point((*x, *y)), 10)
                        .into_styled(PrimitiveStyle::with_fill(rgb(colour)))
                        .draw(&mut c);
                }
            }
        }
        c.encode()
    }
}

fn point((x, y): (f64, f64)) -> Point {
    Point::new(x.round() as i32, y.round() as i32)
}

/// A colour "#rrggbb" (black if malformed: the colours are this module's constants).
fn rgb(hex: &str) -> Rgb888 {
    let v = u32::from_str_radix(hex.trim_start_matches('#'), 16).unwrap_or(0);
    Rgb888::new((v >> 16) as u8, (v >> 8) as u8, v as u8)
}

/// The text in the bitmap font's character set (ISO 8859-1): a few symbols spelled out.
fn latin1(s: &str) -> String {
    s.replace('−', "-").replace('≤', "<=").replace('×', "x")
}

/// The dashes of a polyline: `on` pixels drawn, `off` skipped, along its whole length.
fn dashes(pts: &[(f64, f64)], on: f64, off: f64) -> Vec<((f64, f64), (f64, f64))> {
    let mut out = Vec::new();
    let mut phase = 0.0; // distance into the current on+off period
    for w in pts.windows(2) {
        let ((x0, y0), (x1, y1)) = (w[0], w[1]);
        let len = ((x1 - x0).powi(2) + (y1 - y0).powi(2)).sqrt();
        if len <= 0.0 {
            continue;
        }
        let mut d = 0.0;
        while d < len {
            let in_on = phase < on;
            let step = if in_on { on - phase } else { on + off - phase }.min(len - d);
            if in_on {
                let a = (x0 + (x1 - x0) * d / len, y0 + (y1 - y0) * d / len);
                let e = d + step;
                let b = (x0 + (x1 - x0) * e / len, y0 + (y1 - y0) * e / len);
                out.push((a, b));
            }
            d += step;
            phase = (phase + step) % (on + off);
        }
    }
    out
}

/// An RGB pixel buffer that embedded-graphics draws on.
struct Canvas {
    w: u32,
    h: u32,
    px: Vec<u8>,
}

impl Canvas {
    fn new(w: u32, h: u32) -> Canvas {
        Canvas {
            w,
            h,
            px: vec![255; (w * h * 3) as usize],
        }
    }

    fn set(&mut self, x: i32, y: i32, c: Rgb888) {
        if x >= 0 && y >= 0 && (x as u32) < self.w && (y as u32) < self.h {
            let i = ((y as u32 * self.w + x as u32) * 3) as usize;
            self.px[i..i + 3].copy_from_slice(&[c.r(), c.g(), c.b()]);
        }
    }

    fn text(&mut self, s: &str, font: &MonoFont<'_>, (x, y): (f64, f64), anchor: Anchor) {
        let style = TextStyleBuilder::new()
            .alignment(match anchor {
                Anchor::Start => Alignment::Left,
                Anchor::Middle => Alignment::Center,
                Anchor::End => Alignment::Right,
            })
            .baseline(Baseline::Alphabetic)
            .build();
        let _ = Text::with_text_style(
            s,
            point((x, y)),
            MonoTextStyle::new(font, rgb(BLACK)),
            style,
        )
        .draw(self);
    }

    /// Text read bottom to top, centred on (x, y): drawn on a scratch canvas, then turned.
    fn vertical_text(&mut self, s: &str, font: &MonoFont<'_>, (x, y): (f64, f64)) {
        let tw = font.character_size.width * s.chars().count() as u32;
        let th = font.character_size.height;
        let mut scratch = Canvas::new(tw.max(1), th.max(1));
        let _ = Text::with_baseline(
            s,
            Point::zero(),
            MonoTextStyle::new(font, rgb(BLACK)),
            Baseline::Top,
        )
        .draw(&mut scratch);
        let x0 = x.round() as i32 - th as i32 / 2;
        let y0 = y.round() as i32 + tw as i32 / 2;
        for ty in 0..th {
            for tx in 0..tw {
                let i = ((ty * tw + tx) * 3) as usize;
                if scratch.px[i] < 128 {
                    self.set(x0 + ty as i32, y0 - tx as i32, rgb(BLACK));
                }
            }
        }
    }

    fn encode(&self) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        {
            let mut enc = png::Encoder::new(&mut out, self.w, self.h);
            enc.set_color(png::ColorType::Rgb);
            enc.set_depth(png::BitDepth::Eight);
            let mut w = enc.write_header().map_err(|e| format!("png: {e}"))?;
            w.write_image_data(&self.px)
                .map_err(|e| format!("png: {e}"))?;
            w.finish().map_err(|e| format!("png: {e}"))?;
        }
        Ok(out)
    }
}

impl OriginDimensions for Canvas {
    fn size(&self) -> Size {
        Size::new(self.w, self.h)
    }
}

impl DrawTarget for Canvas {
    type Color = Rgb888;
    type Error = Infallible;

    fn draw_iter<I>(&mut self, pixels: I) -> Result<(), Infallible>
    where
        I: IntoIterator<Item = Pixel<Rgb888>>,
    {
        for Pixel(p, c) in pixels {
            self.set(p.x, p.y, c);
        }
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The plots
// ---------------------------------------------------------------------------------------------

/// The percentiles plotted: 0 to 99.999 on a 1/(1−q) scale.
const NINES: f64 = 5.0;

fn percentile_curve(h: &Histogram<u64>) -> Vec<(f64, f64)> {
    // x = log10(1/(1−q)) / NINES, sampled densely enough for a smooth line.
    (0..=200)
        .map(|i| {
            let x = NINES * i as f64 / 200.0;
            let q = 1.0 - 10f64.powf(-x);
            (x / NINES, h.value_at_quantile(q) as f64 / 1000.0)
        })
        .collect()
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

/// The percentile-distribution plot of a run.
pub fn latency(r: &Report) -> Plot {
    let curves: Vec<(String, Vec<(f64, f64)>)> = histograms(r)
        .into_iter()
        .map(|(n, h)| (n, percentile_curve(h)))
        .collect();
    let ymax_data = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let y = Scale::linear(ymax_data.max(r.slo_us * 1.1));
    let mut f = Plot::new("Latency by percentile", "percentile", "latency (µs)");
    let xticks: Vec<(f64, String)> = [
        (0.0, "0%"),
        (1.0, "90%"),
        (2.0, "99%"),
        (3.0, "99.9%"),
        (4.0, "99.99%"),
        (5.0, "99.999%"),
    ]
    .iter()
    .map(|(x, l)| (x / NINES, l.to_string()))
    .collect();
    f.axes(&xticks, &y.ticks());
    let slo = y.frac(r.slo_us);
    f.polyline(&[(0.0, slo), (1.0, slo)], GREY, true);
    f.legend(GREY, &format!("SLO {} µs", r.slo_us), true);
    for (i, (name, c)) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = c.iter().map(|(x, v)| (*x, y.frac(*v))).collect();
        f.polyline(&pts, colour, false);
        f.legend(colour, name, false);
    }
    f
}

/// The latency CDF of a run: the fraction of requests answered within each latency, one line
/// per request kind, latency on a log axis.
pub fn cdf(r: &Report) -> Plot {
    let hs = histograms(r);
    let (lo, hi) = hs.iter().fold((f64::MAX, 0.0f64), |(lo, hi), (_, h)| {
        (
            lo.min(h.min().max(1) as f64 / 1000.0),
            hi.max(h.max() as f64 / 1000.0),
        )
    });
    let x = if hi > 0.0 {
        Scale::log(lo, hi.max(r.slo_us))
    } else {
        Scale::log(1.0, r.slo_us.max(10.0))
    };
    let mut f = Plot::new(
        "Latency CDF",
        "latency (µs, log scale)",
        "fraction of requests",
    );
    let yticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, label(i as f64 / 5.0)))
        .collect();
    f.axes(&x.ticks(), &yticks);
    let slo = x.frac(r.slo_us);
    f.polyline(&[(slo, 0.0), (slo, 1.0)], GREY, true);
    f.legend(GREY, &format!("SLO {} µs", r.slo_us), true);
    for (i, (name, h)) in hs.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        // Quantiles evenly spaced in q, then the tail on the 1/(1−q) scale.
        let mut pts: Vec<(f64, f64)> = (0..=100)
            .map(|i| i as f64 / 100.0)
            .chain((1..=40).map(|i| 1.0 - 10f64.powf(-2.0 - 4.0 * i as f64 / 40.0)))
            .map(|q| (x.frac(h.value_at_quantile(q) as f64 / 1000.0), q))
            .collect();
        pts.sort_by(|a, b| a.1.total_cmp(&b.1));
        f.polyline(&pts, colour, false);
        f.legend(colour, name, false);
    }
    f
}

/// Completions per second over a run (warm-up and drain included).
pub fn timeline(r: &Report) -> Plot {
    let x = Scale::linear(r.timeline.iter().map(|p| p.t).fold(1.0f64, f64::max));
    let y = Scale::linear(
        r.timeline
            .iter()
            .map(|p| p.completed as f64)
            .fold(r.target_rate.unwrap_or(1.0) * 1.1, f64::max),
    );
    let mut f = Plot::new(
        "Throughput over time",
        "time (s)",
        "requests completed per second",
    );
    f.axes(&x.ticks(), &y.ticks());
    if let Some(rate) = r.target_rate {
        f.polyline(&[(0.0, y.frac(rate)), (1.0, y.frac(rate))], GREY, true);
        f.legend(GREY, "target", true);
    }
    let pts: Vec<(f64, f64)> = r
        .timeline
        .iter()
        .map(|p| (x.frac(p.t), y.frac(p.completed as f64)))
        .collect();
    f.polyline(&pts, COLOURS[0], false);
    f.legend(COLOURS[0], "completed/s", false);
    if r.timeline.iter().any(|p| p.errors > 0) {
        let pts: Vec<(f64, f64)> = r
            .timeline
            .iter()
            .map(|p| (x.frac(p.t), y.frac(p.errors as f64)))
            .collect();
        f.polyline(&pts, COLOURS[1], false);
        f.legend(COLOURS[1], "errors/s", false);
    }
    f
}

/// p50 and p99 latency of the requests completed in each interval of a run.
pub fn latency_timeline(r: &Report) -> Plot {
    let pts = r.latency_timeline();
    let x = Scale::linear(pts.iter().map(|p| p.t).fold(1.0f64, f64::max));
    let y = Scale::linear(pts.iter().map(|p| p.p99_us).fold(r.slo_us * 1.1, f64::max));
    let mut f = Plot::new(
        &format!(
            "Latency over time (per {} s)",
            label(r.stats.interval_ns as f64 / 1e9)
        ),
        "time (s)",
        "latency (µs)",
    );
    f.axes(&x.ticks(), &y.ticks());
    let slo = y.frac(r.slo_us);
    f.polyline(&[(0.0, slo), (1.0, slo)], GREY, true);
    f.legend(GREY, &format!("SLO {} µs", r.slo_us), true);
    for (i, (name, get)) in [
        (
            "p99",
            (|p| p.p99_us) as fn(&crate::stats::LatencyPoint) -> f64,
        ),
        ("p50", |p| p.p50_us),
    ]
    .into_iter()
    .enumerate()
    {
        let line: Vec<(f64, f64)> = pts.iter().map(|p| (x.frac(p.t), y.frac(get(p)))).collect();
        f.polyline(&line, COLOURS[i], false);
        f.legend(COLOURS[i], name, false);
    }
    f
}

/// The capacity search: metric against offered rate.
pub fn capacity(c: &Capacity) -> Plot {
    let x = Scale::linear(c.steps.iter().map(|s| s.rate).fold(1.0f64, f64::max));
    let limit_us = c.target.limit.as_secs_f64() * 1e6;
    let y = Scale::linear(
        c.steps
            .iter()
            .map(|s| s.metric_us)
            .fold(limit_us * 1.2, f64::max),
    );
    let mut f = Plot::new(
        &format!(
            "Capacity search: {} req/s at {}",
            c.capacity.round(),
            c.target.describe()
        ),
        "offered load (requests/s)",
        &format!("{} latency (µs)", c.target.metric.name()),
    );
    f.axes(&x.ticks(), &y.ticks());
    let slo = y.frac(limit_us);
    f.polyline(&[(0.0, slo), (1.0, slo)], GREY, true);
    f.legend(GREY, "SLO", true);
    let mut steps: Vec<_> = c.steps.iter().collect();
    steps.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let pts: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| (x.frac(s.rate), y.frac(s.metric_us)))
        .collect();
    f.polyline(&pts, COLOURS[0], false);
    for s in &steps {
        f.dot(
            x.frac(s.rate),
            y.frac(s.metric_us),
            if s.pass { PASS } else { FAIL },
            format!(
                "{:.0} req/s: {:.1} µs {}",
                s.rate,
                s.metric_us,
                if s.pass { "pass" } else { "fail" }
            ),
        );
    }
    f.legend_dot(PASS, "pass");
    f.legend_dot(FAIL, "fail");
    if c.capacity > 0.0 {
        let fx = x.frac(c.capacity);
        f.polyline(&[(fx, 0.0), (fx, 1.0)], PASS, true);
    }
    f
}

/// Points (achieved requests/s, latencies) sorted by throughput.
fn sorted(points: &[(f64, Latencies)]) -> Vec<(f64, Latencies)> {
    let mut v: Vec<(f64, Latencies)> = points
        .iter()
        .filter(|(x, _)| x.is_finite() && *x > 0.0)
        .copied()
        .collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

type Pick = fn(&Latencies) -> f64;

const PERCENTILES: [(&str, Pick); 5] = [
    ("max", |l| l.max_us),
    ("p99.9", |l| l.p999_us),
    ("p99", |l| l.p99_us),
    ("p50", |l| l.p50_us),
    ("mean", |l| l.mean_us),
];

/// Latency bounds (µs) over some points and metrics, for a log axis.
fn latency_bounds<'a>(
    pts: impl Iterator<Item = &'a (f64, Latencies)>,
    picks: &[Pick],
    slo_us: f64,
) -> Scale {
    let (lo, hi) = pts
        .flat_map(|(_, l)| picks.iter().map(move |p| p(l)))
        .filter(|v| *v > 0.0 && v.is_finite())
        .fold((slo_us, slo_us), |(lo, hi), v| (lo.min(v), hi.max(v)));
    Scale::log(lo, hi)
}

/// Latency percentiles against achieved throughput, from a capacity search's steps.
pub fn capacity_curve(c: &Capacity) -> Plot {
    let pts = sorted(
        &c.steps
            .iter()
            .map(|s| (s.achieved, s.latency))
            .collect::<Vec<_>>(),
    );
    let limit_us = c.target.limit.as_secs_f64() * 1e6;
    let x = Scale::linear(pts.iter().map(|p| p.0).fold(1.0f64, f64::max));
    let picks: Vec<Pick> = PERCENTILES.iter().map(|p| p.1).collect();
    let y = latency_bounds(pts.iter(), &picks, limit_us);
    let mut f = Plot::new(
        &format!(
            "Latency vs throughput (capacity {} req/s at {})",
            c.capacity.round(),
            c.target.describe()
        ),
        "achieved throughput (requests/s)",
        "latency (µs, log scale)",
    );
    f.axes(&x.ticks(), &y.ticks());
    let slo = y.frac(limit_us);
    f.polyline(&[(0.0, slo), (1.0, slo)], GREY, true);
    f.legend(GREY, "SLO", true);
    for (i, (name, pick)) in PERCENTILES.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let line: Vec<(f64, f64)> = pts
            .iter()
            .map(|(a, l)| (x.frac(*a), y.frac(pick(l))))
            .collect();
        f.polyline(&line, colour, false);
        f.legend(colour, name, false);
    }
    f
}

/// One server's curve for [`compare`]: its label, (achieved requests/s, latencies) points
/// and the capacities found, as (objective, requests/s).
#[derive(Debug, Clone, Default)]
pub struct Curve {
    pub label: String,
    pub points: Vec<(f64, Latencies)>,
    pub capacities: Vec<(String, f64)>,
    pub slo_us: Option<f64>,
}

/// Several servers' p99 (solid) and mean (dashed) latency against achieved throughput.
pub fn compare(curves: &[Curve]) -> Plot {
    let sorted_curves: Vec<(&Curve, Vec<(f64, Latencies)>)> =
        curves.iter().map(|c| (c, sorted(&c.points))).collect();
    let slo_us = curves.iter().find_map(|c| c.slo_us).unwrap_or(1000.0);
    let x = Scale::linear(
        sorted_curves
            .iter()
            .flat_map(|(_, p)| p.iter().map(|q| q.0))
            .fold(1.0f64, f64::max),
    );
    let picks: [Pick; 2] = [|l| l.p99_us, |l| l.mean_us];
    let y = latency_bounds(
        sorted_curves.iter().flat_map(|(_, p)| p.iter()),
        &picks,
        slo_us,
    );
    let mut f = Plot::new(
        "Latency vs throughput: p99 (solid), mean (dashed)",
        "achieved throughput (requests/s)",
        "latency (µs, log scale)",
    );
    f.axes(&x.ticks(), &y.ticks());
    let slo = y.frac(slo_us);
    f.polyline(&[(0.0, slo), (1.0, slo)], GREY, true);
    f.legend(GREY, &format!("SLO {} µs", label(slo_us)), true);
    for (i, (c, pts)) in sorted_curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        for (pick, dashed) in [(picks[0], false), (picks[1], true)] {
            let line: Vec<(f64, f64)> = pts
                .iter()
                .map(|(a, l)| (x.frac(*a), y.frac(pick(l))))
                .collect();
            f.polyline(&line, colour, dashed);
        }
        for (a, l) in pts {
            f.dot(
                x.frac(*a),
                y.frac(l.p99_us),
                colour,
                format!("{}: {a:.0} req/s, p99 {:.1} µs", c.label, l.p99_us),
            );
        }
        f.legend(colour, &c.label, false);
        for (slo, cap) in &c.capacities {
            f.legend(colour, &format!(" {slo}: {cap:.0}/s"), true);
        }
    }
    f
}

/// Add a capacity search's JSON report (`kvblast capacity --json`) to `curve`: its steps
/// become points, its capacity an entry of the legend. Malformed input is an error.
pub fn add_capacity_json(curve: &mut Curve, text: &str) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let steps = v
        .get("steps")
        .and_then(|s| s.as_array())
        .ok_or("not a capacity report (no \"steps\")")?;
    let num = |s: &serde_json::Value, k: &str| -> Result<f64, String> {
        s.get(k).and_then(|x| x.as_f64()).ok_or_else(|| {
            format!("a step has no {k:?} (reports from before kvblast 0.1's plots lack it)")
        })
    };
    for s in steps {
        curve.points.push((
            num(s, "achieved")?,
            Latencies {
                mean_us: num(s, "mean_us")?,
                p50_us: num(s, "p50_us")?,
                p99_us: num(s, "p99_us")?,
                p999_us: num(s, "p999_us")?,
                max_us: num(s, "max_us")?,
            },
        ));
    }
    let slo = v.get("slo").and_then(|s| s.as_str()).unwrap_or("?");
    if let Some(cap) = v.get("capacity").and_then(|c| c.as_f64()) {
        curve.capacities.push((slo.to_string(), cap));
    }
    if curve.slo_us.is_none() {
        // "p99<=1ms" and the like: the limit after "<=".
        curve.slo_us = slo
            .split_once("<=")
            .and_then(|(_, t)| crate::units::parse_duration(t).ok())
            .map(|d| d.as_secs_f64() * 1e6);
    }
    Ok(())
}

/// SVG of [`latency`].
pub fn latency_svg(r: &Report) -> String {
    latency(r).svg()
}

/// SVG of [`timeline`].
pub fn timeline_svg(r: &Report) -> String {
    timeline(r).svg()
}

/// SVG of [`capacity`].
pub fn capacity_svg(c: &Capacity) -> String {
    capacity(c).svg()
}

/// Write a plot as `PREFIX-NAME.svg` and `PREFIX-NAME.png`; returns the files written.
pub fn write_both(prefix: &str, name: &str, p: &Plot) -> Result<Vec<String>, String> {
    let svg = format!("{prefix}-{name}.svg");
    std::fs::write(&svg, p.svg()).map_err(|e| format!("{svg}: {e}"))?;
    let png = format!("{prefix}-{name}.png");
    std::fs::write(&png, p.png()?).map_err(|e| format!("{png}: {e}"))?;
    Ok(vec![svg, png])
}

/// Write a plot to `path`, as PNG or SVG by its extension.
pub fn write_one(path: &str, p: &Plot) -> Result<(), String> {
    let bytes = if path.ends_with(".svg") {
        p.svg().into_bytes()
    } else if path.ends_with(".png") {
        p.png()?
    } else {
        return Err(format!("{path}: give a .png or .svg file name"));
    };
    std::fs::write(path, bytes).map_err(|e| format!("{path}: {e}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::Stats;

    #[test]
    fn nice_bounds() {
        assert_eq!(nice_ceil(0.0), 1.0);
        assert_eq!(nice_ceil(3.0), 5.0);
        assert_eq!(nice_ceil(1000.0), 1000.0);
        assert_eq!(nice_ceil(1001.0), 2000.0);
        let s = Scale::log(35.0, 2500.0);
        assert_eq!((s.lo, s.hi), (10.0, 10_000.0));
        assert!((s.frac(100.0) - 1.0 / 3.0).abs() < 1e-9);
        assert_eq!(s.ticks().len(), 4);
        assert_eq!(label(0.2), "0.2");
        assert_eq!(label(20000.0), "20000");
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

    #[test]
    fn latency_plot_has_a_line_per_kind() {
        let svg = latency_svg(&report());
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // Five grid lines each way, the SLO and its legend, and a line + legend per kind.
        assert_eq!(svg.matches("stroke-width=\"2\"").count(), 4);
        assert_eq!(svg.matches("stroke-dasharray").count(), 2);
        assert!(svg.contains(">get<") && svg.contains(">set<"));
    }

    #[test]
    fn plots_render_as_png() {
        let r = report();
        let blank = Canvas::new(W as u32, H as u32)
            .encode()
            .unwrap_or_else(|e| panic!("{e}"));
        for p in [latency(&r), cdf(&r), timeline(&r), latency_timeline(&r)] {
            let png = p.png().unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
            // IHDR: 800 × 480.
            assert_eq!(&png[16..24], &[0, 0, 3, 32, 0, 0, 1, 224]);
            // Not a blank page: the image compresses to more than a white one does.
            assert!(
                png.len() > blank.len() + 1000,
                "{} {}",
                png.len(),
                blank.len()
            );
        }
    }

    #[test]
    fn dashes_cover_about_the_on_fraction() {
        let d = dashes(&[(0.0, 0.0), (100.0, 0.0)], 6.0, 4.0);
        let drawn: f64 = d.iter().map(|(a, b)| b.0 - a.0).sum();
        assert!((drawn - 60.0).abs() < 1e-9, "{drawn}");
        assert_eq!(d.len(), 10);
    }

    #[test]
    fn text_is_drawn_in_the_png() {
        // A title alone darkens pixels of the title row; an empty one does not.
        let count_dark = |title: &str| {
            let p = Plot::new(title, "", "");
            let mut c = Canvas::new(W as u32, H as u32);
            if let Some(Shape::Text { text, .. }) = p.shapes.first() {
                c.text(text, &FONT_9X15_BOLD, (300.0, 24.0), Anchor::Middle);
            }
            c.px.iter().filter(|&&b| b < 128).count()
        };
        assert_eq!(count_dark(""), 0);
        assert!(count_dark("Latency µs") > 50);
    }
}
