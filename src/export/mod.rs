//! One exporter per format, after hyperfine's `src/export/`: each turns stored runs into the
//! bytes of its format ([`Exporter`]), one file a format: JSON Lines ([`jsonl`]) and CSV
//! ([`csv`]) for `hvlab export`, Markdown ([`markdown`]) and HTML ([`html`]) for a report, the
//! terminal ([`terminal`]) for what a command prints, and a kab's outcome ([`kab`]). The words they share come from one
//! place ([`words`]); [`escape`] keeps what no template engine does (terminal text and
//! Markdown). HTML goes through askama templates (`templates/`), which escape every value.

pub mod bisect;
pub mod build;
pub mod cache;
pub mod csv;
pub mod email;
pub mod escape;
pub mod html;
pub mod jsonl;
pub mod judge;
pub mod kab;
pub mod markdown;
pub mod objdiff;
pub mod report;
pub mod series;
pub mod summary;
pub mod sweep;
pub mod terminal;
pub mod words;

use std::path::{Path, PathBuf};

pub use crate::error::ExportError;
use crate::lab::fidelity::ThreadReport;
use crate::record::RunRecord;
pub use html::charts_for;
pub use sweep::SweepView;

/// What an export is made of: the runs, and for a report the model against the kernel
/// threads (formats without a place for it leave it out).
#[derive(Debug, Clone, Copy)]
pub struct Export<'a> {
    /// The runs, in the order they are shown.
    pub runs: &'a [RunRecord],
    /// The fidelity table, when the export carries it.
    pub fidelity: &'a [ThreadReport],
}

impl<'a> Export<'a> {
    /// Runs alone.
    pub fn runs(runs: &'a [RunRecord]) -> Export<'a> {
        Export {
            runs,
            fidelity: &[],
        }
    }
}

/// A format: what [`Export`] becomes in it.
pub trait Exporter {
    /// The export in this format.
    fn serialize(&self, export: &Export<'_>) -> Result<Vec<u8>, ExportError>;
}

/// How `hvlab export` writes runs: for another site (JSON Lines, which `import` reads back) or
/// for a spreadsheet (CSV, one row per run, variant and metric; not read back).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// One run record (JSON, the output contract's shape) per line.
    Jsonl,
    /// One row per run, variant and metric: the summary with its unit and 95% CI, no samples.
    Csv,
}

impl Format {
    /// Its exporter.
    pub fn exporter(self) -> &'static dyn Exporter {
        match self {
            Format::Jsonl => &jsonl::JsonLines,
            Format::Csv => &csv::Csv,
        }
    }
}

/// Writes an export's `bytes` to `path`. A regular file (or a new one) is written whole or
/// not at all: into a temporary file beside it, renamed over `path` once complete, so an
/// interrupted export never looks finished. Anything else is written through, as a shell
/// redirection would, and never renamed over: a device (`/dev/null`), a FIFO, or a symlink
/// (`/proc/self/fd/1` and other links: replacing a link's target by path could replace a file
/// that another process holds open as its output).
pub fn write_file(bytes: &[u8], path: &Path) -> Result<(), ExportError> {
    let fail = |e| ExportError::Write(path.to_path_buf(), e);
    let link = std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    match std::fs::metadata(path) {
        Ok(meta) if meta.is_dir() => Err(fail(std::io::Error::new(
            std::io::ErrorKind::IsADirectory,
            "it is a directory",
        ))),
        Ok(meta) if link || !meta.is_file() => {
            let descriptor = names_a_descriptor(path);
            write_through(bytes, path, meta.is_file() && !descriptor, descriptor)
        }
        Ok(_) => write_replacing(bytes, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !link => write_replacing(bytes, path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(fail(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "it is a symbolic link to a missing file",
        ))),
        Err(e) => Err(fail(e)),
    }
}

/// Whether `path` or a link it leads through is under `/proc` or `/dev` (`/proc/self/fd/1`,
/// `/dev/stdout`): an open descriptor of some process. Reopening it gives a new file offset,
/// so a regular file behind it is appended to, never truncated or overwritten from the start
/// (it may be a log the caller opened with `>>`).
fn names_a_descriptor(path: &Path) -> bool {
    let special = |p: &Path| p.starts_with("/proc") || p.starts_with("/dev");
    let mut at = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for _ in 0..40 {
        if special(&at) {
            return true;
        }
        match std::fs::read_link(&at) {
            Ok(next) => at = at.parent().map_or(next.clone(), |dir| dir.join(&next)),
            Err(_) => return false,
        }
    }
    false
}

/// Writes into a special file or through a link as it is (`truncate`: the file behind it is a
/// regular file, whose old content goes; `append`: write at its end). A FIFO is opened without blocking, so one that no
/// process reads is refused at once instead of hanging the export.
fn write_through(
    bytes: &[u8],
    path: &Path,
    truncate: bool,
    append: bool,
) -> Result<(), ExportError> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fail = |e| ExportError::Write(path.to_path_buf(), e);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .truncate(truncate)
        .append(append)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ENXIO) {
                fail(std::io::Error::other(
                    "it is a FIFO that no process is reading",
                ))
            } else {
                fail(e)
            }
        })?;
    set_blocking(&file).map_err(fail)?;
    let mut out = std::io::BufWriter::new(file);
    out.write_all(bytes)
        .and_then(|()| out.flush())
        .map_err(fail)
}

/// Clears `O_NONBLOCK` (set only to open a FIFO without waiting for a reader), so writes wait
/// for a slow reader instead of failing with `EAGAIN`.
fn set_blocking(file: &std::fs::File) -> std::io::Result<()> {
    let flags = rustix::fs::fcntl_getfl(file)?;
    Ok(rustix::fs::fcntl_setfl(
        file,
        flags - rustix::fs::OFlags::NONBLOCK,
    )?)
}

/// Writes a regular file at `path` whole or not at all (temporary file, then rename).
fn write_replacing(bytes: &[u8], path: &Path) -> Result<(), ExportError> {
    use std::io::Write;
    let fail = |e| ExportError::Write(path.to_path_buf(), e);
    let partial = partial_path(path);
    // A leftover of a killed export with this pid; create_new below never follows a link.
    let _ = std::fs::remove_file(&partial);
    let result = (|| {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&partial)
            .map_err(fail)?;
        let mut out = std::io::BufWriter::new(file);
        out.write_all(bytes).map_err(fail)?;
        out.into_inner()
            .map_err(|e| fail(e.into_error()))?
            .sync_all()
            .map_err(fail)?;
        std::fs::rename(&partial, path).map_err(fail)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&partial);
    }
    result
}

fn partial_path(path: &Path) -> PathBuf {
    let mut name = path.file_name().unwrap_or_default().to_os_string();
    name.push(format!(".partial-{}", std::process::id()));
    path.with_file_name(name)
}

/// Writes the report of `records` into `dir` ([`report::ReportWriter`]): `index.html` (the
/// first screen), a page per run under `runs/`, `summary.md`, the fleet page `fleet.html` (the
/// `fleet` runs grouped by host) and, with `fidelity` (the model against the kernel threads),
/// its page `fidelity.html`. Returns the index's path.
pub fn write(
    records: &[RunRecord],
    fidelity: &[ThreadReport],
    fleet: &[RunRecord],
    dir: &Path,
) -> std::io::Result<PathBuf> {
    let mut writer = report::ReportWriter::new(dir)?;
    for r in records {
        writer.add(r)?;
    }
    writer.finish(fidelity, Some(fleet))
}

/// Writes a sweep's `index.html` and `summary.md` into `dir`; returns the HTML path.
pub fn write_sweep(view: &SweepView, dir: &Path) -> std::io::Result<PathBuf> {
    publish(
        dir,
        &[
            (
                "index.html",
                html::sweep_page(view).map_err(rendering)?.into_bytes(),
            ),
            ("summary.md", markdown::sweep_summary(view).into_bytes()),
        ],
    )?;
    Ok(dir.join("index.html"))
}

/// A page that failed to render (askama fails only when writing a value fails).
pub(crate) fn rendering(e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("cannot render the report page: {e}"))
}

/// Puts `files` (name, content) into `dir` so that no failure leaves a truncated page or loses
/// the previous report: every file is written and synced in a fresh staging directory inside
/// `dir` (same file system), and only then renamed into place. Only regular files are
/// replaced: a symlink (followed, it would overwrite its target elsewhere), a FIFO or a device
/// at one of the names is refused before anything is written.
pub fn publish(dir: &Path, files: &[(&str, Vec<u8>)]) -> std::io::Result<()> {
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
        std::io::Write::write_all(&mut file, content)?;
        file.sync_all()?;
    }
    for (name, _) in files {
        std::fs::rename(staging.path().join(name), dir.join(name))?;
    }
    // The staging directory, now empty, goes with `staging`.
    Ok(())
}

/// A run parameter as every format writes it: strings bare, anything else as JSON.
pub(crate) fn param_value(v: &serde_json::Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), String::from)
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
            backend: hvlab_core::BackendKind::Model,
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
            calls: Vec::new(),
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
        // Two runs of one scenario, backend and host: a row with a page of its own.
        let mut summary = super::summary::Summary::new();
        for (i, r) in [record(text), record(text)].iter_mut().enumerate() {
            r.run_id = format!("{i}-{}", r.run_id);
            summary.add(r, String::new());
        }
        let rows = summary.rows(super::summary::group_page_name);
        vec![
            ("index", super::html::page(&records, &reports).unwrap()),
            ("run", super::html::run_page(&records[0]).unwrap()),
            ("group", super::html::group_page(&rows[0]).unwrap()),
            ("fleet", super::html::fleet_page(&records).unwrap()),
            ("fidelity", super::html::fidelity_page(&reports).unwrap()),
            ("sweep", super::html::sweep_page(&sweep(text)).unwrap()),
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
        assert!(find("run").contains("id=\"id-&#60;script&#62;alert(&#39;x&#39;)"));
        assert!(find("group").contains("<code>0-id-&#60;script&#62;"));
        assert!(find("index").contains("model of prof-&#60;script&#62;"));
        assert!(find("sweep").contains("<code>sw-&#60;script&#62;"));
        assert!(find("fleet").contains("cpu-&#60;script&#62;"));
        assert!(find("fidelity").contains("setup-&#60;script&#62;"));
    }
}
