//! A sweep's HTML page: the headline median per grid point as lines or heatmaps, and a table
//! of every point. Self-contained, like the run report.

use askama::Template;

use super::Figure;
use crate::analysis::quantity::format_range;
use crate::export::sweep::SweepView;
use crate::export::words::fmt_value;

#[derive(Template)]
#[template(path = "sweep.html")]
struct SweepPage {
    id: String,
    intro: String,
    colour_bar: Option<String>,
    charts: Vec<Figure>,
    axes: Vec<String>,
    metric: String,
    rows: Vec<PointRow>,
}

/// A point of the sweep and one variant's headline there.
struct PointRow {
    values: Vec<String>,
    variant: String,
    median: String,
    ci: String,
    range: String,
    n: usize,
}

/// The HTML page of a sweep: self-contained, like the run report.
pub fn page(view: &SweepView) -> askama::Result<String> {
    let page = SweepPage {
        id: view.id.clone(),
        intro: format!(
            "{} on {}: {} points over {}; variants {}. Each value is the median of {} at one point with its 95% bootstrap CI and range.",
            view.scenario,
            view.backend,
            view.points(),
            view.axes
                .iter()
                .map(|(k, vs)| format!("{k} ({})", vs.join(", ")))
                .collect::<Vec<_>>()
                .join(" × "),
            view.variants.join(", "),
            view.metric
        ),
        colour_bar: view.colour_bar(),
        charts: Figure::all(view.charts()),
        axes: view.axes.iter().map(|(k, _)| k.clone()).collect(),
        metric: view.metric.clone(),
        rows: view
            .cells
            .iter()
            .map(|(values, variant, m)| PointRow {
                values: values.clone(),
                variant: variant.clone(),
                median: fmt_value(m.median, &m.unit),
                ci: format_range(m.ci95[0], m.ci95[1], &m.unit),
                range: format_range(m.min, m.max, &m.unit),
                n: m.n,
            })
            .collect(),
    };
    Ok(page.render()? + "\n")
}
