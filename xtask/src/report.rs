//! What the three bench reports (`bench.rs`, `tls_bench.rs`, `embedded_bench.rs`) share:
//! medians and ratios, the markdown table, the line saying when, where and how a report was
//! measured, and the front page of docs/benchmarks.md, where `--update-docs` puts each
//! bench's report between its marker comments (`<!-- bench:NAME:begin -->` … `end`).
//! Nothing else writes there, so `--quick` runs (the smoke runs of `cargo xtask test`)
//! never touch the docs.

use std::fmt::Write as _;
use std::fs;
use std::path::Path;

/// The median of the finite values; NaN when there are none.
pub(crate) fn median(mut values: Vec<f64>) -> f64 {
    values.retain(|v| v.is_finite());
    if values.is_empty() {
        return f64::NAN;
    }
    values.sort_by(f64::total_cmp);
    let n = values.len();
    if n % 2 == 1 {
        values[n / 2]
    } else {
        (values[n / 2 - 1] + values[n / 2]) / 2.0
    }
}

/// The value at quantile `q` (nearest rank), sorted or not; NaN when empty.
pub(crate) fn percentile(samples: &[f64], q: f64) -> f64 {
    if samples.is_empty() {
        return f64::NAN;
    }
    let mut sorted = samples.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted[((sorted.len() - 1) as f64 * q).round() as usize]
}

/// A table cell: `v` with `decimals` and `unit`, or "–" for what is not a number.
pub(crate) fn cell(v: f64, decimals: usize, unit: &str) -> String {
    if v.is_finite() {
        format!("{v:.decimals$}{unit}")
    } else {
        "–".into()
    }
}

/// "2.04× (1.86–2.21)": the median of per-round values and their range.
pub(crate) fn spread(values: &[f64], unit: &str, decimals: usize) -> String {
    let (Some(low), Some(high)) = (
        values.iter().copied().reduce(f64::min),
        values.iter().copied().reduce(f64::max),
    ) else {
        return "–".into();
    };
    let sign = if unit == "×" { "" } else { "+" };
    let show = |v: f64| {
        if v >= 0.0 {
            format!("{sign}{v:.decimals$}")
        } else {
            format!("{v:.decimals$}")
        }
    };
    format!(
        "{}{unit} ({}–{})",
        show(median(values.to_vec())),
        show(low),
        show(high)
    )
}

/// A markdown table: the first column (the row's name) left-aligned, the figures right.
pub(crate) struct Table {
    columns: usize,
    text: String,
}

impl Table {
    pub fn new(headers: &[&str]) -> Table {
        let mut text = format!("| {} |\n|---|", headers.join(" | "));
        text.push_str(&"---:|".repeat(headers.len().saturating_sub(1)));
        text.push('\n');
        Table {
            columns: headers.len(),
            text,
        }
    }

    /// A row of cells (any `|` in them escaped).
    pub fn row(&mut self, cells: &[String]) {
        let cells: Vec<String> = cells.iter().map(|c| c.replace('|', "\\|")).collect();
        let _ = writeln!(self.text, "| {} |", cells.join(" | "));
    }

    /// A row that is a name and one remark (skipped, failed), the other cells empty.
    pub fn note(&mut self, name: &str, remark: &str) {
        let mut cells = vec![name.to_string(), remark.to_string()];
        cells.resize(self.columns.max(2), String::new());
        self.row(&cells);
    }

    pub fn render(&self) -> &str {
        &self.text
    }
}

/// Where the namespaces' TCP connections got their congestion control: `Ok` when they
/// default to `cc`; `Err` with the host's default and the list the host lets a namespace
/// default to, when it does not allow `cc` (root may still ask for it per connection).
pub(crate) fn namespaces_congestion_control(cc: &str) -> Result<(), (String, String)> {
    let allowed =
        fs::read_to_string("/proc/sys/net/ipv4/tcp_allowed_congestion_control").unwrap_or_default();
    let host = crate::system::host_tcp_cc();
    if cc == host || allowed.split_whitespace().any(|a| a == cc) {
        Ok(())
    } else {
        let allowed = allowed.split_whitespace().collect::<Vec<_>>().join(" or ");
        Err((host, allowed))
    }
}

/// The machine a report was measured on, as the figures depend on it: CPU model, the flags
/// that choose tunneld's crypto code (avx512f, avx512ifma, vaes), cores, kernel.
pub(crate) fn machine() -> String {
    let cpuinfo = fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let kernel = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    describe_machine(&cpuinfo, kernel.trim(), cores)
}

fn describe_machine(cpuinfo: &str, kernel: &str, cores: usize) -> String {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|line| {
            let (key, value) = line.split_once(':')?;
            (key.trim() == name).then(|| value.trim().to_string())
        })
    };
    let model = field("model name").unwrap_or_else(|| "unknown CPU".into());
    let flags = field("flags").unwrap_or_default();
    let has: Vec<&str> = ["avx512f", "avx512ifma", "vaes"]
        .into_iter()
        .filter(|f| flags.split_whitespace().any(|x| x == *f))
        .collect();
    let has = if has.is_empty() {
        "no avx512f, avx512ifma or vaes".to_string()
    } else {
        has.join(", ")
    };
    format!("{cores} cores, {model} ({has}), Linux {kernel}")
}

/// Today's date (UTC), `YYYY-MM-DD`.
pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    civil_date(secs / 86_400)
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_date(days: u64) -> String {
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// The line that opens every report: when, on what and by which command it was measured.
pub(crate) fn measured_line(subcommand: &str, args: &[String]) -> String {
    let mut command = format!("cargo xtask {subcommand}");
    for arg in args {
        if arg.contains([' ', ',', ')', '(']) {
            let _ = write!(command, " \"{arg}\"");
        } else {
            let _ = write!(command, " {arg}");
        }
    }
    format!("Measured {} on {}: `{command}`.", today(), machine())
}

/// Writes `markdown` as `dir/file` (`dir` made if missing), and prints it.
pub(crate) fn write(dir: &Path, file: &str, markdown: &str) -> Result<(), String> {
    fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let path = dir.join(file);
    fs::write(&path, markdown).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("{markdown}");
    Ok(())
}

/// The front page of docs/benchmarks.md: `report` put between `bench`'s markers there.
pub(crate) fn update_front_page(root: &Path, bench: &str, report: &str) -> Result<(), String> {
    let path = root.join("docs/benchmarks.md");
    let doc =
        fs::read_to_string(&path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc = replace_between_markers(&doc, bench, report)?;
    fs::write(&path, doc).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    println!("Written: docs/benchmarks.md (its {bench} table)");
    Ok(())
}

/// `doc` with what stands between `<!-- bench:NAME:begin -->` and `<!-- bench:NAME:end -->`
/// replaced by `content`; an error when the pair is missing, doubled or out of order.
fn replace_between_markers(doc: &str, bench: &str, content: &str) -> Result<String, String> {
    let begin = format!("<!-- bench:{bench}:begin -->");
    let end = format!("<!-- bench:{bench}:end -->");
    let (Some(start), Some(stop)) = (doc.find(&begin), doc.find(&end)) else {
        return Err(format!(
            "docs/benchmarks.md has no `{begin}` … `{end}` pair to put the table between"
        ));
    };
    if doc.matches(&begin).count() != 1 || doc.matches(&end).count() != 1 || stop < start {
        return Err(format!(
            "docs/benchmarks.md must hold `{begin}` once, then `{end}` once"
        ));
    }
    let inner_start = start + begin.len();
    Ok(format!(
        "{}\n{}\n{}",
        &doc[..inner_start],
        content.trim(),
        &doc[stop..]
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_and_spreads() {
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0, f64::NAN, 2.0, 3.0]), 2.5);
        assert!(median(vec![f64::NAN]).is_nan());
        assert_eq!(spread(&[2.0, 1.5, 2.5], "×", 2), "2.00× (1.50–2.50)");
        assert_eq!(spread(&[-3.0, 5.0, 1.0], " µs", 0), "+1 µs (-3–+5)");
        assert_eq!(spread(&[], "×", 2), "–");
        assert_eq!(percentile(&[5.0, 1.0, 3.0, 2.0, 4.0], 0.5), 3.0);
        assert_eq!(cell(f64::NAN, 2, " Gbit/s"), "–");
        assert_eq!(cell(1.234, 2, " Gbit/s"), "1.23 Gbit/s");
    }

    #[test]
    fn a_table_aligns_figures_right_and_fills_a_note_row() {
        let mut t = Table::new(&["path", "TCP", "p50"]);
        t.row(&["a|b".into(), "1.00".into(), "2 µs".into()]);
        t.note("c", "skipped (not installed)");
        assert_eq!(
            t.render(),
            "| path | TCP | p50 |\n|---|---:|---:|\n| a\\|b | 1.00 | 2 µs |\n\
             | c | skipped (not installed) |  |\n"
        );
    }

    #[test]
    fn the_machine_names_model_flags_cores_and_kernel() {
        let cpuinfo = "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Processor\n\
                       flags\t\t: fpu sse2 avx512f vaes avx512ifma\n";
        assert_eq!(
            describe_machine(cpuinfo, "6.18.0", 2),
            "2 cores, Intel(R) Xeon(R) Processor (avx512f, avx512ifma, vaes), Linux 6.18.0"
        );
        assert_eq!(
            describe_machine("flags : sse2\n", "6.1", 4),
            "4 cores, unknown CPU (no avx512f, avx512ifma or vaes), Linux 6.1"
        );
    }

    #[test]
    fn dates_are_the_calendars() {
        assert_eq!(civil_date(0), "1970-01-01");
        assert_eq!(civil_date(11_016), "2000-02-29");
        assert_eq!(civil_date(20_783), "2026-11-26");
    }

    #[test]
    fn the_front_page_table_replaces_only_its_own_markers() {
        let doc = "# Benchmarks\n\n<!-- bench:wireguard:begin -->\nold table\n\
                   <!-- bench:wireguard:end -->\n\n<!-- bench:tls:begin -->\ntls table\n\
                   <!-- bench:tls:end -->\n\n## history\n";
        let new = replace_between_markers(doc, "wireguard", "new table\n").unwrap();
        assert_eq!(
            new,
            "# Benchmarks\n\n<!-- bench:wireguard:begin -->\nnew table\n\
             <!-- bench:wireguard:end -->\n\n<!-- bench:tls:begin -->\ntls table\n\
             <!-- bench:tls:end -->\n\n## history\n"
        );
        // Again: the same result, nothing doubled.
        assert_eq!(
            replace_between_markers(&new, "wireguard", "new table").unwrap(),
            new
        );
        assert!(replace_between_markers(doc, "embedded", "x")
            .unwrap_err()
            .contains("no `<!-- bench:embedded:begin -->`"));
        let reversed = "<!-- bench:tls:end -->\n<!-- bench:tls:begin -->\n";
        assert!(replace_between_markers(reversed, "tls", "x").is_err());
        let doubled = format!("{doc}<!-- bench:tls:begin -->\n");
        assert!(replace_between_markers(&doubled, "tls", "x").is_err());
    }
}
