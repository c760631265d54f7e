//! `cargo xtask tlsfuzzer --compare-all [--limit SECONDS] [SCRIPT…]`: every TLS 1.3 script of
//! tlsfuzzer (`scripts/test-tls13-*.py`, or the ones named) against OpenSSL's
//! `s_server -tls1_3 -www` and against tunneld's `[[tls.listen]]`, side by side.
//!
//! Both servers run in one namespace with the same RSA-2048 certificate: tunneld as the
//! step runs it (an HTTP backend answering each `GET` with one write, an echo backend for
//! `lengths`), OpenSSL with `-www` (and `-rev`, which sends each line back, for `lengths`).
//! Each script runs with no exclusions, `-n 0` (every probe, where the default is a random
//! subset) unless [`OPTIONS`] says otherwise, and at most `--limit` seconds (default 240);
//! the two servers' runs go side by side, one script at a time each. A script stopped at the
//! limit counts the probes it finished. Probes pass or fail as the script prints them
//! (`NAME ...`, then `OK` or `Error while processing`).
//!
//! `--only openssl|tunneld` runs one side again (the other keeps its saved outputs);
//! `--report` only makes the report again from the saved outputs.
//!
//! The group scripts (`OPT_IN_SCRIPTS`, and `dhe-shared-secret-padding`) run a second time
//! against the listener with the opt-in groups and OpenSSL with the same groups.
//!
//! The report, `target/tlsfuzzer-compare/report.md`, has a row per run (probes passed/run
//! on each server) and lists every probe that passes on OpenSSL and fails on tunneld (and
//! the other way round), the expected ones ([`EXPECTED`]) marked with the section of
//! docs/reliability.md that says why; each run's whole output is kept beside it
//! (`openssl/<script>.txt`, `tunneld/<script>.txt`, `.opt-in-groups.txt` for the second
//! pair). It fails on any probe that passes on OpenSSL and not on tunneld unless it is
//! expected, on an expected difference that no longer differs, when tunneld dies or stops
//! serving, and when a server cannot be started. The step of `cargo xtask test`
//! (`tlsfuzzer.rs`) is the same comparison on fewer scripts.

use super::*;
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// OpenSSL's `s_server -www` and `-rev` in the namespace, with tunneld's default groups, and
/// `-www` with every group tunneld knows.
const OPENSSL_WWW: &str = "127.0.0.1:4435";
const OPENSSL_REV: &str = "127.0.0.1:4436";
const OPENSSL_OPT_IN: &str = "127.0.0.1:4438";

/// A probe where tunneld answers otherwise than OpenSSL on purpose, documented in the
/// section `doc` names. The comparison names each in its output and report, does not count
/// it as a difference, and fails when it no longer differs (the list cannot rot): remove it
/// here and in the doc then.
#[derive(Debug)]
pub(super) struct Expected {
    pub script: &'static str,
    pub probe: &'static str,
    pub doc: &'static str,
}

const CLIENT_HELLO_OVER_64_KIB: &str =
    "docs/reliability.md, \"Expected differences\": a ClientHello over 64 KiB";

/// Every expected difference, by script and probe name.
pub(super) const EXPECTED: &[Expected] = &[
    Expected {
        script: "signature-algorithms",
        probe: "tolerance 32715 methods",
        doc: CLIENT_HELLO_OVER_64_KIB,
    },
    Expected {
        script: "signature-algorithms",
        probe: "tolerance 32715 methods with sig_alg_cert",
        doc: CLIENT_HELLO_OVER_64_KIB,
    },
    Expected {
        script: "signature-algorithms",
        probe: "32715 invalid schemes",
        doc: CLIENT_HELLO_OVER_64_KIB,
    },
    Expected {
        script: "signature-algorithms",
        probe: "duplicated 32715 non-rsa schemes",
        doc: CLIENT_HELLO_OVER_64_KIB,
    },
];

/// What one run shows, measured against [`EXPECTED`].
#[derive(Debug, Default, PartialEq)]
struct Verdict {
    /// Probes that pass on OpenSSL and not on tunneld, not expected.
    undocumented: Vec<String>,
    /// Expected differences that differ, with their doc section.
    expected: Vec<(String, &'static str)>,
    /// Expected differences that did not differ this run.
    stale: Vec<String>,
}

impl Verdict {
    fn of(script: &str, openssl: &Outcome, tunneld: &Outcome) -> Verdict {
        let worse = differences(openssl, tunneld);
        let mut verdict = Verdict::default();
        for probe in &worse {
            match EXPECTED
                .iter()
                .find(|e| e.script == script && e.probe == probe.as_str())
            {
                Some(e) => verdict.expected.push((probe.to_string(), e.doc)),
                None => verdict.undocumented.push(probe.to_string()),
            }
        }
        for e in EXPECTED.iter().filter(|e| e.script == script) {
            if !worse.iter().any(|p| p.as_str() == e.probe) {
                verdict.stale.push(e.probe.to_string());
            }
        }
        verdict
    }

    fn passes(&self) -> bool {
        self.undocumented.is_empty() && self.stale.is_empty()
    }
}

/// Whether a run where OpenSSL passes no probe fails (the step: it could show no
/// difference) or is only reported (`--compare-all`, which runs scripts whose features
/// neither server has).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Vacuous {
    Fails,
    Reported,
}
/// Default limit per script and server.
const DEFAULT_LIMIT: Duration = Duration::from_secs(240);

/// Scripts whose options differ from `-n 0`.
const OPTIONS: &[(&str, &[&str])] = &[
    // Takes no -n (its getopt string has none): every probe runs anyway.
    ("certificate-request", &[]),
    // A timing side-channel measurement: without an interface to capture on it runs its
    // conversations only; --repeat bounds the (unused) sample count.
    ("minerva", &["-n", "0", "--repeat", "10"]),
];

/// One server as the scripts see it.
struct Target {
    name: &'static str,
    /// Where every script but `lengths` connects.
    main: &'static str,
    /// Where `lengths` connects (a service that sends each line back).
    echo: &'static str,
    /// Where runs with the opt-in groups connect.
    opt_in: &'static str,
}

/// What one script did against one server.
#[derive(Debug, Default)]
struct Outcome {
    passed: BTreeSet<String>,
    failed: BTreeSet<String>,
    /// Passes and fails counted per run (the sanity probe may run more than once).
    pass_count: usize,
    fail_count: usize,
    stopped: bool,
    seconds: f64,
}

/// A script's short name, as `cargo xtask tlsfuzzer` takes it (`test-tls13-NAME.py` → NAME).
pub(super) fn short_name(arg: &str) -> String {
    arg.trim_start_matches("test-tls13-")
        .trim_end_matches(".py")
        .to_string()
}

pub(super) fn compare_all(args: &[String]) -> Result<(), String> {
    let mut limit = DEFAULT_LIMIT;
    let mut names = Vec::new();
    let mut only: Option<String> = None;
    let mut report_only = false;
    let mut args = args.iter();
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--compare-all" => {}
            "--report" => report_only = true,
            "--limit" => {
                let secs = args
                    .next()
                    .and_then(|s| s.parse::<u64>().ok())
                    .filter(|&s| s > 0)
                    .ok_or("--limit takes a number of seconds")?;
                limit = Duration::from_secs(secs);
            }
            "--only" => {
                let side = args.next().map(String::as_str);
                if !matches!(side, Some("openssl" | "tunneld")) {
                    return Err("--only takes openssl or tunneld".into());
                }
                only = side.map(str::to_string);
            }
            name => names.push(short_name(name)),
        }
    }
    let vendored = vendored_dir()?;
    if !vendored.join("scripts/_stub.py").is_file() {
        return Err(format!(
            "no tlsfuzzer at {} (set {DIR_VARIABLE} to a copy)",
            vendored.display()
        ));
    }
    let scripts = script_names(&vendored.join("scripts"), &names)?;
    let opt_in: Vec<&str> = OPT_IN_SCRIPTS
        .iter()
        .copied()
        .chain(["dhe-shared-secret-padding"])
        .collect();
    let runs = runs(&scripts, &opt_in);
    let report_dir = system::target_dir(&system::repo_root()?).join("tlsfuzzer-compare");
    let sides: Vec<&str> = if report_only {
        Vec::new()
    } else {
        ["openssl", "tunneld"]
            .into_iter()
            .filter(|side| only.as_deref().is_none_or(|o| o == *side))
            .collect()
    };
    let counts = run_and_report(&runs, &sides, limit, &report_dir, Vacuous::Reported)?;
    if counts.failed > 0 {
        return Err(format!(
            "{} of {} runs differ from OpenSSL otherwise than documented (probes that pass \
             on OpenSSL and not on tunneld, or expected differences that no longer differ); \
             see {}",
            counts.failed,
            counts.passed + counts.failed,
            report_dir.join("report.md").display()
        ));
    }
    Ok(())
}

/// Runs `runs` against each of `sides` (none: only the report is made again), the sides
/// side by side, then makes the report from the saved outputs in `report_dir` (a side not
/// run keeps its last) and prints each difference, expected or not. A run passes when every
/// probe that passed on OpenSSL passed on tunneld too (one tunneld did not finish counts as
/// failed), but those of [`EXPECTED`], which must differ. `Err` when a server cannot be
/// started, or tunneld died or stopped serving.
pub(super) fn run_and_report(
    runs: &[Run],
    sides: &[&str],
    limit: Duration,
    report_dir: &Path,
    vacuous: Vacuous,
) -> Result<Counts, String> {
    for side in ["openssl", "tunneld"] {
        fs::create_dir_all(report_dir.join(side))
            .map_err(|e| format!("cannot create {}: {e}", report_dir.display()))?;
    }
    let mut after = Ok(());
    if !sides.is_empty() {
        after = run_sides(runs, sides, limit, report_dir)?;
    }
    let saved = |side: &str| -> Vec<Outcome> {
        runs.iter()
            .map(|run| {
                let path = report_dir.join(side).join(run.file());
                outcome_of(&fs::read_to_string(path).unwrap_or_default())
            })
            .collect()
    };
    let (openssl, tunneld) = (saved("openssl"), saved("tunneld"));
    let report = report(runs, &openssl, &tunneld, limit, &after);
    let path = report_dir.join("report.md");
    fs::write(&path, &report).map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    let mut counts = Counts::default();
    for (i, run) in runs.iter().enumerate() {
        let label = run.label();
        let verdict = Verdict::of(&run.script, &openssl[i], &tunneld[i]);
        let empty = openssl[i].pass_count == 0;
        if empty {
            counts.vacuous.push(label.clone());
        }
        for (probe, doc) in &verdict.expected {
            eprintln!("tlsfuzzer {label}: expected difference `{probe}` ({doc})");
            counts.expected.push(format!("{label}: {probe}"));
        }
        for probe in &verdict.stale {
            eprintln!(
                "tlsfuzzer {label}: EXPECTED DIFFERENCE NO LONGER DIFFERS: `{probe}`; remove it \
                 from EXPECTED (xtask/src/tlsfuzzer/compare.rs) and from docs/reliability.md"
            );
        }
        if !verdict.undocumented.is_empty() {
            eprintln!(
                "tlsfuzzer {label}: {} probe(s) pass on OpenSSL and not on tunneld \
                 (undocumented):",
                verdict.undocumented.len()
            );
            for probe in &verdict.undocumented {
                eprintln!("    {probe}");
            }
        }
        let refused = empty && vacuous == Vacuous::Fails;
        if refused {
            eprintln!("tlsfuzzer {label}: OpenSSL passed no probe, so none could differ");
        }
        if verdict.passes() && !refused {
            counts.passed += 1;
        } else {
            counts.failed += 1;
        }
    }
    eprintln!(
        "tlsfuzzer: {} run(s) as on OpenSSL, {} differ otherwise than documented; {} expected \
         difference(s); report in {}",
        counts.passed,
        counts.failed,
        counts.expected.len(),
        path.display()
    );
    after?;
    Ok(counts)
}

/// The probes that passed on OpenSSL and did not pass (failed, or did not finish) on
/// tunneld.
fn differences<'a>(openssl: &'a Outcome, tunneld: &'a Outcome) -> Vec<&'a String> {
    openssl.passed.difference(&tunneld.passed).collect()
}

/// Makes every run against each side named, the sides side by side; each run's output goes
/// to `report_dir/SIDE/` ([`Run::file`]). Returns whether tunneld (when it ran) lived through
/// the run and still served afterwards.
fn run_sides(
    runs: &[Run],
    sides: &[&str],
    limit: Duration,
    report_dir: &Path,
) -> Result<Result<(), String>, String> {
    if !crate::netns_usable() {
        return Err("needs root for a network namespace".into());
    }
    system::catch_interrupts();
    let started = Instant::now();
    let python = system::python_with_module("ecdsa", "python3-ecdsa")?;
    let tunneld = system::build_tunneld()?;
    let ns = NetNs::new();
    let dir = TempDir::new()?;
    let tlsfuzzer = dir.0.join("tlsfuzzer");
    copy_tree(&vendored_dir()?, &tlsfuzzer)?;
    relink_scripts(&tlsfuzzer.join("scripts"))?;
    let (cert, key) = certificate(&dir.0)?;
    let _http = Backend::start(&ns, sock(HTTP_BACKEND), http_connection)?;
    let _echo = Backend::start(&ns, sock(ECHO_BACKEND), echo_connection)?;
    let log = dir.0.join("tunneld.log");
    let mut server = start_tunneld(&ns, &tunneld, &dir.0, &cert, &key, &log)?;
    let _www = start_openssl(&ns, &cert, &key, OPENSSL_WWW, "-www", Groups::Default)?;
    let _rev = start_openssl(&ns, &cert, &key, OPENSSL_REV, "-rev", Groups::Default)?;
    let _opt_in = start_openssl(&ns, &cert, &key, OPENSSL_OPT_IN, "-www", Groups::OptIn)?;
    eprintln!(
        "==> tlsfuzzer: {} run(s), at most {} s each, against {}",
        runs.len(),
        limit.as_secs(),
        sides.join(" and ")
    );
    let targets: Vec<Target> = sides
        .iter()
        .map(|&side| match side {
            "openssl" => Target {
                name: "openssl",
                main: OPENSSL_WWW,
                echo: OPENSSL_REV,
                opt_in: OPENSSL_OPT_IN,
            },
            _ => Target {
                name: "tunneld",
                main: TLS_HTTP,
                echo: TLS_ECHO,
                opt_in: TLS_OPT_IN,
            },
        })
        .collect();
    std::thread::scope(|scope| {
        for target in &targets {
            let (ns, python, tlsfuzzer) = (&ns, &python, &tlsfuzzer);
            scope.spawn(move || {
                for run in runs {
                    if system::check_interrupted().is_err() {
                        return;
                    }
                    let out = report_dir.join(target.name).join(run.file());
                    let o = run_against(ns, python, tlsfuzzer, run, target, &out, limit);
                    eprintln!(
                        "{:<8} {}: {}/{} passed{} ({:.0} s)",
                        target.name,
                        run.label(),
                        o.pass_count,
                        o.pass_count + o.fail_count,
                        if o.stopped {
                            ", stopped at the limit"
                        } else {
                            ""
                        },
                        o.seconds
                    );
                }
            });
        }
    });
    system::check_interrupted()?;
    eprintln!("tlsfuzzer: ran in {:.0} s", started.elapsed().as_secs_f64());
    if !matches!(server.0.try_wait(), Ok(None)) {
        return Ok(Err(format!("tunneld exited during the run:{}", tail(&log))));
    }
    Ok(still_serves(&ns, &cert).map_err(|e| format!("{e}{}", tail(&log))))
}

/// The TLS 1.3 scripts in the copy (`test-tls13-NAME.py`), by NAME, sorted; or the named ones.
pub(super) fn script_names(scripts: &Path, wanted: &[String]) -> Result<Vec<String>, String> {
    let list =
        fs::read_dir(scripts).map_err(|e| format!("cannot read {}: {e}", scripts.display()))?;
    let mut names: Vec<String> = list
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            Some(
                name.strip_prefix("test-tls13-")?
                    .strip_suffix(".py")?
                    .to_string(),
            )
        })
        .collect();
    names.sort();
    if wanted.is_empty() {
        return Ok(names);
    }
    for name in wanted {
        if !names.contains(name) {
            return Err(format!("no script test-tls13-{name}.py in tlsfuzzer"));
        }
    }
    Ok(wanted.to_vec())
}

fn start_openssl(
    ns: &NetNs,
    cert: &Path,
    key: &Path,
    addr: &'static str,
    mode: &str,
    groups: Groups,
) -> Result<Guard, String> {
    let mut guard = Guard(
        ns.command("openssl")
            .args(["s_server", "-accept", addr, "-tls1_3", mode, "-quiet"])
            .args(["-groups", &groups.openssl()])
            .arg("-cert")
            .arg(cert)
            .arg("-key")
            .arg(key)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start openssl s_server: {e}"))?,
    );
    let deadline = Instant::now() + READY_LIMIT;
    while !crate::tls_bench::listening(ns, &[addr]) {
        if let Ok(Some(status)) = guard.0.try_wait() {
            return Err(format!("openssl s_server {mode} exited ({status})"));
        }
        if Instant::now() >= deadline {
            return Err(format!("openssl s_server {mode} did not listen on {addr}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(guard)
}

fn run_against(
    ns: &NetNs,
    python: &Path,
    tlsfuzzer: &Path,
    run: &Run,
    target: &Target,
    out: &Path,
    limit: Duration,
) -> Outcome {
    let started = Instant::now();
    let script = run.script.as_str();
    let file = tlsfuzzer.join(format!("scripts/test-tls13-{script}.py"));
    let lengths = script == "lengths";
    let addr = match run.groups {
        Groups::OptIn => target.opt_in,
        Groups::Default if lengths => target.echo,
        Groups::Default => target.main,
    };
    let (host, port) = addr.split_once(':').expect("host:port");
    let mut cmd = ns.command(&python.to_string_lossy());
    cmd.arg(&file)
        .args(["-h", host, "-p", port])
        .current_dir(tlsfuzzer)
        .env("PYTHONPATH", tlsfuzzer)
        .env("PYTHONUNBUFFERED", "1");
    match OPTIONS.iter().find(|(name, _)| *name == script) {
        Some((_, options)) => {
            cmd.args(*options);
        }
        None => {
            cmd.args(["-n", "0"]);
        }
    }
    if lengths {
        // As the step runs it: the edges, not 16384 sizes.
        cmd.arg("sanity");
        cmd.args(LENGTHS.iter().map(|n| format!("length: {n}")));
    }
    let file = match fs::File::create(out) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cannot create {}: {e}", out.display());
            return Outcome::default();
        }
    };
    let stderr = file.try_clone();
    let child = cmd
        .stdin(Stdio::null())
        .stdout(file)
        .stderr(stderr.map_or(Stdio::null(), Stdio::from))
        .spawn();
    let mut child = match child {
        Ok(child) => child,
        Err(e) => {
            eprintln!("cannot run {script}: {e}");
            return Outcome::default();
        }
    };
    let deadline = started + limit;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break Some(status),
            Ok(None) if Instant::now() < deadline && system::check_interrupted().is_ok() => {
                std::thread::sleep(Duration::from_millis(100))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    if status.is_none() {
        if let Ok(mut f) = fs::OpenOptions::new().append(true).open(out) {
            let _ = f.write_all(STOPPED_MARK.as_bytes());
        }
    }
    let mut outcome = outcome_of(&fs::read_to_string(out).unwrap_or_default());
    outcome.seconds = seconds;
    outcome
}

/// Each probe the output shows finished, and whether it passed: a line ending in `...`
/// (`NAME ...`, or `"NAME" repeat N...`) starts one, `OK` ends it well, `Error while
/// processing` badly.
fn probes(text: &str) -> Vec<(String, bool)> {
    let mut done = Vec::new();
    let mut current: Option<&str> = None;
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) {
            continue;
        }
        if let Some(name) = line.strip_suffix("...") {
            current = Some(name.trim_end());
        } else if line == "OK" {
            if let Some(name) = current.take() {
                done.push((name.to_string(), true));
            }
        } else if line == "Error while processing" {
            if let Some(name) = current.take() {
                done.push((name.to_string(), false));
            }
        }
    }
    done
}

/// What a script's saved output says. The repeats of one probe (`"NAME" repeat N`) count
/// as one probe, `"NAME" (repeated)`, passed when every repeat passed: how many there are
/// is chance (`dhe-shared-secret-padding` repeats a group until it has seen a key share and
/// a shared secret that start with a zero byte, and stops at its first failure), so the
/// sides are compared on the probe, not on a repeat number one side did not reach.
fn outcome_of(text: &str) -> Outcome {
    let mut outcome = Outcome::default();
    for (probe, ok) in probes(text) {
        let probe = match probe.rsplit_once(" repeat ") {
            Some((name, n)) if n.bytes().all(|b| b.is_ascii_digit()) => {
                format!("{name} (repeated)")
            }
            _ => probe,
        };
        if ok {
            outcome.pass_count += 1;
            if !outcome.failed.contains(&probe) {
                outcome.passed.insert(probe);
            }
        } else {
            outcome.fail_count += 1;
            outcome.passed.remove(&probe);
            outcome.failed.insert(probe);
        }
    }
    // A script that finished prints its own counts; they win (a probe printed in an odd
    // way is still counted).
    let count = |label: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(label))
            .and_then(|n| n.trim().parse::<usize>().ok())
    };
    if let (Some(pass), Some(fail)) = (count("PASS: "), count("FAIL: ")) {
        (outcome.pass_count, outcome.fail_count) = (pass, fail);
    }
    outcome.stopped = text.contains(STOPPED_MARK);
    outcome
}

/// Appended to a script's output when it was stopped at the limit.
const STOPPED_MARK: &str = "\n[xtask: stopped at the time limit]\n";

fn report(
    runs: &[Run],
    openssl: &[Outcome],
    tunneld: &[Outcome],
    limit: Duration,
    after: &Result<(), String>,
) -> String {
    let mut md = String::new();
    let _ = writeln!(
        md,
        "# tlsfuzzer: OpenSSL s_server and tunneld side by side\n\n\
         At most {} s per script and server; \"n/m\": probes passed of probes \
         run; \"(stopped)\": the script reached the limit and the probes it finished count. \
         \"(opt-in groups)\": against the listener whose `groups` lists every group, and \
         OpenSSL with the same groups. \"expected\": probes that differ on purpose, each \
         documented (below: where); \"no longer differ\": expected ones that did not, which \
         fail the run as undocumented ones do.\n",
        limit.as_secs()
    );
    md.push_str(
        "| run | openssl | tunneld | pass on openssl, not on tunneld (undocumented) | \
         expected | expected, no longer differ | pass on tunneld, fail on openssl |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
    );
    let cell = |o: &Outcome| {
        format!(
            "{}/{}{}",
            o.pass_count,
            o.pass_count + o.fail_count,
            if o.stopped { " (stopped)" } else { "" }
        )
    };
    let mut details = String::new();
    let mut totals = [(0, 0); 2];
    for (i, run) in runs.iter().enumerate() {
        let label = run.label();
        let (o, t) = (&openssl[i], &tunneld[i]);
        for (total, side) in totals.iter_mut().zip([o, t]) {
            total.0 += side.pass_count;
            total.1 += side.pass_count + side.fail_count;
        }
        let verdict = Verdict::of(&run.script, o, t);
        let better: Vec<&String> = o.failed.intersection(&t.passed).collect();
        let _ = writeln!(
            md,
            "| {label} | {} | {} | {} | {} | {} | {} |",
            cell(o),
            cell(t),
            verdict.undocumented.len(),
            verdict.expected.len(),
            verdict.stale.len(),
            better.len()
        );
        if verdict != Verdict::default() || !better.is_empty() {
            let _ = writeln!(details, "\n## {label}\n");
            for probe in &verdict.undocumented {
                let _ = writeln!(
                    details,
                    "- passes on openssl, not on tunneld (undocumented): `{probe}`"
                );
            }
            for (probe, doc) in &verdict.expected {
                let _ = writeln!(details, "- expected difference: `{probe}` ({doc})");
            }
            for probe in &verdict.stale {
                let _ = writeln!(
                    details,
                    "- expected difference that no longer differs: `{probe}`"
                );
            }
            for probe in better {
                let _ = writeln!(details, "- openssl fails, tunneld passes: `{probe}`");
            }
        }
    }
    let _ = writeln!(
        md,
        "| all | {}/{} | {}/{} | | | | |",
        totals[0].0, totals[0].1, totals[1].0, totals[1].1
    );
    let _ = writeln!(
        md,
        "\nAfter the run, tunneld still served (openssl s_client through its listener): {}.",
        match after {
            Ok(()) => "yes".to_string(),
            Err(e) => format!("NO ({e})"),
        }
    );
    md.push_str(&details);
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_read_from_the_output() {
        let out = "sanity ...\nOK\n\nbad one ...\nError while processing\nTraceback\n  x ...\n\
                   AssertionError\n\"sanity\" repeat 1...\nOK\n\nunfinished ...\n";
        assert_eq!(
            probes(out),
            [
                ("sanity".to_string(), true),
                ("bad one".to_string(), false),
                ("\"sanity\" repeat 1".to_string(), true)
            ]
        );
        let o = outcome_of(&format!("{out}PASS: 5\nFAIL: 1\n"));
        assert_eq!((o.pass_count, o.fail_count, o.stopped), (5, 1, false));
        assert!(o.passed.contains("\"sanity\" (repeated)"));
        assert!(outcome_of(&format!("{out}{STOPPED_MARK}")).stopped);
    }

    #[test]
    fn a_difference_is_a_probe_openssl_passes_and_tunneld_does_not() {
        let openssl = outcome_of("a ...\nOK\nb ...\nOK\nc ...\nError while processing\n");
        // b failed, c passed where OpenSSL failed, d never finished.
        let tunneld = outcome_of("a ...\nOK\nb ...\nError while processing\nc ...\nOK\n");
        assert_eq!(differences(&openssl, &tunneld), ["b"]);
        let unfinished = outcome_of("a ...\nOK\nb ...\n");
        assert_eq!(differences(&openssl, &unfinished), ["b"]);
        assert!(differences(&tunneld, &openssl).contains(&&"c".to_string()));
    }

    /// Expected differences are named and pass; any other difference fails; an expected
    /// one that no longer differs fails too.
    #[test]
    fn expected_differences_pass_and_must_still_differ() {
        let script = EXPECTED[0].script;
        let expected: Vec<&Expected> = EXPECTED.iter().filter(|e| e.script == script).collect();
        let output = |expected_ok: bool, other_ok: bool| {
            let end = |ok: bool| if ok { "OK" } else { "Error while processing" };
            let mut out = String::new();
            for e in &expected {
                out.push_str(&format!("{} ...\n{}\n", e.probe, end(expected_ok)));
            }
            out.push_str(&format!("other ...\n{}\n", end(other_ok)));
            outcome_of(&out)
        };
        let openssl = output(true, true);
        let verdict = Verdict::of(script, &openssl, &output(false, true));
        let named: Vec<(String, &str)> = expected
            .iter()
            .map(|e| (e.probe.to_string(), e.doc))
            .collect();
        assert_eq!(verdict.expected.len(), expected.len());
        assert!(named.iter().all(|n| verdict.expected.contains(n)));
        assert!(verdict.passes(), "{verdict:?}");
        // The same probes in another script are no expected differences.
        assert!(!Verdict::of("conversation", &openssl, &output(false, true)).passes());
        let verdict = Verdict::of(script, &openssl, &output(false, false));
        assert_eq!(verdict.undocumented, ["other"]);
        assert!(!verdict.passes());
        // One expected difference that passes on tunneld now: stale, a failure.
        let mut one_passes = output(false, true);
        one_passes.failed.remove(expected[0].probe);
        one_passes.passed.insert(expected[0].probe.to_string());
        let verdict = Verdict::of(script, &openssl, &one_passes);
        assert_eq!(verdict.stale, [expected[0].probe]);
        assert!(!verdict.passes());
    }

    /// Every expected difference names a step script and points at a section of the doc
    /// that names its probe.
    #[test]
    fn expected_differences_are_documented() {
        let doc = fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/reliability.md"),
        )
        .unwrap();
        for e in EXPECTED {
            assert!(super::super::STEP_SCRIPTS.contains(&e.script), "{e:?}");
            assert!(e.doc.starts_with("docs/reliability.md, \""), "{e:?}");
            assert!(doc.contains(&format!("`{}`", e.probe)), "{e:?}");
        }
        assert!(doc.contains("### Expected differences"));
    }

    /// Repeats are one probe, whatever their number on each side; one failed repeat fails it.
    #[test]
    fn the_repeats_of_a_probe_are_one_probe() {
        let repeats = |n: usize, last_ok: bool| {
            let mut out = String::new();
            for i in 0..n {
                let end = if i + 1 < n || last_ok {
                    "OK"
                } else {
                    "Error while processing"
                };
                out.push_str(&format!("\"g\" repeat {i}...\n{end}\n"));
            }
            outcome_of(&out)
        };
        assert!(differences(&repeats(374, true), &repeats(12, true)).is_empty());
        assert_eq!(
            differences(&repeats(3, true), &repeats(5, false)),
            ["\"g\" (repeated)"]
        );
    }
}
