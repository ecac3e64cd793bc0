//! Plots as self-contained SVG (no dependencies, no fonts to embed: SVG text is rendered by
//! the viewer).
//!
//! - [`latency_svg`]: the HdrHistogram percentile-distribution plot, latency against
//!   percentile on a 1/(1−q) axis, one line per request kind, with the SLO as a dashed line.
//! - [`timeline_svg`]: completions per second over the run;
//! - [`capacity_svg`]: a capacity search, the objective's metric against the offered rate for
//!   every step, passes and failures marked, with the SLO and the capacity found.

use std::fmt::Write as _;

use hdrhistogram::Histogram;

use crate::capacity::Capacity;
use crate::stats::Report;
use crate::workload::Op;

const W: f64 = 800.0;
const H: f64 = 480.0;
const LEFT: f64 = 80.0;
const RIGHT: f64 = 150.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 60.0;
const COLOURS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
];

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

struct Frame {
    svg: String,
    pw: f64,
    ph: f64,
}

impl Frame {
    fn new(title: &str, xlabel: &str, ylabel: &str) -> Frame {
        let mut svg = String::new();
        let _ = write!(
            svg,
            "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W}\" height=\"{H}\" viewBox=\"0 0 {W} {H}\" font-family=\"sans-serif\" font-size=\"12\">\n\
<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
<text x=\"{}\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">{}</text>\n\
<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n\
<text transform=\"translate(18,{}) rotate(-90)\" text-anchor=\"middle\">{}</text>\n",
            (LEFT + W - RIGHT) / 2.0,
            esc(title),
            (LEFT + W - RIGHT) / 2.0,
            H - 14.0,
            esc(xlabel),
            (TOP + H - BOTTOM) / 2.0,
            esc(ylabel)
        );
        Frame {
            svg,
            pw: W - LEFT - RIGHT,
            ph: H - TOP - BOTTOM,
        }
    }

    /// Pixel position of a point given as fractions of the plot area (0..1 each).
    fn at(&self, fx: f64, fy: f64) -> (f64, f64) {
        (
            LEFT + fx.clamp(0.0, 1.0) * self.pw,
            TOP + (1.0 - fy.clamp(0.0, 1.0)) * self.ph,
        )
    }

    fn axes(&mut self, xticks: &[(f64, String)], yticks: &[(f64, String)]) {
        let _ = writeln!(
            self.svg,
            "<rect x=\"{LEFT}\" y=\"{TOP}\" width=\"{}\" height=\"{}\" fill=\"none\" stroke=\"black\"/>",
            self.pw, self.ph
        );
        for (f, label) in xticks {
            let (x, y) = self.at(*f, 0.0);
            let _ = writeln!(
                self.svg,
                "<line x1=\"{x:.1}\" y1=\"{TOP}\" x2=\"{x:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
<text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
                y + 16.0,
                esc(label)
            );
        }
        for (f, label) in yticks {
            let (x, y) = self.at(0.0, *f);
            let _ = writeln!(
                self.svg,
                "<line x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{:.1}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                LEFT + self.pw,
                x - 6.0,
                y + 4.0,
                esc(label)
            );
        }
    }

    fn polyline(&mut self, pts: &[(f64, f64)], colour: &str, dashed: bool) {
        if pts.is_empty() {
            return;
        }
        let mut p = String::new();
        for (fx, fy) in pts {
            let (x, y) = self.at(*fx, *fy);
            let _ = write!(p, "{x:.1},{y:.1} ");
        }
        let _ = writeln!(
            self.svg,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"{}\"{}/>",
            p.trim_end(),
            if dashed { 1 } else { 2 },
            if dashed {
                " stroke-dasharray=\"6,4\""
            } else {
                ""
            }
        );
    }

    fn legend(&mut self, i: usize, colour: &str, label: &str) {
        let x = LEFT + self.pw + 12.0;
        let y = TOP + 14.0 + 18.0 * i as f64;
        let _ = writeln!(
            self.svg,
            "<line x1=\"{x}\" y1=\"{y}\" x2=\"{}\" y2=\"{y}\" stroke=\"{colour}\" stroke-width=\"2\"/>\
<text x=\"{}\" y=\"{}\">{}</text>",
            x + 20.0,
            x + 26.0,
            y + 4.0,
            esc(label)
        );
    }

    fn finish(mut self) -> String {
        self.svg.push_str("</svg>\n");
        self.svg
    }
}

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

/// The percentile-distribution plot of a run.
pub fn latency_svg(r: &Report) -> String {
    let mut curves: Vec<(String, Vec<(f64, f64)>)> = Op::ALL
        .iter()
        .filter(|op| r.stats.op(**op).count > 0)
        .map(|op| {
            (
                op.name().to_string(),
                percentile_curve(&r.stats.op(*op).hist),
            )
        })
        .collect();
    if let Some(p) = &r.probe {
        let all = p.all();
        if all.count > 0 {
            curves.push(("probe".into(), percentile_curve(&all.hist)));
        }
    }
    let ymax_data = curves
        .iter()
        .flat_map(|(_, c)| c.iter().map(|p| p.1))
        .fold(0.0f64, f64::max);
    let ymax = nice_ceil(ymax_data.max(r.slo_us * 1.1));
    let mut f = Frame::new("Latency by percentile", "percentile", "latency (µs)");
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
    let yticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, format!("{}", ymax * i as f64 / 5.0)))
        .collect();
    f.axes(&xticks, &yticks);
    let slo = r.slo_us / ymax;
    f.polyline(&[(0.0, slo), (1.0, slo)], "#555", true);
    f.legend(0, "#555", &format!("SLO {} µs", r.slo_us));
    for (i, (name, c)) in curves.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let pts: Vec<(f64, f64)> = c.iter().map(|(x, y)| (*x, y / ymax)).collect();
        f.polyline(&pts, colour, false);
        f.legend(i + 1, colour, name);
    }
    f.finish()
}

/// Completions per second over a run (warm-up and drain included).
pub fn timeline_svg(r: &Report) -> String {
    let tmax = nice_ceil(r.timeline.iter().map(|p| p.t).fold(1.0f64, f64::max));
    let ymax = nice_ceil(
        r.timeline
            .iter()
            .map(|p| p.completed as f64)
            .fold(r.target_rate.unwrap_or(1.0) * 1.1, f64::max),
    );
    let mut f = Frame::new(
        "Throughput over time",
        "time (s)",
        "requests completed per second",
    );
    let xticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, format!("{}", tmax * i as f64 / 5.0)))
        .collect();
    let yticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, format!("{}", ymax * i as f64 / 5.0)))
        .collect();
    f.axes(&xticks, &yticks);
    let mut legend = 0;
    if let Some(rate) = r.target_rate {
        f.polyline(&[(0.0, rate / ymax), (1.0, rate / ymax)], "#555", true);
        f.legend(legend, "#555", "target");
        legend += 1;
    }
    let pts: Vec<(f64, f64)> = r
        .timeline
        .iter()
        .map(|p| (p.t / tmax, p.completed as f64 / ymax))
        .collect();
    f.polyline(&pts, COLOURS[0], false);
    f.legend(legend, COLOURS[0], "completed/s");
    f.finish()
}

/// The capacity search: metric against offered rate.
pub fn capacity_svg(c: &Capacity) -> String {
    let xmax = nice_ceil(c.steps.iter().map(|s| s.rate).fold(1.0f64, f64::max));
    let limit_us = c.target.limit.as_secs_f64() * 1e6;
    let ymax = nice_ceil(
        c.steps
            .iter()
            .map(|s| s.metric_us)
            .fold(limit_us * 1.2, f64::max),
    );
    let mut f = Frame::new(
        &format!(
            "Capacity search: {} req/s at {}",
            c.capacity.round(),
            c.target.describe()
        ),
        "offered load (requests/s)",
        &format!("{} latency (µs)", c.target.metric.name()),
    );
    let xticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, format!("{}", xmax * i as f64 / 5.0)))
        .collect();
    let yticks: Vec<(f64, String)> = (0..=5)
        .map(|i| (i as f64 / 5.0, format!("{}", ymax * i as f64 / 5.0)))
        .collect();
    f.axes(&xticks, &yticks);
    f.polyline(
        &[(0.0, limit_us / ymax), (1.0, limit_us / ymax)],
        "#555",
        true,
    );
    f.legend(0, "#555", "SLO");
    let mut steps: Vec<_> = c.steps.iter().collect();
    steps.sort_by(|a, b| a.rate.total_cmp(&b.rate));
    let pts: Vec<(f64, f64)> = steps
        .iter()
        .map(|s| (s.rate / xmax, s.metric_us / ymax))
        .collect();
    f.polyline(&pts, COLOURS[0], false);
    for s in &steps {
        let (x, y) = f.at(s.rate / xmax, s.metric_us / ymax);
        let colour = if s.pass { "#2ca02c" } else { "#d62728" };
        let _ = writeln!(
            f.svg,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"5\" fill=\"{colour}\"><title>{:.0} req/s: {:.1} µs {}</title></circle>",
            s.rate,
            s.metric_us,
            if s.pass { "pass" } else { "fail" }
        );
    }
    f.legend(1, "#2ca02c", "pass");
    f.legend(2, "#d62728", "fail");
    if c.capacity > 0.0 {
        let fx = c.capacity / xmax;
        f.polyline(&[(fx, 0.0), (fx, 1.0)], "#2ca02c", true);
    }
    f.finish()
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
    }

    #[test]
    fn latency_plot_has_a_line_per_kind() {
        let mut st = Stats::default();
        for op in [Op::Get, Op::Set] {
            let o = &mut st.ops[op.index()];
            for v in 1..1000u64 {
                o.hist.saturating_record(v * 1000);
                o.count += 1;
            }
        }
        let r = Report {
            settings: vec![],
            seconds: 1.0,
            target_rate: None,
            slo_us: 1000.0,
            stats: st,
            probe: None,
            timeline: vec![],
            load_seconds: None,
            server: None,
        };
        let svg = latency_svg(&r);
        assert!(svg.starts_with("<svg"));
        assert!(svg.trim_end().ends_with("</svg>"));
        // SLO line + one line per kind.
        assert_eq!(svg.matches("<polyline").count(), 3);
        assert!(svg.contains(">get<") && svg.contains(">set<"));
    }
}
