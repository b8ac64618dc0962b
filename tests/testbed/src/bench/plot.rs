//! The run at a glance: an SVG written next to the JSON, with two panels. Left: the latency
//! distribution of each scenario (cumulative share of claims against latency, log scale, so the
//! median and the tail read off one curve). Right: PVs over time (count of PVs seen against
//! seconds since the scenario's first create request), whose slope is the PVs/s figure.
//!
//! Hand-written SVG: two panels of polylines need a few dozen lines, where a plotting crate
//! would add a font and raster stack to the bench's build.

use std::fmt::Write;

/// One scenario's samples.
pub struct Series {
    /// Legend text.
    pub label: String,
    /// Latency samples, milliseconds, sorted.
    pub latency_ms: Vec<f64>,
    /// When each PV was seen, seconds since the scenario began, sorted.
    pub pv_seen_secs: Vec<f64>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 420.0;
const PANEL_WIDTH: f64 = 380.0;
const PANEL_HEIGHT: f64 = 280.0;
const TOP: f64 = 60.0;
const LEFT: [f64; 2] = [70.0, 550.0];
const COLORS: [&str; 6] = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf"];
/// At most this many points per line (evenly picked), so the file stays small.
const MAX_POINTS: usize = 400;

/// A panel's data range mapped onto its box.
struct Axes {
    left: f64,
    x: (f64, f64),
    y: (f64, f64),
    log_x: bool,
}

impl Axes {
    fn point(&self, x: f64, y: f64) -> (f64, f64) {
        let fx = if self.log_x { x.max(self.x.0).log10() } else { x };
        let (x0, x1) = if self.log_x { (self.x.0.log10(), self.x.1.log10()) } else { self.x };
        let px = self.left + (fx - x0) / (x1 - x0).max(f64::EPSILON) * PANEL_WIDTH;
        let py = TOP + PANEL_HEIGHT - (y - self.y.0) / (self.y.1 - self.y.0).max(f64::EPSILON) * PANEL_HEIGHT;
        (px, py)
    }
}

/// The SVG document for `series` under `title`.
pub fn render(title: &str, series: &[Series]) -> String {
    let mut svg = String::new();
    let _ = write!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">
<rect width="100%" height="100%" fill="white"/>
<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>
"#,
        WIDTH / 2.0,
        escape(title)
    );
    let all_latency = series.iter().flat_map(|s| s.latency_ms.iter().copied());
    let max_latency = all_latency.clone().fold(1.0, f64::max);
    let min_latency = all_latency.filter(|v| *v > 0.0).fold(max_latency, f64::min);
    let latency =
        Axes { left: LEFT[0], x: (decade_floor(min_latency), decade_ceil(max_latency)), y: (0.0, 1.0), log_x: true };
    let max_secs = series.iter().filter_map(|s| s.pv_seen_secs.last().copied()).fold(1.0, f64::max);
    let max_pvs = series.iter().map(|s| s.pv_seen_secs.len()).max().unwrap_or(0).max(1) as f64;
    let over_time = Axes { left: LEFT[1], x: (0.0, nice_ceil(max_secs)), y: (0.0, nice_ceil(max_pvs)), log_x: false };

    frame(&mut svg, &latency, "latency, ms (log scale)", "share of claims", "Latency distribution");
    frame(&mut svg, &over_time, "seconds since the first claim was created", "PVs", "PVs over time");
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let n = s.latency_ms.len() as f64;
        let cdf = thin(&s.latency_ms).map(|(rank, v)| latency.point(v, (rank + 1) as f64 / n));
        polyline(&mut svg, cdf, color);
        let count = thin(&s.pv_seen_secs).map(|(rank, t)| over_time.point(t, (rank + 1) as f64));
        polyline(&mut svg, count, color);
        let (x, y) = (LEFT[0] + 150.0 * i as f64, TOP + PANEL_HEIGHT + 60.0);
        let _ = writeln!(
            svg,
            r#"<rect x="{x}" y="{}" width="14" height="4" fill="{color}"/><text x="{}" y="{y}">{}</text>"#,
            y - 6.0,
            x + 20.0,
            escape(&s.label)
        );
    }
    svg.push_str("</svg>\n");
    svg
}

/// Box, ticks and labels of a panel.
fn frame(svg: &mut String, axes: &Axes, x_label: &str, y_label: &str, title: &str) {
    let (left, right, top, bottom) = (axes.left, axes.left + PANEL_WIDTH, TOP, TOP + PANEL_HEIGHT);
    let _ = writeln!(
        svg,
        r##"<rect x="{left}" y="{top}" width="{PANEL_WIDTH}" height="{PANEL_HEIGHT}" fill="none" stroke="#444"/>
<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>
<text x="{}" y="{}" text-anchor="middle">{}</text>
<text x="{}" y="{}" text-anchor="middle" transform="rotate(-90 {} {})">{}</text>"##,
        left + PANEL_WIDTH / 2.0,
        top - 10.0,
        escape(title),
        left + PANEL_WIDTH / 2.0,
        bottom + 32.0,
        escape(x_label),
        left - 48.0,
        top + PANEL_HEIGHT / 2.0,
        left - 48.0,
        top + PANEL_HEIGHT / 2.0,
        escape(y_label)
    );
    let x_ticks: Vec<f64> = if axes.log_x {
        let (a, b) = (axes.x.0.log10().round() as i32, axes.x.1.log10().round() as i32);
        (a..=b).map(|e| 10f64.powi(e)).collect()
    } else {
        (0..=4).map(|i| axes.x.0 + (axes.x.1 - axes.x.0) * f64::from(i) / 4.0).collect()
    };
    for x in x_ticks {
        let (px, _) = axes.point(x, axes.y.0);
        let _ = writeln!(
            svg,
            r##"<line x1="{px:.1}" y1="{top}" x2="{px:.1}" y2="{bottom}" stroke="#ddd"/><text x="{px:.1}" y="{}" text-anchor="middle">{}</text>"##,
            bottom + 16.0,
            tick_label(x)
        );
    }
    for i in 0..=4 {
        let y = axes.y.0 + (axes.y.1 - axes.y.0) * f64::from(i) / 4.0;
        let (_, py) = axes.point(axes.x.0, y);
        let _ = writeln!(
            svg,
            r##"<line x1="{left}" y1="{py:.1}" x2="{right}" y2="{py:.1}" stroke="#ddd"/><text x="{}" y="{:.1}" text-anchor="end">{}</text>"##,
            left - 6.0,
            py + 4.0,
            tick_label(y)
        );
    }
}

fn polyline(svg: &mut String, points: impl Iterator<Item = (f64, f64)>, color: &str) {
    let points: Vec<String> = points.map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    if !points.is_empty() {
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="1.8" points="{}"/>"#,
            points.join(" ")
        );
    }
}

/// (rank, value) of at most `MAX_POINTS` samples, evenly spread, the last one always kept.
fn thin(values: &[f64]) -> impl Iterator<Item = (usize, f64)> + '_ {
    let step = values.len().div_ceil(MAX_POINTS).max(1);
    let last = values.len().saturating_sub(1);
    values.iter().copied().enumerate().filter(move |(i, _)| i % step == 0 || *i == last)
}

fn decade_floor(v: f64) -> f64 {
    10f64.powf(v.max(0.1).log10().floor())
}

fn decade_ceil(v: f64) -> f64 {
    let c = 10f64.powf(v.max(1.0).log10().ceil());
    if c <= decade_floor(v) { c * 10.0 } else { c }
}

/// The next of 1, 2, 5 x 10^n at or above `v`.
fn nice_ceil(v: f64) -> f64 {
    let decade = 10f64.powf(v.max(1e-9).log10().floor());
    [1.0, 2.0, 5.0, 10.0].iter().map(|m| m * decade).find(|c| *c >= v).unwrap_or(10.0 * decade)
}

fn tick_label(v: f64) -> String {
    let text = format!("{v:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series() -> Vec<Series> {
        vec![
            Series { label: "c <ours>".into(), latency_ms: vec![2.0, 5.0, 40.0], pv_seen_secs: vec![0.1, 0.5, 1.5] },
            Series { label: "r".into(), latency_ms: vec![1.0, 3.0], pv_seen_secs: vec![0.2, 0.4] },
        ]
    }

    #[test]
    fn draws_two_lines_per_scenario_inside_the_panels_with_an_escaped_legend() {
        let svg = render("bench", &series());
        assert_eq!(svg.matches("<polyline").count(), 4);
        assert!(svg.contains("c &lt;ours&gt;") && !svg.contains("<ours>"));
        for points in svg.split("points=\"").skip(1).map(|s| s.split('"').next().unwrap()) {
            for pair in points.split(' ') {
                let (x, y) = pair.split_once(',').unwrap();
                let (x, y): (f64, f64) = (x.parse().unwrap(), y.parse().unwrap());
                assert!((LEFT[0]..=LEFT[1] + PANEL_WIDTH).contains(&x), "x {x} outside the panels");
                assert!((TOP..=TOP + PANEL_HEIGHT).contains(&y), "y {y} outside the panels");
            }
        }
    }

    #[test]
    fn the_last_sample_ends_each_curve_at_the_top() {
        let axes = Axes { left: 0.0, x: (1.0, 100.0), y: (0.0, 1.0), log_x: true };
        assert_eq!(axes.point(100.0, 1.0), (PANEL_WIDTH, TOP));
        assert_eq!(axes.point(10.0, 0.0), (PANEL_WIDTH / 2.0, TOP + PANEL_HEIGHT));
        let kept: Vec<usize> = thin(&vec![0.0; 1001]).map(|(i, _)| i).collect();
        assert!(kept.len() <= MAX_POINTS + 1 && kept.last() == Some(&1000));
        assert_eq!((nice_ceil(3.2), nice_ceil(70.0), nice_ceil(100.0)), (5.0, 100.0, 100.0));
        assert_eq!(
            (tick_label(37.5), tick_label(100.0), tick_label(0.25)),
            ("37.5".into(), "100".into(), "0.25".into())
        );
    }
}
