//! `tunneld`: a WireGuard site-to-site gateway. See README.md for the commands. The command
//! line over the `tunneld` library: what is here parses arguments, prints, and waits for
//! signals; everything else is the library's.

mod show;

use anyhow::Context;
use clap::{Parser, Subcommand};
use std::io::{Read, Write};
use std::path::PathBuf;
use std::process::ExitCode;
use tunneld_crypto::{PresharedKey, PrivateKey};

#[derive(Parser, Debug)]
#[command(
    name = "tunneld",
    version,
    about = "A fast user-space WireGuard gateway"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Bring up the interface a config describes and carry its traffic until SIGINT/SIGTERM.
    Up { config: PathBuf },
    /// Validate config files without touching the system; print every error.
    Check {
        #[arg(required = true)]
        configs: Vec<PathBuf>,
    },
    /// Print a new private key (base64), as `wg genkey` does.
    Genkey,
    /// Print a new preshared key (base64), as `wg genpsk` does.
    Genpsk,
    /// Read a private key on stdin and print its public key, as `wg pubkey` does.
    Pubkey,
    /// Show running interfaces: peers, handshakes, transfer, and per-worker counters.
    Show {
        /// One interface (default: every running one).
        interface: Option<String>,
    },
    /// Convert a wg-quick .conf file to a tunneld TOML config on stdout.
    Import {
        conf: PathBuf,
        /// Interface name for the new config (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tunneld: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> anyhow::Result<ExitCode> {
    match command {
        Command::Up { config } => {
            init_logging();
            up(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { configs } => {
            let mut ok = true;
            for path in &configs {
                match tunneld::Settings::check_file(path) {
                    Ok(()) => print_stdout(&[&path.display().to_string(), ": ok\n"])?,
                    Err(e) => {
                        ok = false;
                        for line in e.to_string().lines() {
                            eprintln!("{}: {line}", path.display());
                        }
                    }
                }
            }
            Ok(if ok {
                ExitCode::SUCCESS
            } else {
                ExitCode::FAILURE
            })
        }
        Command::Genkey => {
            print_stdout(&[PrivateKey::generate().to_base64().as_str(), "\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Genpsk => {
            print_stdout(&[PresharedKey::generate().to_base64().as_str(), "\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Pubkey => {
            let mut text = zeroize::Zeroizing::new(String::new());
            std::io::stdin()
                .take(1024)
                .read_to_string(&mut text)
                .map_err(|e| anyhow::anyhow!("reading the private key from stdin: {e}"))?;
            let key = PrivateKey::from_base64(&text)
                .map_err(|e| anyhow::anyhow!("the private key on stdin {e}"))?;
            print_stdout(&[&key.public_key().to_string(), "\n"])?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Show { interface } => {
            show::run(interface.as_deref())?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Import { conf, name } => {
            let text = std::fs::read_to_string(&conf)
                .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", conf.display()))?;
            let name = name.unwrap_or_else(|| {
                conf.file_stem()
                    .map(|s| s.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "wg0".into())
            });
            match tunneld_config::import_wg_quick(&text, &name) {
                Ok(toml) => {
                    print_stdout(&[&toml])?;
                    Ok(ExitCode::SUCCESS)
                }
                Err(errors) => {
                    for e in errors.0 {
                        eprintln!("{}: {e}", conf.display());
                    }
                    Ok(ExitCode::FAILURE)
                }
            }
        }
    }
}

/// `tunneld up`: starts the gateway the file describes, then waits for a signal: SIGHUP
/// reloads the file, SIGINT and SIGTERM stop it; so does a worker that stops on its own.
fn up(path: &std::path::Path) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    // Every line of an error is prefixed with the file, as `check` prints them.
    let in_file = |e: tunneld::Error| {
        let shown = path.display().to_string();
        let lines: Vec<String> = e
            .to_string()
            .lines()
            .map(|l| format!("{shown}: {l}"))
            .collect();
        anyhow::anyhow!(lines.join("\n"))
    };
    let settings = tunneld::Settings::from_file(path).map_err(in_file)?;
    let name = settings.interface_name().map(str::to_string);
    let gateway = tunneld::Gateway::builder(settings)
        .drop_privileges(true)
        .start()
        .map_err(|e| match e {
            tunneld::Error::Invalid(_) => in_file(e),
            other => anyhow::anyhow!(other),
        })?;
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install signal handlers")?;
    let signal = 'wait: loop {
        for signal in signals.pending() {
            match signal {
                SIGINT => break 'wait Some("SIGINT"),
                SIGTERM => break 'wait Some("SIGTERM"),
                // Logged by the gateway, success or not; the running settings stay on error.
                _ => drop(gateway.reload_file("SIGHUP")),
            }
        }
        if gateway.has_failed() {
            break None;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    gateway.shutdown()?;
    match (signal, name) {
        (Some(signal), Some(name)) => {
            tracing::info!(interface = %name, "{signal}: interface removed, exiting")
        }
        (Some(signal), None) => tracing::info!("{signal}: exiting"),
        (None, _) => {
            anyhow::bail!("the worker stopped unexpectedly; the interface has been removed")
        }
    }
    Ok(())
}

/// Writes a command's output, in parts so a secret is not copied into a new string. A reader
/// that stopped reading (`tunneld show | head -1`) ends the command quietly and successfully:
/// closing the pipe says it has what it wanted.
pub(crate) fn print_stdout(parts: &[&str]) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    let written = parts
        .iter()
        .try_for_each(|part| out.write_all(part.as_bytes()))
        .and_then(|()| out.flush());
    match written {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other.context("writing to standard output"),
    }
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("TUNNELD_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_target(false)
        .init();
}
