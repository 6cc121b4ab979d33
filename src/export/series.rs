//! A series' per-patch table in words (`hvlab kab BASE SERIES --per-patch`): the terminal
//! table ([`render`]: the answer first, then a row per commit × variant with its verdict
//! against its parent and against the base and LKP's numbers, parent | commit | %change, each
//! ± %stddev) and the cover letter's Markdown ([`markdown`], a section per patch). Numbers go
//! through the export layer's one formatter ([`crate::analysis::quantity`]), Markdown through
//! [`super::escape`]. `--json` is the outcome itself through serde.

use crate::analysis::quantity::{fixed_decimals, number};
use crate::export::escape;
use crate::export::kab::duration;
use crate::lab::series::{CommitRow, Numbers, PhaseTimes, SeriesNote, SeriesTable, VariantRow};

/// A side's median ± its spread in % of its mean, as LKP prints it.
pub fn with_spread(median: f64, stddev_pct: f64) -> String {
    format!("{} ±{}%", number(median), fixed_decimals(stddev_pct))
}

/// The %change, signed.
fn change(n: &Numbers) -> String {
    format!("{:+.1}%", n.change_pct)
}

/// A metric's numbers in a verdict's line: `m00 100 → 130 µs (+30.0%)`, each side with its
/// spread when `spread` (`m00 100 ±2% → 130 ±3% µs (+30.0%)`).
pub fn numbers_words(n: &Numbers, spread: bool) -> String {
    let side = |median: f64, stddev_pct: f64| {
        if spread {
            with_spread(median, stddev_pct)
        } else {
            number(median)
        }
    };
    format!(
        "{} {} → {} {} ({})",
        n.metric,
        side(n.parent, n.stddev_pct[0]),
        side(n.commit, n.stddev_pct[1]),
        n.unit,
        change(n)
    )
}

/// The numbers' cells: parent, commit, %change, metric (dashes when none was compared).
fn number_cells(n: Option<&Numbers>) -> [String; 4] {
    n.map_or_else(
        || std::array::from_fn(|_| "-".to_string()),
        |n| {
            [
                with_spread(n.parent, n.stddev_pct[0]),
                with_spread(n.commit, n.stddev_pct[1]),
                change(n),
                format!("{} ({})", n.metric, n.unit),
            ]
        },
    )
}

/// The answer first: each commit whose verdict against its parent is a change, or that does
/// not build, as `[PATCH 2/4] REGRESSED irqchip-first: m00 100 → 130 µs (+30.0%)`; else one
/// line saying no commit changed anything (or how many rows stayed NOT DECIDED).
pub fn answer(t: &SeriesTable) -> Vec<String> {
    use crate::analysis::class::VariantClass;
    // The rows that changed against their parent (NOT EXERCISED is listed: it says the
    // commit's code never ran).
    let listed = |c: VariantClass| match c {
        VariantClass::NoChange | VariantClass::NotDecided => false,
        VariantClass::Fixed
        | VariantClass::Improved
        | VariantClass::Regressed
        | VariantClass::NotExercised => true,
    };
    let mut out = Vec::new();
    for c in &t.commits {
        if let Some(e) = &c.does_not_build {
            out.push(format!("{} DOES NOT BUILD: {e}", c.step.label));
            continue;
        }
        for v in c.variants.iter().filter(|v| listed(v.vs_parent.class)) {
            let what = v
                .numbers
                .as_ref()
                .map_or_else(String::new, |n| format!(": {}", numbers_words(n, false)));
            out.push(format!(
                "{} {} {}{what}",
                c.step.label,
                v.vs_parent.class.word(),
                v.variant
            ));
        }
    }
    if out.is_empty() {
        let undecided = t
            .commits
            .iter()
            .flat_map(|c| &c.variants)
            .filter(|v| v.vs_parent.class == VariantClass::NotDecided)
            .count();
        out.push(if undecided == 0 {
            format!(
                "no commit changed anything: every row of {} commit(s) is NO CHANGE against its parent",
                t.commits.len()
            )
        } else {
            format!(
                "no commit is established to change anything; {undecided} row(s) NOT DECIDED (more --boots or --reps can decide)"
            )
        });
    }
    out
}

/// The rows of the table: one per commit × variant, a commit that does not build one row
/// with its error.
fn rows(t: &SeriesTable) -> Vec<[String; 8]> {
    let mut out = Vec::new();
    for c in &t.commits {
        if let Some(e) = &c.does_not_build {
            out.push([
                c.step.label.clone(),
                "-".into(),
                format!("DOES NOT BUILD: {e}"),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
                String::new(),
            ]);
            continue;
        }
        for v in &c.variants {
            let [parent, commit, pct, metric] = if c.object_identical() {
                // Its parent's runs are its own: no number of its own to show.
                let none = || "-".to_string();
                [none(), none(), none(), NOT_BOOTED.to_string()]
            } else {
                number_cells(v.numbers.as_ref())
            };
            out.push([
                c.step.label.clone(),
                v.variant.clone(),
                v.vs_parent.class.word().into(),
                v.vs_base.class.word().into(),
                parent,
                commit,
                pct,
                metric,
            ]);
        }
    }
    out
}

/// What a commit's metric cell says when its object code is its parent's.
const NOT_BOOTED: &str = "object code identical to its parent's: not booted";

/// Each commit's object code against its parent's, one line each, when any was compared.
fn object_lines(t: &SeriesTable) -> Vec<String> {
    let lines: Vec<String> = t
        .commits
        .iter()
        .filter_map(|c| {
            let d = c.object.as_ref()?;
            let booted = if c.object_identical() {
                "not booted"
            } else {
                "booted"
            };
            Some(format!(
                "  {}: {} ({booted})",
                c.step.label,
                super::objdiff::brief(d)
            ))
        })
        .collect();
    if lines.is_empty() {
        return lines;
    }
    std::iter::once(
        "object code, each commit against its parent (line-number constants aside):".to_string(),
    )
    .chain(lines)
    .collect()
}

/// Where a per-patch run or a bisection spent its time, as kab prints it: building, the boots
/// made, judging, and the wall time of all of it.
pub fn phases_line(p: &PhaseTimes) -> String {
    format!(
        "time: build {}, {} boot(s) {}, judging {}; wall time {}",
        duration(p.build_s),
        p.boots,
        duration(p.boots_s),
        duration(p.judge_s),
        duration(p.total_s)
    )
}

impl std::fmt::Display for SeriesNote {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SeriesNote::Shard { shard } => write!(
                f,
                "shard {shard}: its commits only, each booted against its parent on this host (a parent is booted again by its child's shard: the shards may run on different hosts); `hvlab merge` the shards' files, then run this command again without --shard against the merged store for the whole table"
            ),
            SeriesNote::ReusedBoots { boots } => write!(
                f,
                "boots found in the store and not made again: {}",
                boots
                    .iter()
                    .map(|(l, n)| format!("{l} ({n})"))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
            SeriesNote::Build(note) => note.fmt(f),
        }
    }
}

/// The terminal text: the answer, then the table, then the notes.
pub fn render(t: &SeriesTable, notes: &[SeriesNote]) -> String {
    let mut out = answer(t);
    out.push(String::new());
    out.push(format!(
        "{} commit(s) on {}, each against its parent and against the base; {} comparisons corrected together",
        t.commits.len(),
        t.base,
        t.judged_together
    ));
    out.push(String::new());
    let header = [
        "commit",
        "variant",
        "vs parent",
        "vs base",
        "parent ±%sd",
        "commit ±%sd",
        "%change",
        "metric",
    ];
    let rows = rows(t);
    let widths: Vec<usize> = (0..header.len())
        .map(|i| {
            escape::column_width(
                std::iter::once(header[i].chars().count()).chain(
                    rows.iter()
                        .filter(|r| !r[3].is_empty() || i < 2)
                        .map(|r| r[i].chars().count()),
                ),
            )
        })
        .collect();
    let line = |cells: &[String]| {
        cells
            .iter()
            .zip(&widths)
            .map(|(c, &w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let header: Vec<String> = header.iter().map(ToString::to_string).collect();
    out.push(line(&header));
    out.push(
        widths
            .iter()
            .map(|&w| "-".repeat(w))
            .collect::<Vec<_>>()
            .join("  "),
    );
    for r in &rows {
        // A commit that does not build: its label, then the error unpadded.
        if r[3].is_empty() {
            out.push(format!(
                "{:<w0$}  {:<w1$}  {}",
                r[0],
                r[1],
                r[2],
                w0 = widths[0],
                w1 = widths[1]
            ));
        } else {
            out.push(line(r));
        }
    }
    let objects = object_lines(t);
    if !objects.is_empty() {
        out.push(String::new());
        out.extend(objects);
    }
    if !notes.is_empty() {
        out.push(String::new());
        out.extend(notes.iter().map(|n| format!("note: {n}")));
    }
    out.join("\n")
}

/// A patch's section of the cover letter: its title, what it was judged against, and a row
/// per variant.
fn section(c: &CommitRow, base: &str) -> Vec<String> {
    let mut out = vec![
        format!(
            "### {} {}",
            escape::markdown(&c.step.label),
            escape::markdown(&c.step.subject)
        ),
        String::new(),
    ];
    if let Some(e) = &c.does_not_build {
        out.push(format!(
            "Does not build: `{}`",
            e.replace('`', "'").replace('\n', " ")
        ));
        return out;
    }
    out.push(format!(
        "Against its parent ({}) and the base (`{}`):",
        escape::markdown(&c.parent),
        base.replace('`', "'")
    ));
    out.push(String::new());
    out.push("| variant | vs parent | vs base | parent | commit | %change |".into());
    out.push("|---|---|---|---|---|---|".into());
    out.extend(c.variants.iter().map(markdown_row));
    if let Some(d) = &c.object {
        out.push(String::new());
        let booted = if c.object_identical() {
            ": not booted, an exact NO CHANGE"
        } else {
            ""
        };
        out.push(format!(
            "Object code against its parent: {}{booted}.",
            escape::markdown(&super::objdiff::brief(d))
        ));
    }
    out
}

fn markdown_row(v: &VariantRow) -> String {
    let [parent, commit, pct, metric] = number_cells(v.numbers.as_ref());
    let pct = if v.numbers.is_some() {
        format!("{pct} {metric}")
    } else {
        pct
    };
    format!(
        "| {} | {} | {} | {} | {} | {} |",
        escape::markdown_cell(&v.variant),
        v.vs_parent.class.word(),
        v.vs_base.class.word(),
        escape::markdown_cell(&parent),
        escape::markdown_cell(&commit),
        escape::markdown_cell(&pct)
    )
}

/// The cover letter's Markdown: the answer, a section per patch, and the command that
/// reproduces it.
pub fn markdown(t: &SeriesTable, command: &str) -> String {
    let mut out = vec![
        format!(
            "**hvlab kab --per-patch** on `{}`: {} commit(s), each against its parent and the base, {} comparisons corrected together",
            t.base.replace('`', "'"),
            t.commits.len(),
            t.judged_together
        ),
        String::new(),
    ];
    out.extend(
        answer(t)
            .iter()
            .map(|a| format!("- {}", escape::markdown(a))),
    );
    for c in &t.commits {
        out.push(String::new());
        out.extend(section(c, &t.base));
    }
    out.push(String::new());
    out.push(format!("Reproduce: `{}`", command.replace('`', "'")));
    out.join("\n") + "\n"
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::analysis::class::VariantClass;
    use crate::lab::kab::VariantVerdict;
    use crate::lab::series::SeriesStep;

    fn verdict(variant: &str, class: VariantClass) -> VariantVerdict {
        VariantVerdict::of_class("lifecycle", variant, class)
    }

    fn commit(position: usize, variants: Vec<VariantRow>, error: Option<&str>) -> CommitRow {
        CommitRow {
            position,
            step: SeriesStep {
                label: format!("[PATCH {position}/3]"),
                subject: format!("KVM: change {position}"),
                spec: crate::kernel::build::PatchedSpec::named(&format!("debian:7.3+{position}")),
            },
            parent: if position == 1 {
                "base".into()
            } else {
                format!("[PATCH {}/3]", position - 1)
            },
            does_not_build: error.map(String::from),
            object: None,
            variants,
        }
    }

    fn table() -> SeriesTable {
        let row = |variant: &str,
                   parent: VariantClass,
                   base: VariantClass,
                   numbers: Option<Numbers>| VariantRow {
            scenario: "lifecycle".into(),
            variant: variant.into(),
            vs_parent: verdict(variant, parent),
            vs_base: verdict(variant, base),
            numbers,
        };
        let slower = Numbers {
            metric: "ioctl.kvm_irqfd_ms".into(),
            unit: "ms".into(),
            parent: 12.0,
            commit: 15.5,
            change_pct: 29.166,
            stddev_pct: [2.5, 3.25],
        };
        SeriesTable {
            base: "debian:7.3".into(),
            commits: vec![
                commit(
                    1,
                    vec![row(
                        "irqchip-first",
                        VariantClass::NoChange,
                        VariantClass::NoChange,
                        None,
                    )],
                    None,
                ),
                commit(
                    2,
                    Vec::new(),
                    Some("kvm_main.c:17:3: error: `x` undeclared"),
                ),
                commit(
                    3,
                    vec![row(
                        "irqchip-first",
                        VariantClass::Regressed,
                        VariantClass::Regressed,
                        Some(slower),
                    )],
                    None,
                ),
            ],
            judged_together: 12,
        }
    }

    #[test]
    fn the_answer_comes_first_and_each_row_has_both_verdicts_and_lkp_numbers() {
        let text = render(
            &table(),
            &[SeriesNote::ReusedBoots {
                boots: vec![("base".into(), 4), ("a1b2c3d".into(), 2)],
            }],
        );
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[0],
            "[PATCH 2/3] DOES NOT BUILD: kvm_main.c:17:3: error: `x` undeclared"
        );
        assert_eq!(
            lines[1],
            "[PATCH 3/3] REGRESSED irqchip-first: ioctl.kvm_irqfd_ms 12.0 → 15.5 ms (+29.2%)"
        );
        let row = lines
            .iter()
            .find(|l| l.starts_with("[PATCH 3/3]  "))
            .expect("commit 3's row");
        let cells: Vec<&str> = row.split("  ").filter(|c| !c.trim().is_empty()).collect();
        assert_eq!(
            cells.iter().map(|c| c.trim()).collect::<Vec<_>>(),
            [
                "[PATCH 3/3]",
                "irqchip-first",
                "REGRESSED",
                "REGRESSED",
                "12.0 ±2.50%",
                "15.5 ±3.25%",
                "+29.2%",
                "ioctl.kvm_irqfd_ms (ms)"
            ]
        );
        assert!(text.contains("[PATCH 2/3]  -"), "{text}");
        assert!(
            text.ends_with(
                "note: boots found in the store and not made again: base (4), a1b2c3d (2)"
            ),
            "{text}"
        );
    }

    /// A commit whose object code is its parent's says so in its row (no numbers of its
    /// own), and every compared commit's delta is listed after the table and in its section.
    #[test]
    fn a_commit_not_booted_for_identical_object_code_says_so() {
        use crate::kernel::objdiff::Delta;
        use crate::kernel::objdiff::tests::kvm_delta as delta;
        let mut t = table();
        t.commits[0].object = Some(delta(Delta::Identical {
            bytes: 589,
            line_numbers: 9,
        }));
        t.commits[2].object = Some(delta(Delta::Grown { from: 589, to: 619 }));
        let text = render(&t, &[]);
        let row = text
            .lines()
            .find(|l| l.starts_with("[PATCH 1/3]  "))
            .expect("commit 1's row");
        assert!(row.contains("NO CHANGE"), "{row}");
        assert!(row.ends_with(NOT_BOOTED), "{row}");
        assert!(!row.contains('%'), "no numbers of its own: {row}");
        assert!(
            text.contains(
                "  [PATCH 1/3]: identical: kvm.ko (9 line-number constants moved) (not booted)"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "  [PATCH 3/3]: kvm.ko: kvm_io_bus_register_dev 589 → 619 (+30) (booted)"
            ),
            "{text}"
        );
        let md = markdown(&t, "hvlab kab debian:7.3 debian:7.3+s.mbox --per-patch");
        assert!(
            md.contains(&format!(
                "Object code against its parent: {}: not booted, an exact NO CHANGE.",
                escape::markdown("identical: kvm.ko (9 line-number constants moved)")
            )),
            "{md}"
        );
    }

    #[test]
    fn the_markdown_has_a_section_per_patch_with_cells_escaped() {
        let md = markdown(
            &table(),
            "hvlab kab debian:7.3 debian:7.3+s.mbox --per-patch",
        );
        let sections: Vec<&str> = md.lines().filter(|l| l.starts_with("### ")).collect();
        assert_eq!(
            sections,
            [
                "### \\[PATCH 1/3\\] KVM: change 1",
                "### \\[PATCH 2/3\\] KVM: change 2",
                "### \\[PATCH 3/3\\] KVM: change 3"
            ]
        );
        assert!(
            md.contains("| irqchip-first | REGRESSED | REGRESSED | 12.0 ±2.50% | 15.5 ±3.25% | +29.2% ioctl.kvm_irqfd_ms (ms) |"),
            "{md}"
        );
        assert!(
            md.contains("Does not build: `kvm_main.c:17:3: error: 'x' undeclared`"),
            "{md}"
        );
        assert!(md.ends_with("--per-patch`\n"), "{md}");
    }
}
