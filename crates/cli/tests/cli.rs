//! The command line's print-only commands, without root: what they do when the reader of
//! their output goes away. (`tunneld show`, which needs a running daemon, is checked the same
//! way in e2e.rs.)

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
