use super::*;
use crate::kernel::patch::PatchFile;

/// `source` compiled as the kernel compiles a module's objects (no PIE, the kernel code
/// model, -O2), into an object file's bytes.
pub(crate) fn compiled(dir: &Path, name: &str, source: &str, extra: &[&str]) -> Vec<u8> {
    let c = dir.join(format!("{name}.c"));
    let o = dir.join(format!("{name}.o"));
    std::fs::write(&c, source).expect("write C");
    let out = std::process::Command::new("cc")
        .args(["-O2", "-fno-pie", "-mcmodel=kernel", "-c"])
        .args(extra)
        .arg(&c)
        .arg("-o")
        .arg(&o)
        .output()
        .expect("cc runs (a C compiler is what building hvlab needs)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&o).expect("object")
}

/// A patch of `old` into `new` as `diff -u` writes it, parsed.
pub(crate) fn diff_of(dir: &Path, old: &str, new: &str) -> PatchFile {
    let (a, b) = (dir.join("a.c"), dir.join("b.c"));
    std::fs::write(&a, old).expect("a");
    std::fs::write(&b, new).expect("b");
    let out = std::process::Command::new("diff")
        .args(["-u", "--label", "a/m.c", "--label", "b/m.c"])
        .arg(&a)
        .arg(&b)
        .output()
        .expect("diff runs");
    let p = dir.join("change.patch");
    std::fs::write(&p, &out.stdout).expect("patch");
    PatchFile::read(&p).expect("parses")
}

/// Code with a line number in an immediate (`warn_at(__LINE__)`), in a bug table entry no
/// symbol names, calls between static functions of one `.text`, and a string.
const BASE: &str = r#"#define barrier() asm volatile("" ::: "memory")
#define str(x) #x
#define xstr(x) str(x)
#define BUG_ENTRY() asm(".pushsection __bug_table,\"aw\"\n.long 0\n.short " xstr(__LINE__) "\n.short 1\n.popsection")
void warn_at(const char *file, int line);
extern int sink;

static __attribute__((noinline)) int helper(int *p)
{
	return *p + 1;
}

int reload(int *p)
{
	int a = *p;
	/* BARRIER */
	return a + *p;
}

int warns(int *p)
{
	if (*p > 3)
		warn_at("m.c", __LINE__);
	BUG_ENTRY();
	return helper(p);
}

int caller(int *p)
{
	sink = helper(p);
	return reload(p) * 3;
}
"#;

fn delta_of(old: &str, new: &str) -> ModuleDelta {
    let dir = tempfile::tempdir().expect("tempdir");
    let patch = diff_of(dir.path(), old, new);
    let a = compiled(dir.path(), "a", old, &["-g0"]);
    let b = compiled(dir.path(), "b", new, &["-g0"]);
    let patches = [patch];
    compare_bytes(
        (Path::new("a.o"), &a),
        (Path::new("b.o"), &b),
        "m",
        &LineShift::of(&patches),
    )
    .expect("compares")
}

/// A function's delta by its name before the dot: GCC may clone a static function
/// (`helper.isra`).
fn named(f: &[(&str, Delta)], n: &str) -> Option<Delta> {
    f.iter()
        .find(|(m, _)| m.split('.').next() == Some(n))
        .map(|(_, d)| *d)
}

/// `reload`, where the barrier went, changed: it loads `*p` twice.
fn assert_reload_changed(f: &[(&str, Delta)]) {
    assert!(
        matches!(
            named(f, "reload"),
            Some(Delta::Grown { .. } | Delta::ChangedSameSize { .. })
        ),
        "{f:?}"
    );
}

/// Two builds whose one rebuilt module, kvm.ko, differs in `kvm_io_bus_register_dev` as
/// `delta` says: a fixture of the delta's readers.
pub(crate) fn kvm_delta(delta: Delta) -> BuildsDelta {
    BuildsDelta {
        modules: vec![ModuleDelta {
            module: "kvm".into(),
            units: vec![UnitDelta {
                kind: UnitKind::Function,
                name: "kvm_io_bus_register_dev".into(),
                delta,
            }],
        }],
        not_compared: Vec::new(),
    }
}

fn functions(d: &ModuleDelta) -> Vec<(&str, Delta)> {
    d.units
        .iter()
        .filter(|u| u.kind == UnitKind::Function)
        .map(|u| (u.name.as_str(), u.delta))
        .collect()
}

/// A comment that moves every line below it: every function and the bug table identical,
/// the moved `__LINE__`s counted as line numbers.
#[test]
fn a_comment_only_change_leaves_every_function_identical() {
    let new = BASE.replace(
        "static __attribute__",
        "/*\n * A comment of three lines\n * that moves the code below.\n */\nstatic __attribute__",
    );
    let d = delta_of(BASE, &new);
    assert!(d.identical(), "{:#?}", d.changed().collect::<Vec<_>>());
    let lines: u32 = d
        .units
        .iter()
        .map(|u| match u.delta {
            Delta::Identical { line_numbers, .. } => line_numbers,
            _ => 0,
        })
        .sum();
    // warn_at's immediate and the bug table's 16-bit line.
    assert_eq!(lines, 2, "{d:#?}");
    assert_eq!(functions(&d).len(), 4);
    // Without the patch's line shift, the same bytes are a change.
    let dir = tempfile::tempdir().expect("tempdir");
    let a = compiled(dir.path(), "a", BASE, &["-g0"]);
    let b = compiled(dir.path(), "b", &new, &["-g0"]);
    let blind = compare_bytes(
        (Path::new("a.o"), &a),
        (Path::new("b.o"), &b),
        "m",
        &LineShift::none(),
    )
    .expect("compares");
    assert!(!blind.identical());
}

/// `barrier()` between two loads of `*p` makes the compiler load it twice: that function
/// grows; `caller`, which inlines nothing of it, stays identical though `.text` moved.
#[test]
fn a_barrier_changes_the_function_it_is_in_and_nothing_else() {
    let new = BASE.replace("/* BARRIER */", "barrier();");
    let d = delta_of(BASE, &new);
    let f = functions(&d);
    let of = |n: &str| named(&f, n);
    assert_reload_changed(&f);
    for n in ["helper", "warns"] {
        assert!(of(n).is_some_and(|d| d.is_identical()), "{n}: {f:?}");
    }
    // `caller` may inline `reload`: then it changes too, as its code does.
    let changed: Vec<&str> = f
        .iter()
        .filter(|(_, d)| !d.is_identical())
        .filter_map(|(n, _)| n.split('.').next())
        .collect();
    assert!(
        changed.iter().all(|n| ["reload", "caller"].contains(n)),
        "{changed:?}"
    );
}

/// A function added, one removed, a string changed: bloat-o-meter's view with bytes.
#[test]
fn added_removed_and_grown_functions_are_told_with_bytes() {
    let new = BASE
        .replace(
            "int caller(int *p)\n{\n\tsink = helper(p);\n\treturn reload(p) * 3;\n}\n",
            "int fresh(int *p)\n{\n\treturn *p * 7 + sink;\n}\n",
        )
        .replace("warn_at(\"m.c\"", "warn_at(\"mm.c\"");
    let d = delta_of(BASE, &new);
    let f = functions(&d);
    assert!(
        f.iter()
            .any(|(n, d)| *n == "fresh" && matches!(d, Delta::Added { bytes } if *bytes > 0)),
        "{f:?}"
    );
    assert!(
        f.iter()
            .any(|(n, d)| *n == "caller" && matches!(d, Delta::Removed { bytes } if *bytes > 0)),
        "{f:?}"
    );
    // The string `warns` names changed: its code is the same, what it points at is not.
    assert!(
        f.iter()
            .any(|(n, d)| *n == "warns" && matches!(d, Delta::ChangedSameSize { .. })),
        "{f:?}"
    );
    let s = d.summary(UnitKind::Function);
    assert_eq!((s.added, s.removed), (1, 1));
    let net: i64 = f.iter().map(|(_, d)| d.bytes_change()).sum();
    assert_eq!(s.net_bytes, net);
}

#[test]
fn clone_numbers_are_not_part_of_a_name() {
    assert_eq!(
        normalised("__direct_pte_prefetch.isra.0"),
        "__direct_pte_prefetch.isra"
    );
    assert_eq!(normalised("f.constprop.0.isra.0"), "f.constprop.isra");
    assert_eq!(normalised("__key.123"), "__key");
    assert_eq!(normalised("kvm_mmu_page_fault"), "kvm_mmu_page_fault");
    assert_eq!(normalised("f.cold"), "f.cold");
}

/// `source` (with the symbols it names defined after it) linked into a static executable at
/// its own addresses, as vmlinux is: no relocations, every call and RIP-relative field a
/// resolved address.
fn linked(dir: &Path, name: &str, source: &str) -> Vec<u8> {
    let c = dir.join(format!("{name}.c"));
    let exe = dir.join(name);
    let defined = format!(
        "{source}\nvoid warn_at(const char *file, int line) {{ asm volatile(\"\" :: \"r\"(file), \"r\"(line)); }}\nint sink;\n__attribute__((section(\".other.text\"), noinline)) int elsewhere(int *p) {{ return warns(p) + 1; }}\n"
    );
    std::fs::write(&c, defined).expect("write C");
    let out = std::process::Command::new("cc")
        .args(["-O2", "-g0", "-fno-pie", "-no-pie", "-nostdlib", "-static"])
        .args(["-Wl,-e,elsewhere", "-Wl,--build-id=none"])
        .arg(&c)
        .arg("-o")
        .arg(&exe)
        .output()
        .expect("cc runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::read(&exe).expect("executable")
}

/// A linked executable (vmlinux) is compared by what its addresses name: a comment moves
/// line numbers only, and a function that grows moves every function after it, whose calls
/// and data references (another section's `elsewhere` included) still name the same symbols.
#[test]
fn a_linked_executable_is_compared_by_what_its_addresses_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let compare = |old: &str, new: &str| {
        let patch = diff_of(dir.path(), old, new);
        let (a, b) = (linked(dir.path(), "a", old), linked(dir.path(), "b", new));
        compare_bytes(
            (Path::new("a"), &a),
            (Path::new("b"), &b),
            VMLINUX,
            &LineShift::of(&[patch]),
        )
        .expect("compares")
    };
    let comment = BASE.replace(
        "static __attribute__",
        "/*\n * A comment of three lines\n * that moves the code below.\n */\nstatic __attribute__",
    );
    let d = compare(BASE, &comment);
    assert!(d.identical(), "{:#?}", d.changed().collect::<Vec<_>>());
    assert!(functions(&d).len() >= 5, "{:?}", functions(&d));

    let barrier = BASE.replace("/* BARRIER */", "barrier();");
    let d = compare(BASE, &barrier);
    let f = functions(&d);
    let of = |n: &str| named(&f, n);
    assert_reload_changed(&f);
    // After reload in .text, so moved; calling helper and warn_at, and from another section warns.
    for n in ["helper", "warns", "warn_at", "elsewhere"] {
        assert!(of(n).is_some_and(|d| d.is_identical()), "{n}: {f:?}");
    }
}
