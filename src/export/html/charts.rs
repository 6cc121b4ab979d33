//! SVG charts with plotters (SVG backend, no font files: the browser renders the text).

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::record::{RunRecord, VariantRecord};

const W: u32 = 760;
const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
];
const STALL: RGBColor = RGBColor(214, 39, 40);
/// Work on the construction timeline: two shades of one blue, alternating so neighbouring
/// ioctls stay apart, and far from the stall's red.
const WORK: [RGBColor; 2] = [RGBColor(31, 119, 180), RGBColor(120, 170, 210)];

/// Text sizes in plotters' points; its SVG writes `size / 1.24` px, so 14 is 11.3 px: no
/// label below 11 px on any chart.
const LABEL_PT: u32 = 14;
const CAPTION_PT: u32 = 18;

fn label_font() -> (&'static str, u32) {
    ("sans-serif", LABEL_PT)
}

fn caption_font() -> (&'static str, u32) {
    ("sans-serif", CAPTION_PT)
}

/// Values spread over more than this factor go on a log axis (128 beside 65,536 would vanish
/// on a linear one).
const LOG_SPREAD: f64 = 100.0;

/// Plotters' coordinate over the axis: linear over `range`, with the axis's own key points
/// (bold for labels and ticks, light for the minor lines). `DefaultFormatting`, so the chart's
/// label formatter is used.
impl plotters::coord::ranged1d::Ranged for Axis {
    type ValueType = f64;
    type FormatOption = plotters::coord::ranged1d::DefaultFormatting;

    fn range(&self) -> std::ops::Range<f64> {
        self.range.clone()
    }

    fn map(&self, v: &f64, limit: (i32, i32)) -> i32 {
        let width = self.range.end - self.range.start;
        let pixels = f64::from(limit.1 - limit.0);
        let at = ((v - self.range.start) / width * pixels + 1e-3).floor();
        // Clamped to a few chart widths either side: far outside the axis is off the chart.
        #[allow(clippy::cast_possible_truncation)]
        let at = at.clamp(-4.0 * pixels.abs() - 1.0, 4.0 * pixels.abs() + 1.0) as i32;
        limit.0 + at
    }

    fn key_points<H: plotters::coord::ranged1d::KeyPointHint>(&self, hint: H) -> Vec<f64> {
        if hint.weight().allow_light_points() {
            self.light.clone()
        } else {
            self.bold.clone()
        }
    }
}

/// A value axis with its own tick marks: plotters' log axis labels a decade twice (its minor
/// points run to 10×, which is the next decade) and nothing below the first decade, so a log
/// axis is drawn here as a linear axis over log10 with a label at every decade (and at 2 and 5
/// when fewer than two decades show) and a light line at every other integer multiple.
#[derive(Debug, Clone)]
struct Axis {
    /// The drawn range (log10 of the values on a log axis).
    range: std::ops::Range<f64>,
    /// Labelled points, in drawn coordinates.
    bold: Vec<f64>,
    /// Unlabelled minor lines, in drawn coordinates.
    light: Vec<f64>,
    log: bool,
}

impl Axis {
    /// A linear axis over `lo..hi` with about six round ticks.
    fn linear(lo: f64, hi: f64) -> Option<Axis> {
        let range = span(lo, hi)?;
        let raw = (range.end - range.start) / 6.0;
        let mag = 10f64.powf(raw.log10().floor());
        let step = [1.0, 2.0, 5.0, 10.0]
            .iter()
            .map(|k| k * mag)
            .find(|st| *st >= raw)
            .unwrap_or(10.0 * mag);
        let first = (range.start / step).ceil();
        let bold: Vec<f64> = (0..50)
            .map(|i| (first + f64::from(i)) * step)
            .take_while(|v| *v <= range.end + step * 1e-9)
            .map(|v| if v.abs() < step * 1e-9 { 0.0 } else { v })
            .collect();
        Some(Axis {
            range,
            bold,
            light: Vec::new(),
            log: false,
        })
    }

    /// A log axis over `lo..hi` (both positive).
    fn log(lo: f64, hi: f64) -> Option<Axis> {
        if !(lo > 0.0 && hi > lo) {
            return None;
        }
        let range = span(lo.log10(), hi.log10())?;
        let (first, last) = (range.start.floor(), range.end.ceil());
        // 10^±30 at most (span's limit): the loop is short.
        #[allow(clippy::cast_possible_truncation)]
        let decades: Vec<i32> = (first as i32..=last as i32).collect();
        let labelled: &[f64] = if range.end - range.start < 2.0 {
            &[1.0, 2.0, 5.0]
        } else {
            &[1.0]
        };
        let (mut bold, mut light) = (Vec::new(), Vec::new());
        for d in decades {
            for k in 1..10 {
                let v = f64::from(k).log10() + f64::from(d);
                if v < range.start - 1e-9 || v > range.end + 1e-9 {
                    continue;
                }
                if labelled.contains(&f64::from(k)) {
                    bold.push(v);
                } else {
                    light.push(v);
                }
            }
        }
        Some(Axis {
            range,
            bold,
            light,
            log: true,
        })
    }

    /// Log when the positive values spread more than [`LOG_SPREAD`]×, else linear from zero.
    fn auto(values: impl IntoIterator<Item = f64>) -> Option<Axis> {
        let vs: Vec<f64> = values.into_iter().filter(|v| v.is_finite()).collect();
        let hi = vs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        let lo_pos = vs
            .iter()
            .copied()
            .filter(|v| *v > 0.0)
            .fold(f64::INFINITY, f64::min);
        let lo = vs.iter().copied().fold(f64::INFINITY, f64::min);
        if lo >= 0.0 && lo_pos >= 1e-30 && hi / lo_pos > LOG_SPREAD && hi / lo_pos < 1e30 {
            Axis::log(lo_pos * 0.7, hi * 1.4)
        } else {
            let lo = lo.min(0.0);
            let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.05).max(1e-9);
            Axis::linear(lo, hi + pad)
        }
    }

    /// A value in drawn coordinates (clamped to the axis: a zero on a log axis sits at its
    /// bottom).
    fn to(&self, v: f64) -> f64 {
        if self.log {
            if v > 0.0 {
                v.log10().max(self.range.start)
            } else {
                self.range.start
            }
        } else {
            v
        }
    }

    /// The value at a drawn coordinate.
    fn value(&self, a: f64) -> f64 {
        if self.log { 10f64.powf(a) } else { a }
    }

    /// Where bars start: zero, or the bottom of a log axis.
    fn base(&self) -> f64 {
        if self.log { self.range.start } else { 0.0 }
    }

    /// The axis as a plotters coordinate (it draws its own key points, see [`Ranged`]).
    fn coord(&self) -> Axis {
        self.clone()
    }

    /// The label at drawn coordinate `a`, in `unit` on the formatter's scale.
    fn label(&self, a: f64, unit: &str) -> String {
        let v = self.value(a);
        // Round-off from log10/powf: 99999.99 is the decade 100000 (six digits kept).
        let v = if self.log && v > 0.0 {
            let p = 10f64.powf(v.log10().floor() - 5.0);
            (v / p).round() * p
        } else {
            v
        };
        crate::analysis::quantity::tick(v, unit)
    }
}

type Area<'a> = DrawingArea<SVGBackend<'a>, Shift>;

/// The largest magnitude a chart axis may reach. Plotters searches key points over the range;
/// on an infinite one (the span of 1e308 and -1e308 overflows) that search never ends, and far
/// beyond any measured value the ticks carry no information anyway. A chart whose values pass
/// this is left out, never drawn.
const AXIS_LIMIT: f64 = 1e30;

/// The axis range `lo..hi`, or `None` when it cannot be drawn: not finite, beyond
/// [`AXIS_LIMIT`], or reversed. A range too narrow for its magnitude is widened so ticks can
/// be placed.
fn span(lo: f64, hi: f64) -> Option<std::ops::Range<f64>> {
    let sane = |x: f64| x.is_finite() && x.abs() <= AXIS_LIMIT;
    if !(sane(lo) && sane(hi)) || hi < lo {
        return None;
    }
    let least = (lo.abs().max(hi.abs()) * 1e-9).max(1e-9);
    if hi - lo < least {
        return Some(lo - least..hi + least);
    }
    Some(lo..hi)
}

/// The name of the category at axis position `x` (categories sit at 0, 1, 2, ...).
fn category_label(names: &[String], x: f64) -> String {
    let i = x.round();
    if (x - i).abs() > 0.01 || i < 0.0 || i >= names.len() as f64 {
        return String::new();
    }
    // 0 <= i < names.len(), an exact whole number.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    names[i as usize].clone()
}

fn render(
    height: u32,
    draw: impl FnOnce(&Area<'_>) -> Result<(), Box<dyn std::error::Error>>,
) -> Option<String> {
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (W, height)).into_drawing_area();
        root.fill(&WHITE).ok()?;
        draw(&root).ok()?;
        root.present().ok()?;
    }
    Some(svg)
}

fn ok_with<'a>(r: &'a RunRecord, metric: &str) -> Vec<&'a VariantRecord> {
    r.variants
        .iter()
        .filter(|v| v.is_ok() && v.metrics.contains_key(metric))
        .collect()
}

/// Every sample of `metric` per variant as points, the median as a bar; log scale when the
/// samples span more than 100×.
pub fn distribution(r: &RunRecord, metric: &str) -> Option<String> {
    let vs = ok_with(r, metric);
    if vs.is_empty() {
        return None;
    }
    let unit = vs[0].metrics[metric].unit.clone();
    let all: Vec<f64> = vs
        .iter()
        .flat_map(|v| v.metrics[metric].samples.iter().copied())
        .filter(|x| x.is_finite())
        .collect();
    let names: Vec<String> = vs.iter().map(|v| v.name.clone()).collect();
    let n = vs.len() as f64;
    let axis = Axis::auto(all.iter().copied())?;
    render(340, |root| {
        let caption = format!("{metric} per repetition, median marked");
        let mut c = ChartBuilder::on(root)
            .caption(caption, caption_font())
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.5..n - 0.5, axis.coord())?;
        let fmt = |x: &f64| category_label(&names, *x);
        let fy = |y: &f64| axis.label(*y, &unit);
        c.configure_mesh()
            .x_labels(vs.len() + 1)
            .x_label_formatter(&fmt)
            .y_label_formatter(&fy)
            .label_style(label_font())
            .axis_desc_style(label_font())
            .y_desc(if axis.log { "log scale" } else { "" })
            .disable_x_mesh()
            .draw()?;
        for (i, v) in vs.iter().enumerate() {
            let s = &v.metrics[metric].samples;
            c.draw_series(
                s.iter()
                    .enumerate()
                    .filter(|(_, y)| y.is_finite())
                    .map(|(k, y)| {
                        let jitter = (k as f64 / s.len().max(1) as f64 - 0.5) * 0.4;
                        Circle::new(
                            (i as f64 + jitter, axis.to(*y)),
                            3,
                            PALETTE[i % PALETTE.len()].mix(0.6).filled(),
                        )
                    }),
            )?;
            let m = axis.to(v.metrics[metric].median);
            c.draw_series(std::iter::once(PathElement::new(
                vec![(i as f64 - 0.3, m), (i as f64 + 0.3, m)],
                BLACK.stroke_width(2),
            )))?;
        }
        Ok(())
    })
}

/// Medians of `metric` per variant as bars with 95% CI whiskers.
pub fn bars(r: &RunRecord, metric: &str, title: &str) -> Option<String> {
    let vs = ok_with(r, metric);
    let unit = &vs.first()?.metrics[metric].unit;
    let rows: Vec<(String, f64, [f64; 2])> = vs
        .iter()
        .map(|v| {
            (
                v.name.clone(),
                v.metrics[metric].median,
                v.metrics[metric].ci95,
            )
        })
        .collect();
    let top = rows
        .iter()
        .map(|(_, m, ci)| ci[1].max(*m))
        .fold(0.0, f64::max);
    row_bars(
        format!("{title}, median with 95% CI"),
        unit,
        &rows,
        top,
        150,
    )
}

/// One bar per labelled row (the fleet page: a variant's headline median per host), with a
/// whisker over the row's spread `[lo, hi]`.
pub fn labelled_bars(title: &str, unit: &str, rows: &[(String, f64, [f64; 2])]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let top = rows
        .iter()
        .map(|(_, m, s)| s[1].max(*m))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    row_bars(title.to_string(), unit, rows, top, 220)
}

/// Horizontal bars, one per `(label, median, [lo, hi])` row, with a whisker over `[lo, hi]`,
/// on an axis up to a little above `top`; `label_width` is the room for the row labels.
fn row_bars(
    caption: String,
    unit: &str,
    rows: &[(String, f64, [f64; 2])],
    top: f64,
    label_width: u32,
) -> Option<String> {
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let height = 70 + 34 * u32::try_from(rows.len()).unwrap_or(10);
    let axis = Axis::auto(
        rows.iter()
            .flat_map(|(_, m, s)| [*m, s[0], s[1]])
            .chain([top]),
    )?;
    let caption = if axis.log {
        format!("{caption}, log scale")
    } else {
        caption
    };
    render(height.max(170), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(caption.as_str(), caption_font())
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(label_width)
            .build_cartesian_2d(axis.coord(), -0.5..rows.len() as f64 - 0.5)?;
        let fmt = |y: &f64| category_label(&names, *y);
        let fx = |x: &f64| axis.label(*x, unit);
        c.configure_mesh()
            .y_labels(rows.len() + 1)
            .y_label_formatter(&fmt)
            .x_label_formatter(&fx)
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_desc("median")
            .disable_y_mesh()
            .draw()?;
        for (i, (_, median, spread)) in rows.iter().enumerate() {
            let y = i as f64;
            c.draw_series(std::iter::once(Rectangle::new(
                [(axis.base(), y - 0.32), (axis.to(*median), y + 0.32)],
                PALETTE[i % PALETTE.len()].filled(),
            )))?;
            c.draw_series(std::iter::once(PathElement::new(
                vec![(axis.to(spread[0]), y), (axis.to(spread[1]), y)],
                BLACK.stroke_width(2),
            )))?;
        }
        Ok(())
    })
}

/// Lifecycle: one representative construction per variant, every ioctl a bar on the time axis,
/// stalls in red.
pub fn timeline(r: &RunRecord) -> Option<String> {
    let vs: Vec<&VariantRecord> = r
        .variants
        .iter()
        .filter(|v| !v.timeline.is_empty())
        .collect();
    if vs.is_empty() {
        return None;
    }
    let end = vs
        .iter()
        .flat_map(|v| v.timeline.iter().map(|e| e.start_ms + e.dur_ms))
        .fold(0.0, f64::max);
    let names: Vec<String> = vs.iter().map(|v| v.name.clone()).collect();
    let height = 70 + 36 * u32::try_from(vs.len()).unwrap_or(10);
    let x_range = span(0.0, (end * 1.05).max(1e-9))?;
    // Milliseconds, or on the instruction clock millions of instructions.
    let unit = r.clock().unit("ms");
    render(height.max(200), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                "construction timeline (median repetition): each ioctl",
                caption_font(),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(150)
            .build_cartesian_2d(x_range.clone(), -0.5..vs.len() as f64 - 0.5)?;
        let fmt = |y: &f64| category_label(&names, *y);
        c.configure_mesh()
            .y_labels(vs.len() + 1)
            .y_label_formatter(&fmt)
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&|x: &f64| crate::analysis::quantity::tick(*x, &unit))
            .x_max_light_lines(2)
            .x_desc("since KVM_CREATE_VM")
            .disable_y_mesh()
            .draw()?;
        // Two series, so the legend names both: work, and the grace-period stalls.
        let (mut work, mut stalls) = (Vec::new(), Vec::new());
        for (i, v) in vs.iter().enumerate() {
            let y = i as f64;
            for (k, e) in v.timeline.iter().enumerate() {
                let rect = [
                    (e.start_ms, y - 0.3),
                    (e.start_ms + e.dur_ms.max(end / 800.0), y + 0.3),
                ];
                if e.stalled {
                    stalls.push(Rectangle::new(rect, STALL.filled()));
                } else {
                    work.push(Rectangle::new(rect, WORK[k % WORK.len()].filled()));
                }
            }
        }
        c.draw_series(work)?
            .label("ioctl (work)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], WORK[0].filled()));
        c.draw_series(stalls)?
            .label("waiting for an SRCU grace period (stall)")
            .legend(|(x, y)| Rectangle::new([(x, y - 6), (x + 16, y + 6)], STALL.filled()));
        c.configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .label_font(label_font())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// Pinning: pinned bytes over time per variant.
pub fn pinned_bytes(r: &RunRecord) -> Option<String> {
    let vs: Vec<&VariantRecord> = r
        .variants
        .iter()
        .filter(|v| !v.pinned_bytes.is_empty())
        .collect();
    if vs.is_empty() {
        return None;
    }
    let end = vs
        .iter()
        .flat_map(|v| v.pinned_bytes.iter().map(|p| p[0]))
        .fold(0.0, f64::max);
    let top = vs
        .iter()
        .flat_map(|v| v.pinned_bytes.iter().map(|p| p[1]))
        .fold(0.0, f64::max)
        / f64::from(1u32 << 20);
    let x_range = span(0.0, end.max(1e-9) * 1.02)?;
    let y_range = span(0.0, (top * 1.15).max(1.0))?;
    let unit = r.clock().unit("ms");
    render(340, |root| {
        let mut c = ChartBuilder::on(root)
            .caption("pinned memory over the trace", caption_font())
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(100)
            .build_cartesian_2d(x_range.clone(), y_range.clone())?;
        c.configure_mesh()
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_label_formatter(&|x: &f64| crate::analysis::quantity::tick(*x, &unit))
            .y_label_formatter(&|y: &f64| crate::analysis::quantity::tick(*y, "MiB"))
            .x_desc("time in the trace")
            .y_desc("pinned")
            .draw()?;
        for (i, v) in vs.iter().enumerate() {
            // A step function: each value holds until the next change.
            let mut pts = Vec::new();
            for w in v.pinned_bytes.windows(2) {
                pts.push((w[0][0], w[0][1] / f64::from(1u32 << 20)));
                pts.push((w[1][0], w[0][1] / f64::from(1u32 << 20)));
            }
            let color = PALETTE[i % PALETTE.len()];
            c.draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                .label(v.name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        c.configure_series_labels()
            .label_font(label_font())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// One line of a sweep chart: a series name and, per x position, the median with its 95% CI
/// (`None` where the point has no value).
pub type SweepSeries = (String, Vec<Option<(f64, [f64; 2])>>);

/// A sweep over one axis: the headline median per point, one line per variant, 95% CI
/// whiskers; the x axis is the axis's values in sweep order (evenly spaced).
pub fn sweep_lines(
    title: &str,
    axis_name: &str,
    xs: &[String],
    series: &[SweepSeries],
    unit: &str,
) -> Option<String> {
    let all: Vec<f64> = series
        .iter()
        .flat_map(|(_, ys)| ys.iter().flatten().flat_map(|(m, ci)| [*m, ci[0], ci[1]]))
        .filter(|v| v.is_finite())
        .collect();
    if all.is_empty() || xs.is_empty() {
        return None;
    }
    let n = xs.len() as f64;
    let axis = Axis::auto(all.iter().copied())?;
    render(380, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(title, caption_font())
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.5..n - 0.5, axis.coord())?;
        let fmt = |x: &f64| category_label(xs, *x);
        let fy = |y: &f64| axis.label(*y, unit);
        c.configure_mesh()
            .x_labels(xs.len().min(40) + 1)
            .x_label_formatter(&fmt)
            .y_label_formatter(&fy)
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_desc(axis_name)
            .y_desc(if axis.log { "log scale" } else { "" })
            .disable_x_mesh()
            .draw()?;
        for (i, (name, ys)) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = ys
                .iter()
                .enumerate()
                .filter_map(|(k, y)| y.map(|(m, _)| (k as f64, axis.to(m))))
                .collect();
            c.draw_series(ys.iter().enumerate().filter_map(|(k, y)| {
                y.map(|(_, ci)| {
                    PathElement::new(
                        vec![(k as f64, axis.to(ci[0])), (k as f64, axis.to(ci[1]))],
                        color.stroke_width(1),
                    )
                })
            }))?;
            c.draw_series(pts.iter().map(|p| Circle::new(*p, 3, color.filled())))?;
            c.draw_series(LineSeries::new(pts, color.stroke_width(2)))?
                .label(name.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 16, y)], color.stroke_width(2))
                });
        }
        c.configure_series_labels()
            .label_font(label_font())
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// Whether a colour scale over `lo..hi` is logarithmic: when the values span more than 20×, so
/// one outlier does not wash out the rest.
fn log_colours(lo: f64, hi: f64) -> bool {
    lo > 0.0 && hi / lo > 20.0
}

/// The colour of `v` on a white-to-blue-to-red scale between `lo` and `hi` (logarithmic when
/// [`log_colours`]).
fn heat(v: f64, lo: f64, hi: f64) -> RGBColor {
    let t = if log_colours(lo, hi) {
        (v / lo).ln() / (hi / lo).ln()
    } else if hi > lo {
        (v - lo) / (hi - lo)
    } else {
        0.5
    };
    let t = t.clamp(0.0, 1.0);
    // 0 → pale blue, 0.5 → yellow, 1 → red: a sequential scale readable in grey too.
    let stops = [
        (222.0, 235.0, 247.0),
        (254.0, 217.0, 118.0),
        (203.0, 24.0, 29.0),
    ];
    let (a, b, u) = if t < 0.5 {
        (stops[0], stops[1], t * 2.0)
    } else {
        (stops[1], stops[2], (t - 0.5) * 2.0)
    };
    let mix = |x: f64, y: f64| {
        let c = (x + (y - x) * u).round().clamp(0.0, 255.0);
        // Rounded and clamped to 0..=255 above.
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let c = c as u8;
        c
    };
    RGBColor(mix(a.0, b.0), mix(a.1, b.1), mix(a.2, b.2))
}

/// A sweep over two axes: one cell per point coloured by its headline median on the scale
/// `lo..hi` that every heatmap of the page shares (its colour bar is [`colour_bar`]), the
/// value written in the cell when the grid is small enough to read it. `cells[y][x]`.
pub fn heatmap(
    title: &str,
    (x_axis, xs): (&str, &[String]),
    (y_axis, ys): (&str, &[String]),
    cells: &[Vec<Option<f64>>],
    (unit, lo, hi): (&str, f64, f64),
) -> Option<String> {
    let any = cells.iter().flatten().flatten().any(|v| v.is_finite());
    if !any || xs.is_empty() || ys.is_empty() {
        return None;
    }
    // The colour scale spans lo..hi (logarithmic over a wide span): it needs a finite range.
    span(lo, hi)?;
    let (nx, ny) = (xs.len() as f64, ys.len() as f64);
    let height = (100 + 30 * u32::try_from(ys.len()).unwrap_or(40)).clamp(230, 900);
    let label_cells = xs.len() <= 12 && ys.len() <= 30;
    render(height, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(title, caption_font())
            .margin(12)
            .x_label_area_size(56)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.5..nx - 0.5, -0.5..ny - 0.5)?;
        let fx = |x: &f64| category_label(xs, *x);
        let fy = |y: &f64| category_label(ys, *y);
        c.configure_mesh()
            .x_labels(xs.len().min(40) + 1)
            .y_labels(ys.len().min(40) + 1)
            .x_label_formatter(&fx)
            .y_label_formatter(&fy)
            .label_style(label_font())
            .axis_desc_style(label_font())
            .x_desc(x_axis)
            .y_desc(y_axis)
            .disable_mesh()
            .draw()?;
        for (yi, row) in cells.iter().enumerate() {
            for (xi, v) in row.iter().enumerate() {
                let (x, y) = (xi as f64, yi as f64);
                let color = v.map_or(RGBColor(200, 200, 200), |v| heat(v, lo, hi));
                c.draw_series(std::iter::once(Rectangle::new(
                    [(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)],
                    color.filled(),
                )))?;
                if let (Some(v), true) = (v, label_cells) {
                    c.draw_series(std::iter::once(Text::new(
                        crate::analysis::quantity::tick(*v, unit),
                        (x, y),
                        label_font()
                            .into_font()
                            .color(&BLACK)
                            .pos(Pos::new(HPos::Center, VPos::Center)),
                    )))?;
                }
            }
        }
        Ok(())
    })
}

/// The colour bar of a page's heatmaps: the shared scale `lo..hi` as a gradient with its
/// ticks (a log axis when the colours are logarithmic).
pub fn colour_bar(unit: &str, lo: f64, hi: f64) -> Option<String> {
    span(lo, hi)?;
    let log = log_colours(lo, hi);
    let axis = if log {
        Axis::log(lo, hi)?
    } else if hi > lo {
        Axis::linear(lo, hi)?
    } else {
        Axis::linear(
            lo - 0.5_f64.max(lo.abs() * 0.1),
            hi + 0.5_f64.max(hi.abs() * 0.1),
        )?
    };
    render(130, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                format!(
                    "colour scale of every heatmap on this page: {} (pale) to {} (red){}",
                    crate::analysis::quantity::format(lo, unit),
                    crate::analysis::quantity::format(hi, unit),
                    if log { ", logarithmic" } else { "" }
                ),
                label_font(),
            )
            .margin(12)
            .x_label_area_size(40)
            .y_label_area_size(20)
            .build_cartesian_2d(axis.coord(), 0.0..1.0)?;
        let fx = |x: &f64| axis.label(*x, unit);
        c.configure_mesh()
            .x_label_formatter(&fx)
            .label_style(label_font())
            .disable_y_axis()
            .disable_mesh()
            .draw()?;
        let (a, b) = (axis.range.start, axis.range.end);
        let steps = 120;
        c.draw_series((0..steps).map(|i| {
            let x0 = a + (b - a) * f64::from(i) / f64::from(steps);
            let x1 = a + (b - a) * f64::from(i + 1) / f64::from(steps);
            let v = axis.value((x0 + x1) / 2.0);
            Rectangle::new([(x0, 0.0), (x1, 1.0)], heat(v, lo, hi).filled())
        }))?;
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_log_axis_labels_every_decade_once_and_draws_minor_lines_between() {
        // 2.3 µs to 65,536 µs: every decade from 10 to 10,000 µs labelled, each once.
        let axis = Axis::log(2.3, 65_536.0).unwrap();
        let labels: Vec<String> = axis.bold.iter().map(|a| axis.label(*a, "us")).collect();
        assert_eq!(labels, ["10 µs", "100 µs", "1 ms", "10 ms"]);
        assert!(axis.light.len() >= 30, "minor lines: {:?}", axis.light);
        // Under two decades, 2 and 5 are labelled too, so no value sits below every label.
        let narrow = Axis::log(2.3, 50.0).unwrap();
        let labels: Vec<String> = narrow.bold.iter().map(|a| narrow.label(*a, "ns")).collect();
        assert_eq!(labels, ["5 ns", "10 ns", "20 ns", "50 ns"]);
        // 128 beside 65,536 goes on a log axis; 2 beside 3 does not.
        assert!(Axis::auto([128.0, 65_536.0]).unwrap().log);
        assert!(!Axis::auto([2.0, 3.0]).unwrap().log);
        let lin = Axis::linear(0.0, 7.3).unwrap();
        assert_eq!(lin.bold, [0.0, 2.0, 4.0, 6.0]);
    }

    #[test]
    fn heat_runs_pale_to_red_and_goes_logarithmic_over_a_wide_span() {
        assert_eq!(heat(1.0, 1.0, 3.0), RGBColor(222, 235, 247));
        assert_eq!(heat(3.0, 1.0, 3.0), RGBColor(203, 24, 29));
        assert_eq!(heat(2.0, 1.0, 3.0), RGBColor(254, 217, 118));
        // 1..1000: 10 sits a third of the way on a log scale, near the bottom on a linear one.
        let mid = heat(10.0, 1.0, 1000.0);
        assert!(mid.0 > 240, "{mid:?}");
    }

    #[test]
    fn sweep_charts_draw_cells_and_lines_and_refuse_empty_data() {
        let xs: Vec<String> = ["1", "2", "4"].map(String::from).to_vec();
        let ys: Vec<String> = ["0", "8"].map(String::from).to_vec();
        let cells = vec![
            vec![Some(1.0), Some(2.0), None],
            vec![Some(4.0), Some(8.0), Some(16.0)],
        ];
        let svg = heatmap(
            "ready_ms",
            ("vcpus", &xs),
            ("devices", &ys),
            &cells,
            ("ms", 1.0, 16.0),
        )
        .unwrap();
        assert_eq!(svg.matches("<rect").count() - 1, 6, "one cell per point");
        assert!(
            svg.contains(">\n16 ms\n<") && svg.contains(">\nvcpus\n<"),
            "{svg}"
        );
        assert!(heatmap("t", ("x", &xs), ("y", &ys), &[vec![None]], ("ms", 1.0, 2.0)).is_none());
        let bar = colour_bar("ms", 1.04, 20.7).unwrap();
        assert!(bar.matches("<rect").count() > 100, "a gradient");
        assert!(bar.contains("1.04 ms (pale) to 20.7 ms (red)"), "{bar}");
        let series = vec![(
            "a".to_string(),
            vec![Some((1.0, [0.9, 1.1])), None, Some((3.0, [2.5, 3.5]))],
        )];
        let svg = sweep_lines("ready_ms", "vcpus", &xs, &series, "ms").unwrap();
        assert!(
            svg.contains("<polyline") && svg.contains(">\na\n<"),
            "{svg}"
        );
        assert!(
            sweep_lines("t", "x", &xs, &[("a".into(), vec![None, None, None])], "ms").is_none()
        );
    }
}
