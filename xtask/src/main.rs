//! Project automation. `cargo xtask test` runs the whole suite; `cargo xtask demo` shows two
//! sites joined by tunneld in network namespaces. Both install missing system tools first.

mod bench;
mod demo;
mod system;
mod testbed;

use std::process::ExitCode;

const USAGE: &str = "usage: cargo xtask <command>

commands:
  test             install missing tools, then fmt, clippy, all tests (incl. netns end to end)
  demo [--compare] two sites joined by tunneld in namespaces: ping, TCP transfer, speed;
                   --compare adds wireguard-go in the same testbed
  bench [--quick] [--rounds N] [--seconds S]
                   end-to-end comparison in namespaces: direct, tunneld, wireguard-go
                   (Debian; Go-module build), boringtun-cli, kernel WireGuard where present;
                   interleaved rounds, medians; report in target/bench-report/
  deps             only install the system tools the tests and demo need";

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("test") => test(),
        Some("demo") => demo::run(args.iter().any(|a| a == "--compare")),
        Some("bench") => bench::run(&args[1..]),
        Some("deps") => system::install_tools(),
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e}");
            ExitCode::FAILURE
        }
    }
}

/// Counts from cargo's `test result:` lines.
#[derive(Default, Debug)]
struct Tally {
    passed: u64,
    failed: u64,
    skipped: u64,
}

impl Tally {
    fn add_line(&mut self, line: &str) {
        let Some(rest) = line.trim().strip_prefix("test result: ") else {
            return;
        };
        for part in rest.split(';') {
            let mut words = part.split_whitespace().rev();
            let (Some(what), Some(n)) = (words.next(), words.next()) else {
                continue;
            };
            let n: u64 = n.parse().unwrap_or(0);
            match what {
                "passed" => self.passed += n,
                "failed" => self.failed += n,
                "ignored" => self.skipped += n,
                _ => {}
            }
        }
    }
}

fn test() -> Result<(), String> {
    system::install_tools()?;
    let root = system::repo_root()?;
    let mut tally = Tally::default();
    let mut failures = Vec::new();
    let steps: &[(&str, &[&str])] = &[
        ("fmt", &["fmt", "--all", "--", "--check"]),
        (
            "clippy",
            &[
                "clippy",
                "--workspace",
                "--all-targets",
                "--",
                "-D",
                "warnings",
            ],
        ),
        ("unit and end-to-end tests", &["test", "--workspace"]),
        // The pair harness drives boringtun from virtual time; that feature must never share a
        // build with the daemon, so it has its own invocation.
        (
            "pair harness (virtual time)",
            &["test", "-p", "tunneld-tunnel", "--features", "virtual-time"],
        ),
        ("benches build", &["bench", "--workspace", "--no-run"]),
    ];
    for (name, args) in steps {
        eprintln!("==> {name}: cargo {}", args.join(" "));
        let ok = system::cargo_streaming(&root, args, |line| tally.add_line(line))?;
        if !ok {
            failures.push(*name);
        }
    }
    // The end-to-end benchmark harness, one short round, so it never rots.
    eprintln!("==> benchmark harness smoke run: cargo xtask bench --quick");
    if let Err(e) = bench::run(&["--quick".to_string()]) {
        eprintln!("bench --quick: {e}");
        failures.push("bench --quick");
    }
    println!(
        "summary: {} passed, {} failed, {} skipped",
        tally.passed, tally.failed, tally.skipped
    );
    if failures.is_empty() {
        Ok(())
    } else {
        Err(format!("failed: {}", failures.join(", ")))
    }
}

#[cfg(test)]
mod tests {
    use super::Tally;

    #[test]
    fn tally_reads_cargo_result_lines() {
        let mut t = Tally::default();
        t.add_line("test result: ok. 8 passed; 0 failed; 2 ignored; 0 measured; 0 filtered out; finished in 0.00s");
        t.add_line(
            "test result: FAILED. 1 passed; 3 failed; 0 ignored; 0 measured; 0 filtered out",
        );
        t.add_line("running 4 tests");
        assert_eq!((t.passed, t.failed, t.skipped), (9, 3, 2));
    }
}
