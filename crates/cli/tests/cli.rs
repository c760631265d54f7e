//! The command line's print-only commands, without root: what they do when the reader of
//! their output goes away (`tunneld show`, which needs a running daemon, is checked the same
//! way in e2e.rs); and `tunneld check` on the fleet's example config.

mod common;

use common::*;
use std::process::Command;

#[test]
fn print_only_commands_end_quietly_when_the_reader_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("wg0.conf");
    std::fs::write(
        &conf,
        format!(
            "[Interface]\nPrivateKey = {}\nListenPort = 51820\n\n\
             [Peer]\nPublicKey = {}\nAllowedIPs = 10.0.0.2/32\n",
            genkey(),
            pubkey(&genkey())
        ),
    )
    .unwrap();
    let imported = output_bounded(Command::new(TUNNELD).arg("import").arg(&conf));
    assert!(imported.status.success(), "{imported:?}");
    let toml = dir.path().join("wg0.toml");
    std::fs::write(&toml, &imported.stdout).unwrap();
    let (conf, toml) = (conf.display().to_string(), toml.display().to_string());
    let key = genkey();

    for (args, stdin) in [
        (vec!["genkey"], ""),
        (vec!["genpsk"], ""),
        (vec!["pubkey"], key.as_str()),
        (vec!["import", &conf], ""),
        (vec!["check", &toml], ""),
    ] {
        let (status, stderr) = run_into_closed_pipe(Command::new(TUNNELD).args(&args), stdin);
        assert!(
            status.success(),
            "tunneld {args:?}: {status}; stderr: {stderr}"
        );
        assert!(stderr.is_empty(), "tunneld {args:?} said: {stderr}");
    }
}

/// dist/fleet-gateway.toml (installed by the Debian package) passes `tunneld check` once the
/// files its comment lists are beside it, and fails on a client key others may read.
#[test]
fn the_fleet_example_config_passes_check() {
    if !require_tool("the_fleet_example_config_passes_check", "openssl") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("corp.toml");
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/../../dist/fleet-gateway.toml");
    std::fs::copy(example, &config).unwrap();
    write_private(dir.path(), "corp.key", &genkey());
    // Its etcd client certificate; self-signed, so it is its own CA.
    let made = output_bounded(Command::new("openssl").current_dir(dir.path()).args([
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
    ]));
    assert!(made.status.success(), "{made:?}");
    std::fs::copy(dir.path().join("paris-gw1.pem"), dir.path().join("ca.pem")).unwrap();
    let client_key = dir.path().join("paris-gw1.key");
    let set_mode = |mode| {
        let mode = <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(mode);
        std::fs::set_permissions(&client_key, mode).unwrap()
    };
    set_mode(0o600);
    let checked = output_bounded(Command::new(TUNNELD).arg("check").arg(&config));
    assert!(
        checked.status.success(),
        "{}",
        String::from_utf8_lossy(&checked.stderr)
    );
    set_mode(0o644);
    let checked = output_bounded(Command::new(TUNNELD).arg("check").arg(&config));
    let said = String::from_utf8_lossy(&checked.stderr);
    assert!(
        !checked.status.success() && said.contains("fleet.key_file"),
        "{said}"
    );
}
