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

/// A log axis's label: only at 1, 2 and 5 times a power of ten. Plotters puts a key point at
/// every integer multiple, so 9 and 10 (or 90 and 100) would print over each other.
fn log_tick(v: &f64) -> String {
    if !(v.is_finite() && *v > 0.0) {
        return String::new();
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    if [1.0, 2.0, 5.0, 10.0]
        .iter()
        .any(|k| (mantissa - k).abs() < 1e-6)
    {
        linear_tick(*v)
    } else {
        String::new()
    }
}

/// A linear axis's label: no trailing zeros, no binary noise.
fn linear_tick(v: f64) -> String {
    let s = format!("{v:.6}");
    let s = s.trim_end_matches('0').trim_end_matches('.');
    if s == "-0" {
        "0".to_string()
    } else {
        s.to_string()
    }
}

/// Every sample of `metric` per variant as points, the median as a bar; log scale when the
/// variants span more than 20×.
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
    let (lo, hi) = all
        .iter()
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
            (a.min(*x), b.max(*x))
        });
    let names: Vec<String> = vs.iter().map(|v| v.name.clone()).collect();
    let n = vs.len() as f64;
    // A log axis only over magnitudes plotters can tick: a subnormal or tiny lower end gives
    // hundreds of decades (an imported record can carry any value).
    let log = lo >= 1e-30 && hi / lo > 20.0 && hi / lo < 1e30;
    let y_range = if log {
        span(lo * 0.8, hi * 1.25)?
    } else {
        let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.05).max(1e-9);
        span((lo - pad).min(0.0), hi + pad)?
    };
    render(340, |root| {
        let caption = format!("{metric} per repetition ({unit}), median marked");
        let mut b = ChartBuilder::on(root);
        b.caption(caption, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(70)
            .y_label_area_size(70);
        let fmt = |x: &f64| category_label(&names, *x);
        let points = |v: &VariantRecord, i: usize| -> Vec<Circle<(f64, f64), u32>> {
            let s = &v.metrics[metric].samples;
            s.iter()
                .enumerate()
                .filter(|(_, y)| y.is_finite())
                .map(|(k, y)| {
                    let jitter = (k as f64 / s.len().max(1) as f64 - 0.5) * 0.4;
                    Circle::new(
                        (i as f64 + jitter, *y),
                        3,
                        PALETTE[i % PALETTE.len()].mix(0.6).filled(),
                    )
                })
                .collect()
        };
        // The same strips on either axis; the two coordinate types share no trait object.
        macro_rules! strips {
            ($y:expr, $y_fmt:expr) => {{
                let mut c = b.build_cartesian_2d(-0.5..n - 0.5, $y)?;
                c.configure_mesh()
                    .x_labels(vs.len() + 1)
                    .x_label_formatter(&fmt)
                    .y_label_formatter(&$y_fmt)
                    .y_desc(unit.as_str())
                    .disable_x_mesh()
                    .draw()?;
                for (i, v) in vs.iter().enumerate() {
                    c.draw_series(points(v, i))?;
                    let m = v.metrics[metric].median;
                    c.draw_series(std::iter::once(PathElement::new(
                        vec![(i as f64 - 0.3, m), (i as f64 + 0.3, m)],
                        BLACK.stroke_width(2),
                    )))?;
                }
            }};
        }
        if log {
            strips!(y_range.clone().log_scale(), log_tick);
        } else {
            strips!(y_range.clone(), |y: &f64| linear_tick(*y));
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
        format!("{title} ({unit}), median with 95% CI"),
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
    row_bars(format!("{title} ({unit})"), unit, rows, top, 220)
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
    let height = 60 + 34 * u32::try_from(rows.len()).unwrap_or(10);
    let x_range = span(0.0, (top * 1.15).max(1e-9))?;
    render(height.max(160), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(caption.as_str(), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(label_width)
            .build_cartesian_2d(x_range.clone(), -0.5..rows.len() as f64 - 0.5)?;
        let fmt = |y: &f64| category_label(&names, *y);
        c.configure_mesh()
            .y_labels(rows.len() + 1)
            .y_label_formatter(&fmt)
            .x_desc(unit)
            .disable_y_mesh()
            .draw()?;
        for (i, (_, median, spread)) in rows.iter().enumerate() {
            let y = i as f64;
            c.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.32), (*median, y + 0.32)],
                PALETTE[i % PALETTE.len()].filled(),
            )))?;
            c.draw_series(std::iter::once(PathElement::new(
                vec![(spread[0], y), (spread[1], y)],
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
    render(height.max(180), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                "construction timeline (median repetition): each ioctl, grace-period stalls in red",
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(150)
            .build_cartesian_2d(x_range.clone(), -0.5..vs.len() as f64 - 0.5)?;
        let fmt = |y: &f64| category_label(&names, *y);
        c.configure_mesh()
            .y_labels(vs.len() + 1)
            .y_label_formatter(&fmt)
            .x_desc("ms since KVM_CREATE_VM")
            .disable_y_mesh()
            .draw()?;
        for (i, v) in vs.iter().enumerate() {
            let y = i as f64;
            c.draw_series(v.timeline.iter().enumerate().map(|(k, e)| {
                let color = if e.stalled {
                    STALL
                } else {
                    PALETTE[k % PALETTE.len()]
                };
                Rectangle::new(
                    [
                        (e.start_ms, y - 0.3),
                        (e.start_ms + e.dur_ms.max(end / 800.0), y + 0.3),
                    ],
                    color.filled(),
                )
            }))?;
        }
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
    render(340, |root| {
        let mut c = ChartBuilder::on(root)
            .caption("pinned memory over the trace (MiB)", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(x_range.clone(), y_range.clone())?;
        c.configure_mesh().x_desc("ms").y_desc("MiB").draw()?;
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
    axis: &str,
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
    let hi = all.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let lo = all.iter().copied().fold(f64::INFINITY, f64::min).min(0.0);
    let n = xs.len() as f64;
    let y_range = span(lo, (hi * 1.1).max(lo + 1e-9))?;
    render(360, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(title, ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(70)
            .build_cartesian_2d(-0.5..n - 0.5, y_range.clone())?;
        let fmt = |x: &f64| category_label(xs, *x);
        c.configure_mesh()
            .x_labels(xs.len().min(40) + 1)
            .x_label_formatter(&fmt)
            .y_label_formatter(&|y: &f64| linear_tick(*y))
            .x_desc(axis)
            .y_desc(unit)
            .disable_x_mesh()
            .draw()?;
        for (i, (name, ys)) in series.iter().enumerate() {
            let color = PALETTE[i % PALETTE.len()];
            let pts: Vec<(f64, f64)> = ys
                .iter()
                .enumerate()
                .filter_map(|(k, y)| y.map(|(m, _)| (k as f64, m)))
                .collect();
            c.draw_series(ys.iter().enumerate().filter_map(|(k, y)| {
                y.map(|(_, ci)| {
                    PathElement::new(
                        vec![(k as f64, ci[0]), (k as f64, ci[1])],
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
            .background_style(WHITE.mix(0.9))
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })
}

/// The colour of `v` on a white-to-blue-to-red scale between `lo` and `hi` (logarithmic when
/// the values span more than 20×, so one outlier does not wash out the rest).
fn heat(v: f64, lo: f64, hi: f64) -> RGBColor {
    let t = if lo > 0.0 && hi / lo > 20.0 {
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

/// A sweep over two axes: one cell per point coloured by its headline median, the value
/// written in the cell (when the grid is small enough to read it). `cells[y][x]`.
pub fn heatmap(
    title: &str,
    (x_axis, xs): (&str, &[String]),
    (y_axis, ys): (&str, &[String]),
    cells: &[Vec<Option<f64>>],
    unit: &str,
) -> Option<String> {
    let values: Vec<f64> = cells
        .iter()
        .flatten()
        .flatten()
        .copied()
        .filter(|v| v.is_finite())
        .collect();
    if values.is_empty() || xs.is_empty() || ys.is_empty() {
        return None;
    }
    let lo = values.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    // The colour scale spans lo..hi (logarithmic over a wide span): it needs a finite range.
    span(lo, hi)?;
    let (nx, ny) = (xs.len() as f64, ys.len() as f64);
    let height = (90 + 28 * u32::try_from(ys.len()).unwrap_or(40)).clamp(220, 900);
    let label_cells = xs.len() <= 16 && ys.len() <= 30;
    render(height, |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                format!(
                    "{title} ({unit}; pale = low, red = high: {} to {})",
                    linear_tick(lo),
                    linear_tick(hi)
                ),
                ("sans-serif", 15),
            )
            .margin(12)
            .x_label_area_size(50)
            .y_label_area_size(90)
            .build_cartesian_2d(-0.5..nx - 0.5, -0.5..ny - 0.5)?;
        let fx = |x: &f64| category_label(xs, *x);
        let fy = |y: &f64| category_label(ys, *y);
        c.configure_mesh()
            .x_labels(xs.len().min(40) + 1)
            .y_labels(ys.len().min(40) + 1)
            .x_label_formatter(&fx)
            .y_label_formatter(&fy)
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
                        format!("{:.3}", v)
                            .trim_end_matches('0')
                            .trim_end_matches('.')
                            .to_string(),
                        (x, y),
                        ("sans-serif", 11)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_axis_labels_only_one_two_five_so_neighbours_never_collide() {
        assert_eq!(log_tick(&10.0), "10");
        assert_eq!(log_tick(&9.0), "");
        assert_eq!(log_tick(&20.0), "20");
        assert_eq!(log_tick(&0.5), "0.5");
        assert_eq!(log_tick(&90.0), "");
        assert_eq!(log_tick(&100.0), "100");
        assert_eq!(linear_tick(2.50), "2.5");
        assert_eq!(linear_tick(0.30000000000000004), "0.3");
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
        let svg = heatmap("ready_ms", ("vcpus", &xs), ("devices", &ys), &cells, "ms").unwrap();
        assert_eq!(svg.matches("<rect").count() - 1, 6, "one cell per point");
        assert!(
            svg.contains(">\n16\n<") && svg.contains(">\nvcpus\n<"),
            "{svg}"
        );
        assert!(heatmap("t", ("x", &xs), ("y", &ys), &[vec![None]], "ms").is_none());
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
