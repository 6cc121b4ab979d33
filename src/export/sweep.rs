//! A sweep as the formats show it: the headline metric's median per grid point, drawn as lines
//! (one axis) or heatmaps (two axes; one per value of any further axis), and a table of every
//! point (the HTML page is `html::sweep_page`, the Markdown `markdown::sweep_summary`).

use super::html::charts::{self, SweepSeries};
use super::param_value;
use crate::lab::sweep::VARIANT_AXIS;
use crate::record::{MetricRecord, RunRecord};

/// Heatmaps beyond this many (three or more axes) are left to the table.
const MAX_CHARTS: usize = 24;

/// A sweep's points as a table: axes, their values in sweep order, and per point and variant
/// the headline metric.
#[derive(Debug, Clone)]
pub struct SweepView {
    /// The sweep's id.
    pub id: String,
    /// Scenario.
    pub scenario: String,
    /// Backend (and profile).
    pub backend: String,
    /// The headline metric.
    pub metric: String,
    /// The axes other than `variant`, each with its values in sweep order.
    pub axes: Vec<(String, Vec<String>)>,
    /// Variants, in order of first appearance.
    pub variants: Vec<String>,
    /// One row per (point, variant): the point's axis values (in `axes` order) and the metric.
    pub cells: Vec<(Vec<String>, String, MetricRecord)>,
}

fn param_text(r: &RunRecord, key: &str) -> String {
    r.params.get(key).map_or_else(String::new, param_value)
}

impl SweepView {
    /// The view of `records`, all of sweep `id`; `None` when there is nothing to show. A point
    /// stored twice (a shard rerun) counts once: the run that finished last.
    pub fn of(id: &str, records: &[RunRecord]) -> Option<SweepView> {
        let mut records: Vec<&RunRecord> = records
            .iter()
            .filter(|r| r.params.get("sweep").and_then(|v| v.as_str()) == Some(id))
            .collect();
        let first = *records.first()?;
        let metric = crate::scenario::find(&first.scenario)
            .ok()?
            .headline
            .to_string();
        let point = |r: &RunRecord| {
            r.params
                .get("sweep_point")
                .and_then(serde_json::Value::as_u64)
        };
        records.sort_by(|a, b| {
            (point(a), &a.finished_at, &a.run_id).cmp(&(point(b), &b.finished_at, &b.run_id))
        });
        // The last of each point wins.
        let mut latest: Vec<&RunRecord> = Vec::new();
        for r in records {
            match latest.last_mut() {
                Some(prev) if point(prev) == point(r) => *prev = r,
                _ => latest.push(r),
            }
        }
        let keys: Vec<String> = param_text(first, "sweep_grid")
            .split(',')
            // Variants are series, not axes.
            .filter(|k| !k.is_empty() && *k != VARIANT_AXIS)
            .map(String::from)
            .collect();
        let mut axes: Vec<(String, Vec<String>)> =
            keys.iter().map(|k| (k.clone(), Vec::new())).collect();
        let mut variants: Vec<String> = Vec::new();
        let mut cells = Vec::new();
        for r in &latest {
            let values: Vec<String> = keys.iter().map(|k| param_text(r, k)).collect();
            for ((_, seen), v) in axes.iter_mut().zip(&values) {
                if !seen.contains(v) {
                    seen.push(v.clone());
                }
            }
            for v in r.variants.iter().filter(|v| v.is_ok()) {
                let Some(m) = v.metrics.get(&metric) else {
                    continue;
                };
                if !variants.contains(&v.name) {
                    variants.push(v.name.clone());
                }
                cells.push((values.clone(), v.name.clone(), m.clone()));
            }
        }
        Some(SweepView {
            id: id.to_string(),
            scenario: first.scenario.clone(),
            backend: match &first.profile {
                Some(p) => format!("{} (profile {p})", first.backend),
                None => first.backend.to_string(),
            },
            metric,
            axes,
            variants,
            cells,
        })
    }

    fn unit(&self) -> String {
        self.cells
            .first()
            .map_or_else(String::new, |(_, _, m)| m.unit.clone())
    }

    fn find(&self, values: &[&str], variant: &str) -> Option<&MetricRecord> {
        self.cells
            .iter()
            .find(|(vs, name, _)| {
                name == variant && vs.iter().map(String::as_str).eq(values.iter().copied())
            })
            .map(|(_, _, m)| m)
    }

    /// The charts, (caption, SVG): lines over one axis, heatmaps of the first two axes
    /// otherwise (one per variant and per combination of further axes).
    pub fn charts(&self) -> Vec<(String, String)> {
        let unit = self.unit();
        let mut out = Vec::new();
        match self.axes.as_slice() {
            [] => {}
            [(axis, xs)] => {
                let series: Vec<SweepSeries> = self
                    .variants
                    .iter()
                    .map(|v| {
                        let ys = xs
                            .iter()
                            .map(|x| self.find(&[x], v).map(|m| (m.median, m.ci95)))
                            .collect();
                        (v.clone(), ys)
                    })
                    .collect();
                let title = format!("{} median by {axis}, 95% CI", self.metric);
                if let Some(svg) = charts::sweep_lines(&title, axis, xs, &series, &unit) {
                    out.push((title, svg));
                }
            }
            [(xa, xs), (ya, ys), rest @ ..] => {
                // One colour scale for every heatmap of the page, so the same colour is the
                // same value everywhere; the page draws its colour bar once.
                let Some((lo, hi)) = self.colour_range() else {
                    return out;
                };
                // Every combination of the further axes, first slowest.
                let mut combos: Vec<Vec<String>> = vec![Vec::new()];
                for (_, values) in rest {
                    combos = combos
                        .into_iter()
                        .flat_map(|c| {
                            values.iter().map(move |v| {
                                let mut c = c.clone();
                                c.push(v.clone());
                                c
                            })
                        })
                        .collect();
                }
                'all: for variant in &self.variants {
                    for combo in &combos {
                        if out.len() == MAX_CHARTS {
                            break 'all;
                        }
                        let cells: Vec<Vec<Option<f64>>> = ys
                            .iter()
                            .map(|y| {
                                xs.iter()
                                    .map(|x| {
                                        let mut key = vec![x.as_str(), y.as_str()];
                                        key.extend(combo.iter().map(String::as_str));
                                        self.find(&key, variant).map(|m| m.median)
                                    })
                                    .collect()
                            })
                            .collect();
                        let fixed: String = rest
                            .iter()
                            .zip(combo)
                            .map(|((k, _), v)| format!(", {k}={v}"))
                            .collect();
                        let title = format!("{} median, {variant}{fixed}", self.metric);
                        if let Some(svg) =
                            charts::heatmap(&title, (xa, xs), (ya, ys), &cells, (&unit, lo, hi))
                        {
                            out.push((title, svg));
                        }
                    }
                }
            }
        }
        out
    }

    /// The smallest and largest median of the page: the shared colour scale.
    fn colour_range(&self) -> Option<(f64, f64)> {
        let medians = self
            .cells
            .iter()
            .map(|(_, _, m)| m.median)
            .filter(|v| v.is_finite());
        let (lo, hi) = medians.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), v| {
            (a.min(v), b.max(v))
        });
        (lo <= hi).then_some((lo, hi))
    }

    /// The colour bar of the page's heatmaps, when it has any (two axes or more).
    pub fn colour_bar(&self) -> Option<String> {
        if self.axes.len() < 2 {
            return None;
        }
        let (lo, hi) = self.colour_range()?;
        charts::colour_bar(&self.unit(), lo, hi)
    }

    pub(crate) fn points(&self) -> usize {
        let mut seen: Vec<&Vec<String>> = self.cells.iter().map(|(v, _, _)| v).collect();
        seen.dedup();
        seen.len()
    }
}
