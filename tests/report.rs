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
    // Self-contained: nothing to fetch. The index links to the pages beside it: the fleet,
    // the fidelity table and each run's page (each linking back to it alone).
    assert!(
        html.contains("href=\"fleet.html\""),
        "no link to the fleet page"
    );
    assert!(out_dir.join("fleet.html").exists(), "fleet.html missing");
    assert!(
        html.contains("href=\"fidelity.html\""),
        "no link to the fidelity page"
    );
    let mut run_pages: Vec<String> = std::fs::read_dir(out_dir.join("runs"))
        .unwrap()
        .map(|e| format!("runs/{}", e.unwrap().file_name().to_string_lossy()))
        .collect();
    run_pages.sort();
    assert_eq!(run_pages.len(), 5, "a page per run: {run_pages:?}");
    let mut allowed: Vec<&str> = vec!["fleet.html", "fidelity.html"];
    allowed.extend(run_pages.iter().map(String::as_str));
    common::assert_self_contained(&html, &allowed);
    let pages: Vec<String> = run_pages
        .iter()
        .map(|p| std::fs::read_to_string(out_dir.join(p)).unwrap())
        .collect();
    for page in &pages {
        common::assert_self_contained(page, &["../index.html"]);
    }
    let all = pages.concat();
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
    // The first screen has no chart: the charts are on the runs' pages.
    assert!(!html.contains("<svg"), "a chart on the first screen");
    let svgs = all.matches("<svg").count();
    assert_fonts_readable(&all);
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
        assert!(all.contains(scenario), "{scenario} missing");
        assert!(md.contains(scenario), "{scenario} missing from the summary");
    }
    assert!(
        all.contains("construction timeline"),
        "the lifecycle timeline chart is missing"
    );
    assert!(
        all.contains("pinned memory over the trace"),
        "the pinned-bytes chart is missing"
    );
    assert!(
        all.contains("waited for the SRCU grace period"),
        "findings in words are missing"
    );
    // The first screen's rows: per scenario its question, then the modelled hosts.
    for host in [
        "model of pvm-epyc (pvm, HZ 250, 2 CPUs)",
        "model of neoverse-n2-spe (arm64, HZ 250)",
        "model of arm64-server-160 (arm64, HZ 250, 160 CPUs)",
    ] {
        assert!(html.contains(host), "{host} missing: {html}");
    }
    assert!(html.contains("irqchip-first against memslots-first: SLOWER"));

    if !tool_or_skip("report_in_chromium", "chromium") {
        return;
    }
    let profile = dir.path().join("chromium-profile");
    let page = out_dir.join("index.html");
    let shot = dir.path().join("report.png");
    let chromium = |extra: &[&str]| common::chromium(&page, &profile, extra);
    let dom = common::chromium_dom(&page, &profile, 0);
    // Summary first, checked on what the browser built: the first table has one row per
    // scenario × backend × host, each under its scenario's question and linking to its page.
    let first_table = dom.find("<table").unwrap();
    let table = &dom[first_table..first_table + dom[first_table..].find("</table>").unwrap()];
    let questions = table.matches("class=\"question\"").count();
    assert_eq!(questions, 5, "a question per scenario: {table}");
    let rows: Vec<&str> = table.split("<tr class=\"row\"").skip(1).collect();
    assert_eq!(rows.len(), 5, "one row per run: {table}");
    for (row, run_page) in rows.iter().zip(&run_pages) {
        let link = row
            .split("href=\"")
            .nth(1)
            .unwrap()
            .split('"')
            .next()
            .unwrap();
        assert!(
            run_pages.iter().any(|p| p == link),
            "link to no page: {link}"
        );
        let page = std::fs::read_to_string(out_dir.join(link)).unwrap();
        assert!(page.contains("<h1 id=\""), "{run_page}: no run heading");
        // The run's page, in the browser too: its charts survive rendering.
        common::chromium_dom(&out_dir.join(link), &profile, page.matches("<svg").count());
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
    for page in [
        "index.html",
        "fleet.html",
        "fidelity.html",
        run_pages[0].as_str(),
    ] {
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

/// The suite's first screen, in the terminal and in the report: a row per scenario × backend
/// × host whose setup carries no bookkeeping (`seed=`, `suite_unit=`) and no empty value, model
/// rows that name the modelled host (never this machine's kernel), and the threads' block
/// with 001's before/after as one verdict with both numbers. The terminal fits one screen.
#[test]
fn the_suites_first_screen_answers_each_question_and_judges_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("hvlab.db");
    let report = dir.path().join("report");
    let out = run(
        &db,
        &[
            "suite",
            "--backend",
            "model",
            "--report",
            report.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", common::stderr(&out));
    let terminal = String::from_utf8_lossy(&out.stdout).into_owned();
    // What a terminal shows is both streams: the runs stored are counted once, not listed.
    let err = common::stderr(&out);
    assert!(!err.contains("stored run "), "{err}");
    assert!(err.contains(" run(s) in "), "{err}");
    let lines = terminal.lines().count() + err.lines().count();
    assert!(lines <= 60, "{lines} lines: {terminal}{err}");
    let html = std::fs::read_to_string(report.join("index.html")).unwrap();
    let md = std::fs::read_to_string(report.join("summary.md")).unwrap();
    let table = &html[html.find("<table class=\"summary\"").unwrap()..];
    let table = &table[..table.find("</table>").unwrap()];
    // Markdown's escapes (`\(`, `\_`) taken off: the words as a reader sees them.
    let md_table =
        md[md.find("| scenario |").unwrap()..md.find("\nQuestions:").unwrap()].replace('\\', "");
    let kernel = common::json(&run(&db, &["host", "--json"]))["kernel"]
        .as_str()
        .unwrap()
        .to_string();
    for (what, text) in [
        ("the report's table", table),
        ("summary.md's table", md_table.as_str()),
        ("the terminal", terminal.as_str()),
    ] {
        for bookkeeping in ["seed=", "suite_unit=", "=,", "suite="] {
            assert!(
                !text.contains(bookkeeping),
                "{what} shows {bookkeeping}: {text}"
            );
        }
        // A model run's host is the modelled one: its profile, flavour, HZ, CPUs.
        assert!(
            text.contains("model of pvm-epyc (pvm, HZ 250, 2 CPUs)"),
            "{what}: {text}"
        );
    }
    assert!(
        !table.contains(&kernel),
        "a model row names this machine: {table}"
    );
    // A row per scenario on the model (the showcases answer the threads, below).
    assert_eq!(table.matches("<tr class=\"row\"").count(), 7, "{table}");
    for answer in [
        "irqchip-first against memslots-first: SLOWER",
        "populated against lazy",
        "ring against bitmap: SLOWER",
        "local-map against offset",
    ] {
        assert!(
            table.contains(answer) || md.contains(answer),
            "{answer}: {table}"
        );
    }
    // The threads: one line each, 001's regression and its fix as one verdict with both
    // numbers, and what the fix leaves (boot-time registrations still stall).
    let threads = &html[html.find("<ul class=\"threads\"").unwrap()..];
    let threads = &threads[..threads.find("</ul>").unwrap()];
    assert_eq!(threads.matches("<li").count(), 5, "{threads}");
    let t001 = threads
        .split("<li")
        .find(|l| l.contains(">001 "))
        .expect("001");
    for says in [
        "x86-vmx-hz100 at HZ=100",
        "the creation stall (ready_ms), always-defer ",
        " ms → lifecycle-keyed ",
        " ms: FIXED",
        "the stall gone: 20/20 → 0/20",
        "boot-time registrations",
        ": NO CHANGE (still stalls: 20/20 → 20/20",
        "fidelity ",
    ] {
        assert!(t001.contains(says), "{says}: {t001}");
    }
    for (thread, says) in [
        ("000", "eager "),
        ("002", "fork at 4096 CPUs"),
        ("003", "pebs-old "),
        ("004", "legacy-skip-trailing "),
    ] {
        let line = threads
            .split("<li")
            .find(|l| l.contains(&format!(">{thread} ")))
            .unwrap_or_else(|| panic!("{thread}: {threads}"));
        assert!(line.contains(says), "{thread}: {line}");
        assert!(line.contains(" → "), "{thread}: {line}");
    }
    assert!(terminal.contains("001 on x86-vmx-hz100 at HZ=100: the creation stall"));
    assert!(terminal.contains(&format!("report: {}", report.join("index.html").display())));
}
