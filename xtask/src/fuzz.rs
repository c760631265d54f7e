//! `cargo xtask fuzz`: the cargo-fuzz targets in `fuzz/` (a crate outside the workspace; the
//! targets' bodies live in `fuzz/src/lib.rs`). Coverage-guided fuzzing needs a nightly
//! toolchain and cargo-fuzz; the stable replay of the seeds (`fuzz/tests/replay.rs`) runs in
//! `cargo xtask test` whatever the toolchain.

use crate::system;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

pub const TARGETS: &[&str] = &[
    "offload_segment",
    "offload_coalesce",
    "decapsulate",
    "wire",
    "config_parse",
    "uapi_parse",
    "framing",
    "aead_differential",
    "records",
    "netlink",
];

/// `cargo xtask fuzz <target|all|list> [--time N]`.
pub fn run(args: &[String]) -> Result<(), String> {
    let mut which: Option<&str> = None;
    let mut seconds: u64 = 60;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        match arg.as_str() {
            "--time" => {
                seconds = it
                    .next()
                    .and_then(|v| v.parse().ok())
                    .filter(|v| *v > 0)
                    .ok_or("--time takes a positive number of seconds")?;
            }
            name if which.is_none() => which = Some(name),
            other => return Err(format!("unexpected argument {other}")),
        }
    }
    let targets: Vec<&str> = match which {
        None | Some("list") => {
            println!("fuzz targets: {}", TARGETS.join(", "));
            println!("usage: cargo xtask fuzz <target|all> [--time SECONDS]");
            return Ok(());
        }
        Some("all") => TARGETS.to_vec(),
        Some(name) if TARGETS.contains(&name) => vec![name],
        Some(name) => {
            return Err(format!(
                "no fuzz target {name} (targets: {})",
                TARGETS.join(", ")
            ))
        }
    };
    if !nightly_available() {
        return Err(
            "fuzzing needs a nightly toolchain (rustup toolchain install nightly); \
                    the stable replay of the seeds runs in `cargo xtask test`"
                .into(),
        );
    }
    install_cargo_fuzz()?;
    let mut report = Vec::new();
    for target in targets {
        let runs = fuzz_one(target, seconds)?;
        report.push(format!("{target}: {runs} runs in {seconds} s, no crash"));
    }
    for line in &report {
        println!("{line}");
    }
    Ok(())
}

/// Whether `cargo +nightly` works here.
pub fn nightly_available() -> bool {
    quiet_success(Command::new("cargo").args(["+nightly", "--version"]))
}

/// Installs cargo-fuzz from crates.io when it is missing.
pub fn install_cargo_fuzz() -> Result<(), String> {
    if cargo_fuzz_available() {
        return Ok(());
    }
    eprintln!("==> installing cargo-fuzz (cargo install --locked cargo-fuzz)");
    system::run(Command::new("cargo").args(["install", "--locked", "cargo-fuzz"]))
}

/// Whether cargo-fuzz is installed.
pub fn cargo_fuzz_available() -> bool {
    quiet_success(Command::new("cargo").args(["fuzz", "--version"]))
}

fn quiet_success(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false)
}

/// Fuzzes `target` for `seconds` over its corpus; returns libFuzzer's count of runs. A crash
/// fails with the path of the input that caused it.
pub fn fuzz_one(target: &str, seconds: u64) -> Result<u64, String> {
    let dir = system::repo_root()?.join("fuzz");
    eprintln!("==> fuzzing {target} for {seconds} s");
    let mut child = Command::new("cargo")
        .args(["+nightly", "fuzz", "run", target, "--"])
        .arg(format!("-max_total_time={seconds}"))
        .current_dir(&dir)
        // The toolchain is chosen by `+nightly`, not by whatever ran xtask.
        .env_remove("RUSTUP_TOOLCHAIN")
        .stdout(Stdio::inherit())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run cargo fuzz: {e}"))?;
    let mut runs = None;
    let mut artifact = None;
    if let Some(err) = child.stderr.take() {
        for line in BufReader::new(err).lines().map_while(Result::ok) {
            // libFuzzer ends with "Done 123456 runs in 60 second(s)".
            if let Some(rest) = line.strip_prefix("Done ") {
                runs = rest.split_whitespace().next().and_then(|n| n.parse().ok());
            }
            if line.contains("Test unit written to") {
                artifact = Some(line.clone());
            }
            if line.starts_with('#') && !line.contains("NEW") && !line.contains("REDUCE") {
                continue; // periodic status lines: too many to echo
            }
            eprintln!("{line}");
        }
    }
    let status = child
        .wait()
        .map_err(|e| format!("waiting for cargo fuzz: {e}"))?;
    match (status.success(), runs) {
        (true, Some(runs)) => Ok(runs),
        (true, None) => Err(format!("{target}: libFuzzer reported no run count")),
        (false, _) => Err(format!(
            "{target}: fuzzing failed ({status}){}",
            artifact.map(|a| format!(": {a}")).unwrap_or_default()
        )),
    }
}
