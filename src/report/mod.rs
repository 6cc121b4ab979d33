//! Reports: one self-contained HTML page (inline CSS and SVG, no scripts, no external
//! references) and a Markdown summary, from stored run records. The HTML goes through askama
//! templates (`templates/`), which escape every value; [`escape`] keeps what no template engine
//! does: terminal text and Markdown.

mod charts;
pub mod escape;
mod fleet;
mod html;
mod markdown;
mod style;
mod sweep;
pub mod words;

use std::path::{Path, PathBuf};

use crate::lab::fidelity::ThreadReport;
use crate::record::RunRecord;
use crate::scenario::Chart;
pub use sweep::SweepView;

/// The charts of one run, in reading order: (caption, SVG). Every run opens with the
/// distribution of its headline metric; its scenario names the rest.
pub fn charts_for(r: &RunRecord) -> Vec<(String, String)> {
    let Ok(scenario) = crate::scenario::Kind::named(&r.scenario) else {
        return Vec::new();
    };
    let headline = scenario.info().headline;
    let mut out = Vec::new();
    let mut add = |title: &str, svg: Option<String>| {
        if let Some(svg) = svg {
            out.push((title.to_string(), svg));
        }
    };
    add("distribution", charts::distribution(r, headline));
    for chart in scenario.charts(r) {
        match chart {
            Chart::Timeline => add("timeline", charts::timeline(r)),
            Chart::Bars { metric, title } => add(title, charts::bars(r, metric, title)),
            Chart::PinnedBytes => add("pinned bytes", charts::pinned_bytes(r)),
        }
    }
    out
}

/// Writes `index.html` (summary first), `summary.md` and the fleet page `fleet.html` (the
/// `fleet` runs grouped by host) into `dir`; returns the index's path. `fidelity`, when given,
/// is the model against the kernel threads: its headline is linked from the index, its table
/// is a page of its own (`fidelity.html`). Written as [`publish`] writes.
pub fn write(
    records: &[RunRecord],
    fidelity: &[ThreadReport],
    fleet: &[RunRecord],
    dir: &Path,
) -> std::io::Result<PathBuf> {
    let mut files = vec![
        (
            "index.html",
            html::page(records, fidelity).map_err(rendering)?,
        ),
        (fleet::FILE, fleet::page(fleet).map_err(rendering)?),
        ("summary.md", markdown::summary(records, fidelity)),
    ];
    if !fidelity.is_empty() {
        files.push((
            html::FIDELITY_FILE,
            html::fidelity_page(fidelity).map_err(rendering)?,
        ));
    }
    publish(dir, &files)?;
    Ok(dir.join("index.html"))
}

/// Writes a sweep's `index.html` and `summary.md` into `dir`; returns the HTML path.
pub fn write_sweep(view: &SweepView, dir: &Path) -> std::io::Result<PathBuf> {
    publish(
        dir,
        &[
            ("index.html", sweep::page(view).map_err(rendering)?),
            ("summary.md", sweep::summary(view)),
        ],
    )?;
    Ok(dir.join("index.html"))
}

/// A template that failed to render (askama fails only when writing a value fails).
fn rendering(e: askama::Error) -> std::io::Error {
    std::io::Error::other(format!("cannot render the report page: {e}"))
}

/// Puts `files` (name, content) into `dir` so that no failure leaves a truncated page or loses
/// the previous report: every file is written and synced in a fresh staging directory inside
/// `dir` (same file system), and only then renamed into place. Only regular files are
/// replaced: a symlink (followed, it would overwrite its target elsewhere), a FIFO or a device
/// at one of the names is refused before anything is written.
pub fn publish(dir: &Path, files: &[(&str, String)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, _) in files {
        let path = dir.join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(meta) if !meta.is_file() => {
                let what = if meta.file_type().is_symlink() {
                    "a symbolic link"
                } else if meta.is_dir() {
                    "a directory"
                } else {
                    "not a regular file"
                };
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!(
                        "{} is {what}: hvlab replaces only its own regular files there; remove it or choose another directory",
                        path.display()
                    ),
                ));
            }
            _ => {}
        }
    }
    let staging = tempfile::Builder::new()
        .prefix(".hvlab-report-")
        .tempdir_in(dir)?;
    for (name, content) in files {
        let path = staging.path().join(name);
        let mut file = std::fs::File::create(&path)?;
        std::io::Write::write_all(&mut file, content.as_bytes())?;
        file.sync_all()?;
    }
    for (name, _) in files {
        std::fs::rename(staging.path().join(name), dir.join(name))?;
    }
    // The staging directory, now empty, goes with `staging`.
    Ok(())
}

#[cfg(test)]
mod escaping {
    //! Every HTML page of the report against hostile text in every field a record or a sweep
    //! can carry (ids, names, parameters, hosts, profiles, fidelity setups): askama escapes it,
    //! so the page's markup is the markup it has with harmless text of the same length, and the
    //! text reads back whole.
    #![allow(clippy::unwrap_used)]

    use std::collections::BTreeMap;
    use std::sync::OnceLock;

    use crate::record::{MetricRecord, RunRecord, TimelineEvent, VariantRecord, VariantStatus};

    fn metric(unit: &str, samples: &[f64]) -> MetricRecord {
        MetricRecord {
            unit: unit.into(),
            median: samples[samples.len() / 2],
            ci95: [samples[0], samples[samples.len() - 1]],
            min: samples[0],
            max: samples[samples.len() - 1],
            n: samples.len(),
            samples: samples.to_vec(),
        }
    }

    fn variant(name: String, text: &str, scale: f64) -> VariantRecord {
        let samples: Vec<f64> = [1.0, 1.1, 1.2, 1.3, 1.5]
            .iter()
            .map(|v| v * scale)
            .collect();
        let mut metrics = BTreeMap::new();
        metrics.insert("ready_ms".to_string(), metric("ms", &samples));
        metrics.insert(format!("m-{text}"), metric("ns", &samples));
        metrics.insert(format!("kvm.{text}"), metric("count", &samples));
        VariantRecord {
            name,
            status: VariantStatus::Ok,
            metrics,
            findings: Vec::new(),
            timeline: vec![
                TimelineEvent {
                    ioctl: format!("io-{text}"),
                    start_ms: 0.0,
                    dur_ms: 1.0,
                    stalled: false,
                },
                TimelineEvent {
                    ioctl: "KVM_RUN".into(),
                    start_ms: 1.0,
                    dur_ms: 5.0,
                    stalled: true,
                },
            ],
            pinned_bytes: Vec::new(),
        }
    }

    /// A lifecycle run with `text` in its id, variants, metric names, ioctls, parameters,
    /// profile and host.
    fn record(text: &str) -> RunRecord {
        let mut host = crate::lab::host::probe();
        host.cpu = format!("cpu-{text}");
        host.kernel = format!("k-{text}");
        let mut params = BTreeMap::new();
        params.insert(
            format!("p-{text}"),
            serde_json::Value::from(format!("v-{text}")),
        );
        RunRecord {
            run_id: format!("id-{text}"),
            scenario: "lifecycle".into(),
            backend: crate::backend::BackendKind::Model,
            profile: Some(format!("prof-{text}")),
            host,
            params,
            started_at: "2026-11-22T10:00:00Z".into(),
            finished_at: "2026-11-22T10:00:05Z".into(),
            variants: vec![
                variant(format!("a-{text}"), text, 1.0),
                variant(format!("b-{text}"), text, 3.0),
            ],
            verdicts: Vec::new(),
            noise: None,
            warnings: Vec::new(),
            tag: None,
            baseline: None,
        }
    }

    /// A two-axis sweep (heatmaps and a colour bar) with `text` in its id, backend, an axis
    /// name, axis values and the variant.
    fn sweep(text: &str) -> super::SweepView {
        let xs = vec![format!("x-{text}"), "2".to_string()];
        let ys = vec!["0".to_string(), format!("y-{text}")];
        let mut cells = Vec::new();
        for (i, x) in xs.iter().enumerate() {
            for (j, y) in ys.iter().enumerate() {
                let v = 1.0 + 10.0 * f64::from(u32::try_from(i * 2 + j).unwrap());
                cells.push((
                    vec![x.clone(), y.clone()],
                    format!("var-{text}"),
                    metric("ms", &[v, v * 1.1, v * 1.2]),
                ));
            }
        }
        super::SweepView {
            id: format!("sw-{text}"),
            scenario: "lifecycle".into(),
            backend: format!("model (profile {text})"),
            metric: "ready_ms".into(),
            axes: vec![(format!("ax-{text}"), xs), ("devices".into(), ys)],
            variants: vec![format!("var-{text}")],
            cells,
        }
    }

    /// The real fidelity reports, once (evaluating them runs the model).
    fn fidelity() -> &'static [crate::lab::fidelity::ThreadReport] {
        static REPORTS: OnceLock<Vec<crate::lab::fidelity::ThreadReport>> = OnceLock::new();
        REPORTS.get_or_init(|| {
            crate::lab::fidelity::evaluate(&crate::lab::host::probe(), None, 1).unwrap()
        })
    }

    /// Every HTML page for `text`: index, fleet, fidelity (a row's setup carries the text) and
    /// sweep.
    fn pages(text: &str) -> Vec<(&'static str, String)> {
        let records = vec![record(text)];
        let mut reports = fidelity().to_vec();
        reports[0].rows[0].setup = format!("setup-{text}");
        vec![
            ("index", super::html::page(&records, &reports).unwrap()),
            ("fleet", super::fleet::page(&records).unwrap()),
            ("fidelity", super::html::fidelity_page(&reports).unwrap()),
            ("sweep", super::sweep::page(&sweep(text)).unwrap()),
        ]
    }

    /// What a browser reads from escaped text: character references decoded.
    fn decode(html: &str) -> String {
        let mut out = String::with_capacity(html.len());
        let mut rest = html;
        while let Some(i) = rest.find('&') {
            out.push_str(&rest[..i]);
            rest = &rest[i..];
            let end = rest.find(';').unwrap();
            let entity = &rest[1..end];
            let c = match entity {
                "amp" => '&',
                "lt" => '<',
                "gt" => '>',
                "quot" => '"',
                "apos" => '\'',
                _ => char::from_u32(entity.strip_prefix('#').unwrap().parse().unwrap()).unwrap(),
            };
            out.push(c);
            rest = &rest[end + 1..];
        }
        out.push_str(rest);
        out
    }

    fn count(html: &str, c: char) -> usize {
        html.matches(c).count()
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig { cases: 48, ..Default::default() })]

        /// On every page, hostile text (markup, both quotes, `&`, entities) leaves the page's
        /// `<`, `>`, `"` and `'` exactly as harmless text of the same length does (nothing
        /// opens or closes an element or an attribute), every `&` starts a character
        /// reference, and the text reads back as it was.
        #[test]
        fn every_page_escapes_hostile_text_and_reads_it_back(text in "\\PC{0,24}|[<>&'\"a-z ;#/=]{1,24}") {
            let harmless: String = text.chars().map(|_| 'a').collect();
            for ((page, hostile), (_, plain)) in pages(&text).into_iter().zip(pages(&harmless)) {
                for c in ['<', '>', '"', '\''] {
                    proptest::prop_assert_eq!(
                        count(&hostile, c), count(&plain, c),
                        "{} of {}: {} changes the markup", c, page, text
                    );
                }
                for (i, _) in hostile.match_indices('&') {
                    let entity = &hostile[i + 1..];
                    let name = &entity[..entity.find(';').unwrap_or(0)];
                    proptest::prop_assert!(
                        !name.is_empty() && name.len() <= 8
                            && (name.chars().all(|c| c.is_ascii_alphabetic())
                                || name.strip_prefix('#').is_some_and(|n| n.chars().all(|c| c.is_ascii_digit()))),
                        "a bare & in {}", page
                    );
                }
                proptest::prop_assert!(decode(&hostile).contains(&text), "{} lost {}", page, text);
            }
        }
    }

    /// The same hostile text in the record, in words: what the old hand escaper's test checked
    /// (`<script>`, both quotes, `&`), on every page.
    #[test]
    fn a_script_in_an_id_a_variant_and_a_parameter_is_text_on_every_page() {
        let hostile = "<script>alert('x')</script>\"&amp;";
        for (page, html) in pages(hostile) {
            assert!(!html.contains("<script"), "{page} carries a script");
            assert!(!html.contains("'x'"), "{page} carries a bare quote");
            assert!(
                !html.contains("\"&amp;"),
                "{page} carries a bare double quote"
            );
            assert!(decode(&html).contains(hostile), "{page}");
        }
        // Where each page shows it.
        let all = pages(hostile);
        let find = |p: &str| &all.iter().find(|(n, _)| *n == p).unwrap().1;
        assert!(find("index").contains("id=\"id-&#60;script&#62;alert(&#39;x&#39;)"));
        assert!(find("sweep").contains("<code>sw-&#60;script&#62;"));
        assert!(find("fleet").contains("cpu-&#60;script&#62;"));
        assert!(find("fidelity").contains("setup-&#60;script&#62;"));
    }
}
