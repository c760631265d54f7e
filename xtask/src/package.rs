//! `cargo xtask deb`: the Debian package (cargo-deb, installed when missing), and the check
//! `cargo xtask test` runs on it: install it with dpkg, use what it installed (the binary,
//! the example config checked as the unit's user with CAP_NET_ADMIN alone, the user and
//! /etc/tunneld its postinst makes, the man page, the systemd units: `systemd-analyze
//! verify` and `security --offline=yes`, which must rate each unit's exposure 2.0 or
//! lower), purge it.

use crate::system::{self, output_of, run};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The exposure `systemd-analyze security` may give a unit at most ("OK").
const MAX_EXPOSURE: f64 = 2.0;

/// The package's systemd units: the gateway's, and the proxy's (a dynamic user, no
/// capability).
const UNITS: &[&str] = &["tunneld@.service", "tunneld-proxy@.service"];

/// Builds the package and returns its path.
pub fn build() -> Result<PathBuf, String> {
    let root = system::repo_root()?;
    let bin = system::build_tunneld()?;
    let assets = system::target_dir(&root).join("deb-assets");
    let _ = fs::remove_dir_all(&assets);
    run(Command::new(&bin).arg("generate-assets").arg(&assets))?;
    install_cargo_deb()?;
    eprintln!("==> cargo deb -p tunneld-cli --no-build");
    let out = Command::new(system::cargo())
        .args(["deb", "-p", "tunneld-cli", "--no-build", "--no-strip"])
        .current_dir(&root)
        .output()
        .map_err(|e| format!("cannot run cargo deb: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "cargo deb failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    // cargo-deb prints the package's path last.
    let printed = String::from_utf8_lossy(&out.stdout);
    let deb = printed
        .lines()
        .rev()
        .map(str::trim)
        .find(|l| l.ends_with(".deb"))
        .map(PathBuf::from)
        .ok_or_else(|| format!("cargo deb named no package: {printed}"))?;
    println!("{}", deb.display());
    Ok(deb)
}

fn install_cargo_deb() -> Result<(), String> {
    let have = Command::new(system::cargo())
        .args(["deb", "--version"])
        .output()
        .is_ok_and(|o| o.status.success());
    if have {
        return Ok(());
    }
    eprintln!("==> installing cargo-deb (cargo install --locked cargo-deb)");
    run(Command::new(system::cargo()).args(["install", "--locked", "cargo-deb"]))
}

/// Installs the package, checks what it installed, and removes it again (also when a check
/// fails). Needs root.
pub fn check_installed(deb: &Path) -> Result<(), String> {
    if dpkg_status("tunneld") {
        return Err(
            "a tunneld package is installed already; not replacing it to test this one".into(),
        );
    }
    let user_was_there = user_exists(SERVICE_USER);
    eprintln!("==> dpkg -i {}", deb.display());
    run(Command::new("dpkg").arg("-i").arg(deb))?;
    let checked = checks();
    eprintln!("==> dpkg --purge tunneld");
    let removed = run(Command::new("dpkg").args(["--purge", "tunneld"]));
    // Debian leaves a package's system user behind on purge; this check made it, so it
    // removes it (with its group).
    if !user_was_there && user_exists(SERVICE_USER) {
        let _ = run(Command::new("userdel").arg(SERVICE_USER));
    }
    checked?;
    removed?;
    if Path::new("/usr/bin/tunneld").exists() {
        return Err("dpkg --purge left /usr/bin/tunneld behind".into());
    }
    Ok(())
}

/// The user tunneld@.service runs tunneld as, made by the package's postinst.
const SERVICE_USER: &str = "tunneld";

fn user_exists(name: &str) -> bool {
    Command::new("getent")
        .args(["passwd", name])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn dpkg_status(package: &str) -> bool {
    Command::new("dpkg")
        .args(["-s", package])
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("Status: install ok installed"))
}

/// What a user of the installed package would do first.
fn checks() -> Result<(), String> {
    let version = output_of(Command::new("tunneld").arg("--version"))?;
    if !version.starts_with("tunneld ") {
        return Err(format!("tunneld --version printed {version:?}"));
    }
    if !user_exists(SERVICE_USER) {
        return Err(format!(
            "the package made no {SERVICE_USER} user for its unit to run as"
        ));
    }
    let etc = output_of(Command::new("stat").args(["-c", "%U:%G %a", "/etc/tunneld"]))?;
    if etc != format!("root:{SERVICE_USER} 750") {
        return Err(format!(
            "/etc/tunneld is {etc}, not root:{SERVICE_USER} 750 (the configs' directory, readable by the service's group)"
        ));
    }
    // The examples, with the files they name made as their comments say, checked as the
    // unit runs tunneld: as its user, with CAP_NET_ADMIN alone.
    let dir = std::env::temp_dir().join(format!("tunneld-deb-{}", std::process::id()));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let result = (|| {
        let example = dir.join("site-a.toml");
        fs::copy("/usr/share/doc/tunneld/examples/site-a.toml", &example)
            .map_err(|e| format!("the example config is not installed: {e}"))?;
        let key = output_of(Command::new("tunneld").arg("genkey"))?;
        write_private(&dir.join("site-a.key"), &key)?;
        let fleet = dir.join("fleet-gateway.toml");
        fs::copy("/usr/share/doc/tunneld/examples/fleet-gateway.toml", &fleet)
            .map_err(|e| format!("the fleet example config is not installed: {e}"))?;
        let key = output_of(Command::new("tunneld").arg("genkey"))?;
        write_private(&dir.join("corp.key"), &key)?;
        // Its etcd client certificate and key; self-signed, so it is its own CA.
        output_of(Command::new("openssl").current_dir(&dir).args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
            "-subj",
            "/CN=paris-gw1",
            "-keyout",
            "paris-gw1.key",
            "-out",
            "paris-gw1.pem",
        ]))?;
        fs::copy(dir.join("paris-gw1.pem"), dir.join("ca.pem")).map_err(|e| e.to_string())?;
        output_of(
            Command::new("chmod")
                .arg("600")
                .arg(dir.join("paris-gw1.key")),
        )?;
        output_of(Command::new("chown").arg("-R").arg(SERVICE_USER).arg(&dir))?;
        output_of(
            Command::new("setpriv")
                .args([
                    &format!("--reuid={SERVICE_USER}"),
                    &format!("--regid={SERVICE_USER}"),
                    "--init-groups",
                    "--bounding-set=-all,+net_admin",
                    "--inh-caps=-all,+net_admin",
                    "--ambient-caps=+net_admin",
                    "tunneld",
                    "check",
                ])
                .arg(&example)
                .arg(&fleet),
        )?;
        let page = output_of(Command::new("man").args(["-w", "tunneld"]))?;
        eprintln!("man page: {page}");
        if !system::have("systemd-analyze") {
            return Err("systemd-analyze is missing (package systemd)".into());
        }
        for unit in UNITS {
            let unit = format!("/lib/systemd/system/{unit}");
            output_of(Command::new("systemd-analyze").args(["verify", &unit]))?;
            let report = Command::new("systemd-analyze")
                .args(["security", "--offline=yes", &unit])
                .output()
                .map_err(|e| format!("cannot run systemd-analyze security: {e}"))?;
            let text = String::from_utf8_lossy(&report.stdout).into_owned()
                + &String::from_utf8_lossy(&report.stderr);
            let exposure = exposure_level(&text)
                .ok_or_else(|| format!("no exposure level in systemd-analyze's report:\n{text}"))?;
            eprintln!("systemd-analyze security {unit}: exposure {exposure}");
            if exposure > MAX_EXPOSURE {
                return Err(format!(
                    "{unit}'s exposure is {exposure}, above {MAX_EXPOSURE}:\n{text}"
                ));
            }
        }
        Ok(())
    })();
    let _ = fs::remove_dir_all(&dir);
    result
}

fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
}

/// A command's standard output, trimmed; an error with both streams if it fails.
/// The number in "Overall exposure level for tunneld@.service: 1.9 OK".
fn exposure_level(report: &str) -> Option<f64> {
    let line = report
        .lines()
        .find(|l| l.contains("Overall exposure level"))?;
    line.rsplit(':')
        .next()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_exposure_level() {
        let report = "✓ UMask=  Files created …\n\n→ Overall exposure level for tunneld@i.service: 1.9 OK 🙂\n";
        assert_eq!(exposure_level(report), Some(1.9));
        assert_eq!(exposure_level("nothing"), None);
    }
}
