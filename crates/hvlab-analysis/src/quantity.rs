//! One formatter for every quantity hvlab prints (terminal, Markdown, HTML, JSON sentences):
//! times scaled to ns/µs/ms/s, sizes to B/KiB/MiB/GiB, counts exact with thousands separators,
//! ratios as `9.1×`, percentages, p-values as `0.003` or `< 0.001`. Three significant digits
//! throughout (whole digits are never rounded away), so `24630000.0 ns` reads `24.6 ms` and
//! two figures side by side (`4.67 µs vs 42.6 µs`) read in the same unit. Times measured on
//! QEMU's instruction clock are instruction counts (`insn`, `kinsn`, `Minsn`, `Ginsn`: the
//! virtual ns, µs, ms and s they were measured as) and read as such: `4,858 instructions`,
//! `6.96 M instructions`.

/// What a unit measures, and its factor to the kind's base unit (ns for time, bytes for sizes).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    /// Nanoseconds per unit.
    Time(f64),
    /// Bytes per unit.
    Bytes(f64),
    /// Guest instructions per unit (the instruction clock's time).
    Instructions(f64),
    /// An exact count, printed bare.
    Count,
    /// A dimensionless number (a per-iteration rate), printed bare.
    Plain,
    /// A ratio of two quantities: `9.1×`.
    Ratio,
    /// A percentage: `31%`.
    Percent,
    /// Any other unit, printed after the number (`cycles`, `jiffies`, `pages`).
    Other,
}

fn kind(unit: &str) -> Kind {
    match unit {
        "ns" => Kind::Time(1.0),
        "us" | "µs" | "μs" => Kind::Time(1e3),
        "ms" => Kind::Time(1e6),
        "s" => Kind::Time(1e9),
        "insn" => Kind::Instructions(1.0),
        "kinsn" => Kind::Instructions(1e3),
        "Minsn" => Kind::Instructions(1e6),
        "Ginsn" => Kind::Instructions(1e9),
        "B" | "bytes" | "byte" => Kind::Bytes(1.0),
        "KiB" => Kind::Bytes(1024.0),
        "MiB" => Kind::Bytes(1024.0 * 1024.0),
        "GiB" => Kind::Bytes(1024.0 * 1024.0 * 1024.0),
        "count" => Kind::Count,
        "" | "ratio" => Kind::Plain,
        "×" | "x" => Kind::Ratio,
        "%" => Kind::Percent,
        _ => Kind::Other,
    }
}

const TIME_UNITS: [(f64, &str); 4] = [(1.0, "ns"), (1e3, "µs"), (1e6, "ms"), (1e9, "s")];
/// Instructions in full below a million (`16,312 instructions`: every whole digit is kept),
/// then in millions and billions.
const INSTRUCTION_UNITS: [(f64, &str); 3] = [
    (1.0, "instructions"),
    (1e6, "M instructions"),
    (1e9, "G instructions"),
];
const BYTE_UNITS: [&str; 7] = ["B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];

/// `x` rounded to three significant digits, whole digits kept (65,536.4 → 65,536).
fn round3(x: f64) -> (f64, usize) {
    if x == 0.0 || !x.is_finite() {
        return (x, 0);
    }
    let decimals = |a: f64| -> usize {
        // |log10| of a finite non-zero f64 is below 400: the cast is exact.
        #[allow(clippy::cast_possible_truncation)]
        let mag = a.abs().log10().floor() as i32;
        usize::try_from((2 - mag).clamp(0, 12)).unwrap_or(0)
    };
    let d = decimals(x);
    let scale = 10f64.powi(i32::try_from(d).unwrap_or(0));
    let r = (x * scale).round() / scale;
    // 9.996 rounds to 10.00: one decimal fewer then.
    let d2 = if r == 0.0 { d } else { decimals(r).min(d) };
    (r, d2)
}

/// A number with three significant digits and thousands separators: `7.85`, `0.625`, `65,536`.
pub fn number(x: f64) -> String {
    if !x.is_finite() {
        return "n/a".to_string();
    }
    let (r, d) = round3(x);
    fixed(r, d)
}

/// `x` with `d` decimals and the whole part grouped by thousands.
fn fixed(x: f64, d: usize) -> String {
    let text = format!("{:.d$}", x.abs());
    let (whole, frac) = text
        .split_once('.')
        .map_or((text.as_str(), ""), |(w, f)| (w, f));
    let mut out = String::with_capacity(text.len() + whole.len() / 3 + 1);
    if x < 0.0 && text.chars().any(|c| c.is_ascii_digit() && c != '0') {
        out.push('-');
    }
    for (i, c) in whole.chars().enumerate() {
        if i > 0 && (whole.len() - i) % 3 == 0 {
            out.push(',');
        }
        out.push(c);
    }
    if !frac.is_empty() {
        out.push('.');
        out.push_str(frac);
    }
    out
}

/// An exact count: whole numbers in full with separators (`65,536`), others to three digits.
pub fn count(n: f64) -> String {
    if n.is_finite() && n.fract() == 0.0 && n.abs() < 1e15 {
        fixed(n, 0)
    } else {
        number(n)
    }
}

/// A ratio: `1.05×` (two decimals below 2, so small changes are told from 1), `9.1×`, `126×`.
pub fn ratio(r: f64) -> String {
    if !r.is_finite() {
        return "n/a".to_string();
    }
    let d = if r.abs() < 2.0 {
        2
    } else if r.abs() < 100.0 {
        1
    } else {
        0
    };
    format!("{}×", fixed(r, d))
}

/// A number to decimals fixed by its magnitude, for figures read side by side in a column of
/// one unit (a kab's jiffies: `0.038 → 0.064`): three below 1, two below 100, none from 100 or
/// for a whole number, and no thousands separators. [`number`] keeps three significant
/// digits instead (`0.0384`).
pub fn fixed_decimals(x: f64) -> String {
    if x.abs() >= 100.0 || x == x.trunc() {
        format!("{x:.0}")
    } else if x.abs() >= 1.0 {
        format!("{x:.2}")
    } else {
        format!("{x:.3}")
    }
}

/// A p-value: `0.72`, `0.003`, `< 0.001` (an exact test's p below a thousandth says no more).
pub fn p_value(p: f64) -> String {
    if !p.is_finite() {
        "n/a".to_string()
    } else if p < 0.001 {
        "< 0.001".to_string()
    } else if p < 0.01 {
        format!("{p:.3}")
    } else {
        format!("{p:.2}")
    }
}

/// `p = 0.003` or `p < 0.001`: the p-value after its own sign.
pub fn p_equals(p: f64) -> String {
    let text = p_value(p);
    if text.starts_with('<') {
        format!("p {text}")
    } else {
        format!("p = {text}")
    }
}

/// A size in bytes: `0 B`, `512 B`, `1.00 KiB`, `80.0 GiB`.
pub fn bytes(n: u64) -> String {
    // Precision beyond 2^53 bytes is not shown anyway.
    #[allow(clippy::cast_precision_loss)]
    format(n as f64, "B")
}

/// The scale (factor from the base unit, and its name) that shows `largest` best.
fn scale_for(k: Kind, largest: f64) -> Option<(f64, String)> {
    let a = round3(largest.abs()).0;
    match k {
        // All zero (or none): the unit as asked, "0 ms".
        Kind::Time(f) if a == 0.0 => TIME_UNITS
            .iter()
            .find(|u| u.0 == f)
            .map(|u| (u.0, u.1.to_string())),
        Kind::Time(_) => {
            let mut pick = TIME_UNITS[0];
            for u in TIME_UNITS {
                if a >= u.0 {
                    pick = u;
                }
            }
            Some((pick.0, pick.1.to_string()))
        }
        Kind::Instructions(_) => {
            let mut pick = INSTRUCTION_UNITS[0];
            for u in INSTRUCTION_UNITS {
                if a >= u.0 {
                    pick = u;
                }
            }
            Some((pick.0, pick.1.to_string()))
        }
        Kind::Bytes(f) if a == 0.0 => BYTE_UNITS
            .iter()
            .zip(0..)
            .find(|(_, i)| 1024f64.powi(*i) == f)
            .map(|(u, i)| (1024f64.powi(i), (*u).to_string())),
        Kind::Bytes(_) => {
            let mut factor = 1.0;
            let mut unit = BYTE_UNITS[0];
            for u in &BYTE_UNITS[1..] {
                if round3(a / factor).0 < 1024.0 {
                    break;
                }
                factor *= 1024.0;
                unit = u;
            }
            Some((factor, unit.to_string()))
        }
        _ => None,
    }
}

/// Values of one unit formatted on one shared scale, the one that suits the largest: a row of
/// a table or the two sides of a comparison read in the same unit (`0.625 ms vs 7.85 ms`).
pub fn format_all(values: &[f64], unit: &str) -> Vec<String> {
    // A derived unit (`ns/page`) scales its numerator.
    if let Some((num, per)) = unit.split_once('/')
        && matches!(
            kind(num),
            Kind::Time(_) | Kind::Bytes(_) | Kind::Instructions(_)
        )
    {
        return format_all(values, num)
            .into_iter()
            .map(|s| format!("{s}/{per}"))
            .collect();
    }
    let k = kind(unit);
    let one = |v: f64, scale: Option<&(f64, String)>| -> String {
        if !v.is_finite() {
            return "n/a".to_string();
        }
        match (k, scale) {
            (Kind::Time(f) | Kind::Bytes(f) | Kind::Instructions(f), Some((s, name))) => {
                let base = v * f;
                // Whole bytes below a KiB are exact: `0 B`, `512 B`.
                if matches!(k, Kind::Bytes(_)) && name == "B" && base.fract() == 0.0 {
                    return format!("{} B", fixed(base, 0));
                }
                if base == 0.0 {
                    return format!("0 {name}");
                }
                format!("{} {name}", number(base / s))
            }
            (Kind::Count, _) => count(v),
            (Kind::Plain, _) => number(v),
            (Kind::Ratio, _) => ratio(v),
            (Kind::Percent, _) => {
                let d = if v.abs() >= 10.0 || v == 0.0 {
                    0
                } else if v.abs() >= 1.0 {
                    1
                } else {
                    2
                };
                format!("{}%", fixed(v, d))
            }
            _ => format!("{} {unit}", count_or_number(v)),
        }
    };
    let largest = values
        .iter()
        .filter(|v| v.is_finite())
        .map(|v| match k {
            Kind::Time(f) | Kind::Bytes(f) | Kind::Instructions(f) => (v * f).abs(),
            _ => v.abs(),
        })
        .fold(0.0, f64::max);
    let smallest = values
        .iter()
        .filter(|v| v.is_finite() && **v != 0.0)
        .map(|v| match k {
            Kind::Time(f) | Kind::Bytes(f) | Kind::Instructions(f) => (v * f).abs(),
            _ => v.abs(),
        })
        .fold(f64::INFINITY, f64::min);
    // Three orders of magnitude apart, one scale would print "0.00910 ms vs 40.0 ms": each
    // value gets its own then.
    if smallest.is_finite() && largest / smallest > 1000.0 {
        return values
            .iter()
            .map(|v| {
                let own = match k {
                    Kind::Time(f) | Kind::Bytes(f) | Kind::Instructions(f) => (v * f).abs(),
                    _ => v.abs(),
                };
                one(*v, scale_for(k, own).as_ref())
            })
            .collect();
    }
    let scale = scale_for(k, largest);
    values.iter().map(|v| one(*v, scale.as_ref())).collect()
}

fn count_or_number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        fixed(v, 0)
    } else {
        number(v)
    }
}

/// One value with its unit, on the scale that suits it: `24.6 ms`, `4.67 µs`, `65,536`,
/// `1.00 KiB`, `9.1×`, `31%`.
pub fn format(value: f64, unit: &str) -> String {
    format_all(&[value], unit).pop().unwrap_or_default()
}

/// An axis label: the value on its own best scale, trailing zeros dropped (`1 µs`, `2.5 ms`,
/// `65,536`).
pub fn tick(value: f64, unit: &str) -> String {
    let text = format(value, unit);
    let (num, rest) =
        match text.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == ',' || c == '-')) {
            Some(i) => text.split_at(i),
            None => (text.as_str(), ""),
        };
    if num.contains('.') {
        let trimmed = num.trim_end_matches('0').trim_end_matches('.');
        format!("{trimmed}{rest}")
    } else {
        text
    }
}

/// A range on one scale, the unit once: `7.50–7.70 ms`, `112–168 KiB`.
pub fn format_range(lo: f64, hi: f64, unit: &str) -> String {
    let both = format_all(&[lo, hi], unit);
    let (a, b) = (&both[0], &both[1]);
    if a == b {
        return a.clone();
    }
    // The number, then its unit (which may be words: `M instructions`).
    match (a.split_once(' '), b.split_once(' ')) {
        (Some((x, u)), Some((y, v))) if u == v => format!("{x}–{y} {u}"),
        _ => format!("{a}–{b}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_decimals_go_by_magnitude_not_significant_digits() {
        let cases = [
            (0.0384, "0.038"),
            (0.0104, "0.010"),
            (1.666, "1.67"),
            (12.346, "12.35"),
            (20.0, "20"),
            (1234.4, "1234"),
            (-0.5, "-0.500"),
        ];
        for (x, text) in cases {
            assert_eq!(fixed_decimals(x), text, "{x}");
        }
        assert_ne!(fixed_decimals(0.0384), number(0.0384));
    }
    use proptest::prelude::*;

    #[test]
    fn times_scale_to_the_unit_that_reads_best() {
        assert_eq!(format(24_630_000.0, "ns"), "24.6 ms");
        assert_eq!(format(4669.1, "ns"), "4.67 µs");
        assert_eq!(format(42_574.8, "ns"), "42.6 µs");
        assert_eq!(format(42.57, "us"), "42.6 µs");
        assert_eq!(format(7.85, "ms"), "7.85 ms");
        assert_eq!(format(0.625, "ms"), "625 µs");
        assert_eq!(format(999.6, "ns"), "1.00 µs");
        assert_eq!(format(3.0, "ns"), "3.00 ns");
        assert_eq!(format(0.0, "ms"), "0 ms");
        assert_eq!(format(5400.0, "s"), "5,400 s");
        assert_eq!(format(14_000.0, "ns/page"), "14.0 µs/page");
        assert_eq!(format(f64::NAN, "ms"), "n/a");
    }

    #[test]
    fn a_shared_scale_puts_both_sides_of_a_comparison_in_one_unit() {
        assert_eq!(
            format_all(&[4669.1, 42_574.8], "ns"),
            ["4.67 µs", "42.6 µs"]
        );
        assert_eq!(format_all(&[0.625, 7.85], "ms"), ["0.625 ms", "7.85 ms"]);
        assert_eq!(format_all(&[0.0091, 40.0], "ms"), ["9.10 µs", "40.0 ms"]);
        assert_eq!(format_range(7.5, 7.7, "ms"), "7.50–7.70 ms");
        assert_eq!(format_range(7.5, 7.5, "ms"), "7.50 ms");
    }

    #[test]
    fn instruction_clock_times_read_as_instructions_never_as_time() {
        assert_eq!(format(4858.0, "insn"), "4,858 instructions");
        assert_eq!(format(16.312, "kinsn"), "16,312 instructions");
        assert_eq!(format(6.96, "Minsn"), "6.96 M instructions");
        assert_eq!(format(0.0347, "Minsn"), "34,700 instructions");
        assert_eq!(format(2.5, "Ginsn"), "2.50 G instructions");
        assert_eq!(format(7962.0, "insn/page"), "7,962 instructions/page");
        assert_eq!(format(0.0, "Minsn"), "0 instructions");
        assert_eq!(
            format_all(&[4858.0, 5468.0], "insn"),
            ["4,858 instructions", "5,468 instructions"]
        );
        assert_eq!(
            format_range(6.94, 6.97, "Minsn"),
            "6.94–6.97 M instructions"
        );
        for text in [format(4858.0, "insn"), format(6.96, "Minsn")] {
            assert!(text.ends_with("instructions"), "{text}");
        }
    }

    #[test]
    fn axis_ticks_drop_trailing_zeros() {
        assert_eq!(tick(1000.0, "ns"), "1 µs");
        assert_eq!(tick(2500.0, "us"), "2.5 ms");
        assert_eq!(tick(65_536.0, "count"), "65,536");
        assert_eq!(tick(0.5, "%"), "0.5%");
        assert_eq!(tick(100.0, "cycles"), "100 cycles");
    }

    #[test]
    fn counts_are_exact_with_thousands_separators() {
        assert_eq!(format(65_536.0, "count"), "65,536");
        assert_eq!(format(128.0, "count"), "128");
        assert_eq!(format(1.5, "count"), "1.50");
        assert_eq!(format(-1_234_567.0, "count"), "-1,234,567");
        assert_eq!(format(12_000.0, "cycles"), "12,000 cycles");
        assert_eq!(format(1.0, "ratio"), "1.00");
    }

    #[test]
    fn sizes_use_binary_units_and_zero_is_plain() {
        assert_eq!(format(0.0, "bytes"), "0 B");
        assert_eq!(format(0.0, "MiB"), "0 MiB");
        assert_eq!(bytes(0), "0 B");
        assert_eq!(bytes(1023), "1,023 B");
        assert_eq!(bytes(1024), "1.00 KiB");
        assert_eq!(bytes(115_000), "112 KiB");
        assert_eq!(bytes(80 << 30), "80.0 GiB");
        assert_eq!(bytes(u64::MAX), "16.0 EiB");
        assert_eq!(format(256.0, "MiB"), "256 MiB");
        assert_eq!(format(4096.0, "MiB"), "4.00 GiB");
        assert_eq!(
            format_range(112.0 * 1024.0, 168.0 * 1024.0, "B"),
            "112–168 KiB"
        );
    }

    #[test]
    fn p_values_ratios_and_percentages_read_plainly() {
        assert_eq!(p_value(0.718), "0.72");
        assert_eq!(p_value(0.0031), "0.003");
        assert_eq!(p_value(0.000_02), "< 0.001");
        assert_eq!(p_equals(0.000_02), "p < 0.001");
        assert_eq!(p_equals(0.718), "p = 0.72");
        assert_eq!(ratio(9.12), "9.1×");
        assert_eq!(ratio(1.049), "1.05×");
        assert_eq!(ratio(12.6), "12.6×");
        assert_eq!(ratio(1260.0), "1,260×");
        assert_eq!(format(31.4, "%"), "31%");
        assert_eq!(format(2.46, "%"), "2.5%");
    }

    /// The number and the unit of a formatted time, back in ns.
    fn parse_time(s: &str) -> f64 {
        let (num, unit) = s.rsplit_once(' ').expect("number and unit");
        let v: f64 = num.replace(',', "").parse().expect("a number");
        let f = TIME_UNITS
            .iter()
            .find(|(_, n)| *n == unit)
            .expect("a time unit")
            .0;
        v * f
    }

    proptest! {
        #[test]
        fn a_formatted_time_parses_back_within_its_precision(ns in 1e-3f64..1e13) {
            let text = format(ns, "ns");
            let back = parse_time(&text);
            // Three significant digits: at most half a unit in the third digit, 0.5%.
            prop_assert!((back - ns).abs() <= ns * 0.005 + 1e-12, "{ns} ns → {text} → {back}");
            let (num, _) = text.rsplit_once(' ').unwrap();
            let whole = num.replace(',', "");
            let whole = whole.split('.').next().unwrap();
            // Below the top unit, at most three whole digits: never "4669.1 ns".
            prop_assert!(text.ends_with(" s") || whole.len() <= 3, "{text}");
        }

        #[test]
        fn a_formatted_size_parses_back_within_its_precision(n in 0u64..(1u64 << 62)) {
            let text = bytes(n);
            let (num, unit) = text.rsplit_once(' ').unwrap();
            let v: f64 = num.replace(',', "").parse().unwrap();
            let i = BYTE_UNITS.iter().position(|u| *u == unit).unwrap();
            let back = v * 1024f64.powi(i32::try_from(i).unwrap());
            #[allow(clippy::cast_precision_loss)]
            let n = n as f64;
            prop_assert!((back - n).abs() <= n * 0.005 + 1e-9, "{n} → {text}");
        }

        #[test]
        fn counts_round_trip_exactly(n in -1_000_000_000_000i64..1_000_000_000_000) {
            #[allow(clippy::cast_precision_loss)]
            let text = count(n as f64);
            prop_assert_eq!(text.replace(',', "").parse::<i64>().unwrap(), n);
        }
    }
}
