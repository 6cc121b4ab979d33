//! Golden renderings of stored kabs: the text, `--json` and `--markdown` of the 001 fixes on
//! Debian 7.3.4 (`tests/fixtures/kab-7.3-001/`) and of the patch that loses a dirty page
//! (`tests/fixtures/kab-dirty-lost-page/`), judged from their stored runs as `hvlab kab` judges
//! them. A change to kab's judging or words shows here byte for byte; the goldens are rewritten
//! with `HVLAB_BLESS=1`, and `HVLAB_KAB_CAPTURES=DIR` copies every rendering to DIR for a diff.

use std::path::{Path, PathBuf};

use crate::export::kab::{markdown, render};
use crate::kernel::Kernel;
use crate::kernel::vm::{Accel, AccelChoice};
use crate::lab::kab::{
    self, BootSummary, GuestFailure, HostSummary, KabOutcome, SideRuns, WallTimes,
};
use crate::record::RunRecord;

/// A side's kernel as the fixture's runs name it (`host.under_test`).
fn kernel_of(runs: &[RunRecord], spec: &str) -> Kernel {
    let under = runs.iter().find_map(|r| r.host.under_test.as_ref());
    Kernel {
        release: under.map_or_else(String::new, |u| u.release.clone()),
        spec: spec.into(),
        source: "linux-binary-7.3.4+deb13-amd64 7.3.4-1~bpo13+1".into(),
        image: PathBuf::from("/k/vmlinuz"),
        config: None,
        modules: None,
    }
}

/// Quiet boots, ABBA, two a side, with the commands that failed on each side.
fn boots(failed: [&[GuestFailure]; 2]) -> Vec<BootSummary> {
    ["A", "B", "B", "A"]
        .iter()
        .enumerate()
        .map(|(i, side)| BootSummary {
            side: (*side).into(),
            release: "7.3.4+deb13-amd64".into(),
            to_first_command_s: Some(3.4 + 0.1 * f64::from(u8::try_from(i).unwrap_or(0))),
            wall_s: 7.0,
            console: PathBuf::from(format!("console-{}.log", i + 1)),
            runs: 1,
            stored: 1,
            store: "kab.db".into(),
            // Each side's failures on its first boot.
            failures: match i {
                0 => failed[0].to_vec(),
                1 => failed[1].to_vec(),
                _ => Vec::new(),
            },
            host_busy: None,
        })
        .collect()
}

/// The outcome `hvlab kab` would print for these runs: judged, with fixed host, build and
/// times (the goldens hold nothing of the machine that renders them).
fn outcome(
    scenario: &str,
    sides: [&[RunRecord]; 2],
    failed: [&[GuestFailure]; 2],
    specs: [&str; 2],
) -> KabOutcome {
    let judged = kab::judge(
        &[scenario.to_string()],
        &[],
        [0, 1].map(|i| SideRuns {
            runs: sides[i],
            failed_commands: failed[i],
        }),
        Accel::Tcg,
        0.05,
    );
    let boots = boots(failed);
    let j = kab::judgement(&judged, &boots);
    KabOutcome {
        hvlab_version: "0.1.0 (golden)".into(),
        a: kernel_of(sides[0], specs[0]),
        b: kernel_of(sides[1], specs[1]),
        builds: [None, None],
        build_steps: Vec::new(),
        notes: Vec::new(),
        accel: AccelChoice {
            accel: Accel::Tcg,
            cpu_model: "EPYC,+svm,+npt".into(),
            vendor_module: "kvm_amd".into(),
            why: "accel: tcg (no nested virtualization on this host)".into(),
            clock: Default::default(),
        },
        host: HostSummary {
            kernel: "6.18".into(),
            cpu: "AMD EPYC Processor".into(),
            cores: 2,
            hypervisor: Some("KVMKVMKVM".into()),
        },
        scenario_names: vec![scenario.to_string()],
        boots_per_side: 2,
        reps: 10,
        boots,
        scenarios: judged,
        verdicts: j.verdicts,
        regression: j.regression,
        inconclusive: j.inconclusive,
        wall: WallTimes {
            build_s: 21.0,
            boots_s: 30.0,
            total_s: 51.0,
        },
        wall_s: 51.0,
        prediction: None,
        memory_prediction: None,
    }
}

/// The three renderings of `o`, by file extension.
fn renderings(o: &KabOutcome, command: &str) -> [(&'static str, String); 3] {
    [
        ("txt", render(o) + "\n"),
        (
            "json",
            serde_json::to_string_pretty(o).expect("an outcome serializes") + "\n",
        ),
        ("md", markdown(o, command)),
    ]
}

/// Compares each rendering with its golden under `dir` (rewrites it under `HVLAB_BLESS=1`),
/// copying it to `HVLAB_KAB_CAPTURES` when set; the goldens that differ.
fn check(dir: &Path, name: &str, o: &KabOutcome, command: &str) -> Vec<String> {
    let mut differ = Vec::new();
    let captures = std::env::var_os("HVLAB_KAB_CAPTURES").map(PathBuf::from);
    let bless = std::env::var_os("HVLAB_BLESS").is_some();
    for (ext, text) in renderings(o, command) {
        let file = format!("{name}.{ext}");
        if let Some(c) = &captures {
            std::fs::create_dir_all(c).expect("the captures directory");
            std::fs::write(c.join(&file), &text).expect("a capture written");
        }
        let golden = dir.join(&file);
        if bless {
            std::fs::create_dir_all(dir).expect("the goldens directory");
            std::fs::write(&golden, &text).expect("a golden written");
            continue;
        }
        let want = std::fs::read_to_string(&golden)
            .unwrap_or_else(|e| panic!("{}: {e} (HVLAB_BLESS=1 writes it)", golden.display()));
        if want != text {
            differ.push(golden.display().to_string());
        }
    }
    differ
}

/// Fails naming the goldens that differ, after every rendering was captured.
fn assert_none_differ(differ: &[String]) {
    assert!(
        differ.is_empty(),
        "{} differ from their goldens; HVLAB_KAB_CAPTURES=DIR writes what they are now",
        differ.join(", ")
    );
}

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures")
}

/// Both stored kabs of the 001 changes on 7.3.4: the fix (lifecycle-keyed) and
/// sync-on-register.
#[test]
fn the_001_kabs_render_as_their_goldens() {
    use crate::lab::fidelity::patch::fixture;
    let runs = fixture::runs();
    let mut differ = Vec::new();
    for (patch, name) in [
        ("001-lifecycle-keyed.patch", "lifecycle-keyed"),
        ("001-sync-on-register.patch", "sync-on-register"),
    ] {
        let side = |s: &str| -> Vec<RunRecord> {
            fixture::side(&runs, patch, s)
                .into_iter()
                .cloned()
                .collect()
        };
        let (a, b) = (side("A"), side("B"));
        let specs = ["debian:7.3", &format!("debian:7.3+{patch}")];
        let o = outcome("lifecycle", [&a, &b], [&[], &[]], [specs[0], specs[1]]);
        let command = format!("hvlab kab {} {}", specs[0], specs[1]);
        differ.extend(check(
            &fixtures().join("kab-7.3-001/golden"),
            name,
            &o,
            &command,
        ));
    }
    assert_none_differ(&differ);
}

/// The patch that loses a dirty page: every variant A ran failed on B, whose guest command
/// exited 4.
#[test]
fn the_lost_dirty_page_kab_renders_as_its_golden() {
    use crate::lab::kab::fixture;
    let runs = fixture::runs();
    let (a, b) = (fixture::side(&runs, "A"), fixture::side(&runs, "B"));
    let failed = [fixture::b_command_failed("error: the dirty run failed")];
    let o = outcome(
        "dirty",
        [&a, &b],
        [&[], &failed],
        ["debian:7.3", "debian:7.3+drop.patch"],
    );
    assert_none_differ(&check(
        &fixtures().join("kab-dirty-lost-page/golden"),
        "kab",
        &o,
        "hvlab kab debian:7.3 debian:7.3+drop.patch --scenario dirty",
    ));
}

/// The 004 revert's memory kab under the legacy MMU (constructed runs): populated REGRESSED
/// with the pages each fault maps, lazy's one fault in 4096 a change under memory's
/// tolerance.
#[test]
fn the_memory_revert_kab_renders_as_its_golden() {
    use crate::lab::kab::fixture;
    let [a, b] = fixture::memory_revert();
    let o = outcome(
        "memory",
        [&a, &b],
        [&[], &[]],
        ["debian:7.3", "debian:7.3+revert.patch"],
    );
    let text = render(&o);
    assert!(
        text.contains("B worse: kvm.vcpu.pf_fixed 512 → 4097 (+700.2%): SPTE prefetch: pages mapped per fault 8 → 1.000"),
        "{text}"
    );
    assert!(
        text.contains(
            "change: kvm.vcpu.pf_fixed +1 (+0.02%, 4096 → 4097), under the 1% it tolerates"
        ),
        "{text}"
    );
    assert_none_differ(&check(
        &fixtures().join("kab-memory-revert/golden"),
        "kab",
        &o,
        "hvlab kab debian:7.3 debian:7.3+revert.patch --scenario memory --kvm-param kvm.tdp_mmu=N",
    ));
}
