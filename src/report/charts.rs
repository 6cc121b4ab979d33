//! SVG charts with plotters (SVG backend, no font files: the browser renders the text).

use plotters::coord::Shift;
use plotters::prelude::*;

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
        if lo > 0.0 && hi / lo > 20.0 {
            strips!((lo * 0.8..hi * 1.25).log_scale(), log_tick);
        } else {
            let pad = ((hi - lo) * 0.1).max(hi.abs() * 0.05).max(1e-9);
            strips!((lo - pad).min(0.0)..hi + pad, |y: &f64| linear_tick(*y));
        }
        Ok(())
    })
}

/// Medians of `metric` per variant as bars with 95% CI whiskers.
pub fn bars(r: &RunRecord, metric: &str, title: &str) -> Option<String> {
    let vs = ok_with(r, metric);
    if vs.is_empty() {
        return None;
    }
    let unit = vs[0].metrics[metric].unit.clone();
    let hi = vs
        .iter()
        .map(|v| v.metrics[metric].ci95[1].max(v.metrics[metric].median))
        .fold(0.0, f64::max);
    let names: Vec<String> = vs.iter().map(|v| v.name.clone()).collect();
    let height = 60 + 34 * u32::try_from(vs.len()).unwrap_or(10);
    render(height.max(160), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                format!("{title} ({unit}), median with 95% CI"),
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(150)
            .build_cartesian_2d(0.0..(hi * 1.15).max(1e-9), -0.5..vs.len() as f64 - 0.5)?;
        let fmt = |y: &f64| category_label(&names, *y);
        c.configure_mesh()
            .y_labels(vs.len() + 1)
            .y_label_formatter(&fmt)
            .x_desc(unit.as_str())
            .disable_y_mesh()
            .draw()?;
        for (i, v) in vs.iter().enumerate() {
            let m = &v.metrics[metric];
            let y = i as f64;
            c.draw_series(std::iter::once(Rectangle::new(
                [(0.0, y - 0.32), (m.median, y + 0.32)],
                PALETTE[i % PALETTE.len()].filled(),
            )))?;
            c.draw_series(std::iter::once(PathElement::new(
                vec![(m.ci95[0], y), (m.ci95[1], y)],
                BLACK.stroke_width(2),
            )))?;
        }
        Ok(())
    })
}

/// One bar per labelled row (the fleet page: a variant's headline median per host), with a
/// whisker over the row's spread `[lo, hi]`.
pub fn labelled_bars(title: &str, unit: &str, rows: &[(String, f64, [f64; 2])]) -> Option<String> {
    if rows.is_empty() {
        return None;
    }
    let hi = rows
        .iter()
        .map(|(_, m, s)| s[1].max(*m))
        .filter(|x| x.is_finite())
        .fold(0.0, f64::max);
    let names: Vec<String> = rows.iter().map(|r| r.0.clone()).collect();
    let height = 60 + 34 * u32::try_from(rows.len()).unwrap_or(10);
    render(height.max(160), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(format!("{title} ({unit})"), ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(220)
            .build_cartesian_2d(0.0..(hi * 1.15).max(1e-9), -0.5..rows.len() as f64 - 0.5)?;
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
    render(height.max(180), |root| {
        let mut c = ChartBuilder::on(root)
            .caption(
                "construction timeline (median repetition): each ioctl, grace-period stalls in red",
                ("sans-serif", 16),
            )
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(150)
            .build_cartesian_2d(0.0..end * 1.05, -0.5..vs.len() as f64 - 0.5)?;
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
    render(340, |root| {
        let mut c = ChartBuilder::on(root)
            .caption("pinned memory over the trace (MiB)", ("sans-serif", 16))
            .margin(12)
            .x_label_area_size(36)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..end.max(1e-9) * 1.02, 0.0..(top * 1.15).max(1.0))?;
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
}
