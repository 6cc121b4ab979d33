//! The HTML report: self-contained, every chart present, and it renders in headless Chromium
//! with nothing failing to load.
#![allow(clippy::unwrap_used, clippy::cast_possible_truncation)] // test code: a panic is the failure report

use crate::common;

use common::{run, tool_or_skip};

#[test]
fn the_report_is_self_contained_and_renders_in_chromium() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    // Model runs (no /dev/kvm needed): one per scenario.
    for (scenario, extra) in [
        ("lifecycle", vec![]),
        ("memory", vec!["--set", "size=64MiB"]),
        ("exits", vec![]),
        ("pinning", vec!["--set", "buffer=256MiB"]),
        ("percpu", vec![]),
    ] {
        let mut args = vec![
            "run",
            scenario,
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "5",
        ];
        if scenario == "pinning" || scenario == "percpu" {
            args[5] = if scenario == "pinning" {
                "neoverse-n2-spe"
            } else {
                "arm64-server-160"
            };
        }
        args.extend(extra);
        let out = run(&db, &args);
        assert!(out.status.success(), "{}", common::stderr(&out));
    }
    let out_dir = dir.path().join("report");
    let out = run(&db, &["report", "-o", out_dir.to_str().unwrap()]);
    assert!(out.status.success(), "{}", common::stderr(&out));
    let html = std::fs::read_to_string(out_dir.join("index.html")).unwrap();
    let md = std::fs::read_to_string(out_dir.join("summary.md")).unwrap();
    // Self-contained: nothing to fetch. The links go to the pages beside it and to the
    // sections of the page itself.
    assert!(
        html.contains("href=\"fleet.html\""),
        "no link to the fleet page"
    );
    assert!(out_dir.join("fleet.html").exists(), "fleet.html missing");
    assert!(
        html.contains("href=\"fidelity.html\""),
        "no link to the fidelity page"
    );
    common::assert_self_contained(
        &html.replace("href=\"#", ""),
        &["fleet.html", "fidelity.html"],
    );
    // The fidelity table is a page of its own, not inline: the index carries its headline.
    let fidelity = std::fs::read_to_string(out_dir.join("fidelity.html")).unwrap();
    assert!(
        !html.contains("<table class=\"fidelity\""),
        "fidelity table inline"
    );
    assert!(fidelity.contains("<table class=\"fidelity\""));
    common::assert_self_contained(&fidelity, &["index.html"]);
    // Markdown escapes the underscore, which renders as pf_fixed.
    assert!(fidelity.contains("pf_fixed after the fix") && md.contains("pf\\_fixed after the fix"));
    assert!(md.contains("| thread | figure | setup | published | model | verdict |"));
    // Markdown in the same order: the summary table before any run's section.
    let md_table = md
        .find("| scenario | backend | host |")
        .expect("summary table");
    assert!(md_table < md.find("## lifecycle on model").unwrap());
    let svgs = html.matches("<svg").count();
    assert_fonts_readable(&html);
    assert_fonts_readable(&std::fs::read_to_string(out_dir.join("fleet.html")).unwrap());
    // Per scenario: a distribution plus its own chart; pinning has two.
    assert!(svgs >= 11, "{svgs} charts");
    for scenario in [
        "lifecycle on model",
        "memory on model",
        "exits on model",
        "pinning on model",
        "percpu on model",
    ] {
        assert!(html.contains(scenario), "{scenario} missing");
        assert!(md.contains(scenario), "{scenario} missing from the summary");
    }
    assert!(
        html.contains("construction timeline"),
        "the lifecycle timeline chart is missing"
    );
    assert!(
        html.contains("pinned memory over the trace"),
        "the pinned-bytes chart is missing"
    );
    assert!(
        html.contains("waited for the SRCU grace period"),
        "findings in words are missing"
    );

    if !tool_or_skip("report_in_chromium", "chromium") {
        return;
    }
    let profile = dir.path().join("chromium-profile");
    let page = out_dir.join("index.html");
    let shot = dir.path().join("report.png");
    let chromium = |extra: &[&str]| common::chromium(&page, &profile, extra);
    let dom = common::chromium_dom(&page, &profile, svgs);
    // Summary first, checked on what the browser built: the first table comes before any
    // chart and has one row per scenario × backend (× profile), each linking to its section.
    let first_table = dom.find("<table").unwrap();
    assert!(
        first_table < dom.find("<svg").unwrap(),
        "a chart before the summary table"
    );
    let table = &dom[first_table..first_table + dom[first_table..].find("</table>").unwrap()];
    let rows: Vec<&str> = table.split("<tr").skip(2).collect();
    assert_eq!(rows.len(), 5, "one row per run: {table}");
    let mut keys: Vec<String> = rows
        .iter()
        .map(|r| {
            let cells: Vec<String> = r.split("<td").skip(1).take(2).map(text).collect();
            cells.join("|")
        })
        .collect();
    keys.sort();
    keys.dedup();
    assert_eq!(
        keys.len(),
        5,
        "scenario × backend × profile repeats: {table}"
    );
    for row in &rows {
        let id = row
            .split("href=\"#")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            dom.contains(&format!("id=\"{id}\"")),
            "link to no section: {id}"
        );
    }
    // The first screen: the summary table fits in it with its verdicts.
    let first = dir.path().join("first-screen.png");
    let first_out = chromium(&[
        &format!("--screenshot={}", first.display()),
        "--window-size=1280,900",
    ]);
    assert!(first_out.status.success());
    if let Ok(keep) = std::env::var("HVLAB_REPORT_FIRST_SCREEN") {
        std::fs::copy(&first, keep).unwrap();
    }
    let shot_out = chromium(&[
        &format!("--screenshot={}", shot.display()),
        "--window-size=1000,2400",
    ]);
    assert!(
        shot_out.status.success(),
        "{}",
        String::from_utf8_lossy(&shot_out.stderr)
    );
    let png = std::fs::read(&shot).unwrap();
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 20_000,
        "screenshot of {} bytes",
        png.len()
    );
    if let Ok(keep) = std::env::var("HVLAB_REPORT_SCREENSHOT") {
        std::fs::copy(&shot, keep).unwrap();
    }
    // The fleet page's bar charts, in the browser too.
    let fleet = out_dir.join("fleet.html");
    let fleet_svgs = std::fs::read_to_string(&fleet)
        .unwrap()
        .matches("<svg")
        .count();
    assert!(fleet_svgs >= 5, "{fleet_svgs} fleet charts");
    common::chromium_dom(&fleet, &profile, fleet_svgs);
    screenshot(
        &fleet,
        &profile,
        &dir.path().join("fleet.png"),
        "HVLAB_FLEET_SCREENSHOT",
    );
    // A laptop and a phone: no page is wider than the window (wide tables and charts scroll
    // inside the page), and the phone's screenshot is a real image.
    for page in ["index.html", "fleet.html", "fidelity.html"] {
        for width in [1280, 390] {
            let overflow = overflow_at(&out_dir.join(page), &profile, width);
            assert!(
                overflow <= 0,
                "{page} at {width} px is {overflow} px wider than the window"
            );
        }
    }
    let phone = dir.path().join("phone.png");
    let out = chromium(&[
        &format!("--screenshot={}", phone.display()),
        "--window-size=390,1800",
    ]);
    assert!(out.status.success());
    let png = std::fs::read(&phone).unwrap();
    assert!(png.starts_with(b"\x89PNG") && png.len() > 20_000);
    if let Ok(keep) = std::env::var("HVLAB_REPORT_PHONE_SCREENSHOT") {
        std::fs::copy(&phone, keep).unwrap();
    }
}

/// How many px `page` laid out in a window `width` px wide is wider than the window (0 or less:
/// it fits). Measured on a copy of the page with a script appended (the report has none).
fn overflow_at(page: &std::path::Path, profile: &std::path::Path, width: u32) -> i64 {
    let html = std::fs::read_to_string(page).unwrap();
    let probe = page.with_file_name(format!("probe-{width}.html"));
    let script = "<script>document.body.setAttribute('data-overflow', \
        String(document.documentElement.scrollWidth - window.innerWidth))</script>";
    std::fs::write(&probe, html.replace("</body>", &format!("{script}</body>"))).unwrap();
    let out = common::chromium(
        &probe,
        profile,
        &["--dump-dom", &format!("--window-size={width},900")],
    );
    std::fs::remove_file(&probe).unwrap();
    assert!(out.status.success());
    let dom = String::from_utf8_lossy(&out.stdout);
    dom.split("data-overflow=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no measurement in {}", page.display()))
        .parse()
        .unwrap()
}

/// Every text on every chart is at least 11 px (plotters writes `font-size` in px).
fn assert_fonts_readable(html: &str) {
    let sizes: Vec<f64> = html
        .split("font-size=\"")
        .skip(1)
        .map(|rest| rest.split('"').next().unwrap().parse().unwrap())
        .collect();
    assert!(!sizes.is_empty(), "no chart text");
    let least = sizes.iter().copied().fold(f64::INFINITY, f64::min);
    assert!(least >= 11.0, "a chart label of {least} px");
}

/// A screenshot of `page` that Chromium rendered to a real image; kept where `keep_env` says.
fn screenshot(
    page: &std::path::Path,
    profile: &std::path::Path,
    png: &std::path::Path,
    keep_env: &str,
) {
    let out = common::chromium(
        page,
        profile,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1000,2400",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bytes = std::fs::read(png).unwrap();
    assert!(
        bytes.starts_with(b"\x89PNG") && bytes.len() > 20_000,
        "screenshot of {} bytes",
        bytes.len()
    );
    if let Ok(keep) = std::env::var(keep_env) {
        std::fs::copy(png, keep).unwrap();
    }
}

/// A 48-point sweep over two axes: every heatmap on one colour scale, drawn once as a colour
/// bar above them, each heatmap without a scale of its own; renders in Chromium.
#[test]
fn a_sweep_page_has_one_colour_scale_with_one_colour_bar() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    let out = run(
        &db,
        &[
            "sweep",
            "lifecycle",
            "--backend",
            "model",
            "--profile",
            "pvm-epyc",
            "--reps",
            "5",
            "--warmup",
            "0",
            "--grid",
            "vcpus=1,2,4,8,16,32",
            "--grid",
            "devices=0,1,2,4,8,16,32,64",
            "--variant",
            "irqchip-first",
            "--variant",
            "memslots-first",
            "--json",
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let sweep = common::json(&out);
    assert_eq!(sweep["sweep"]["points"], 48);
    let id = sweep["sweep"]["id"].as_str().unwrap();
    let report = dir.path().join("sweep");
    let out = run(
        &db,
        &["report", "--sweep", id, "-o", report.to_str().unwrap()],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let page = report.join("index.html");
    let html = std::fs::read_to_string(&page).unwrap();
    assert_fonts_readable(&html);
    assert_eq!(
        html.matches("class=\"colour-bar\"").count(),
        1,
        "one colour bar"
    );
    assert!(html.contains("colour scale of every heatmap on this page"));
    // Two variants: two heatmaps and the bar, the bar first.
    let svgs = html.matches("<svg").count();
    assert_eq!(svgs, 3);
    assert!(
        html.find("colour-bar").unwrap() < html.find("ready_ms median, irqchip-first").unwrap()
    );
    let profile = dir.path().join("chromium-profile");
    if !tool_or_skip("sweep_page_in_chromium", "chromium") {
        return;
    }
    let dom = common::chromium_dom(&page, &profile, svgs);
    assert_eq!(dom.matches("colour-bar").count(), 1);
    for width in [1280, 390] {
        let overflow = overflow_at(&page, &profile, width);
        assert!(
            overflow <= 0,
            "the sweep page at {width} px is {overflow} px too wide"
        );
    }
    screenshot(
        &page,
        &profile,
        &dir.path().join("sweep.png"),
        "HVLAB_SWEEP_SCREENSHOT",
    );
}

/// The text of an HTML fragment: everything outside tags (the rest of a cut-off opening tag
/// `<td ...>` included).
fn text(fragment: &str) -> String {
    let fragment = fragment.split_once('>').map_or(fragment, |(_, rest)| rest);
    let mut out = String::new();
    let mut in_tag = false;
    for c in fragment.chars() {
        match c {
            '<' => in_tag = true,
            '>' => in_tag = false,
            c if !in_tag => out.push(c),
            _ => {}
        }
    }
    out
}
