//! `tunneld`: a WireGuard site-to-site gateway. See README.md for the commands. The command
//! line over the `tunneld` library: what is here parses arguments, prints, and waits for
//! signals; everything else is the library's.

mod show;

use anyhow::Context;
use clap::{Parser, Subcommand};
use sd_notify::NotifyState;
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
    /// With an interface name (`tunneld [-f] INTERFACE`): stay in the foreground.
    #[arg(short, long, global = true)]
    foreground: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Bring up the interface a config describes and carry its traffic until SIGINT/SIGTERM.
    ///
    /// A config with a `[fleet]` section also joins a fleet of gateways on etcd: every other
    /// site's active gateway becomes a peer (no `[[peer]]` needed), the gateways of one site
    /// elect the one that forwards, and `tunneld show` prints the fleet's state. `up` does not
    /// wait for etcd: it reports ready once the interface is up and joins when the store
    /// answers. The operator's guide, etcd's setup included: docs/fleet.md (in the Debian
    /// package /usr/share/doc/tunneld/docs/fleet.md, with the example config
    /// /usr/share/doc/tunneld/examples/fleet-gateway.toml).
    Up { config: PathBuf },
    /// Run a WireGuard interface in user space (no TUN, no root, no capability) and serve
    /// the proxies its config's `[proxy]` section names, until SIGINT/SIGTERM.
    ///
    /// SOCKS5 (CONNECT and UDP ASSOCIATE, optional username/password), an HTTP proxy
    /// (CONNECT and `GET http://…`), and port forwards both ways (`[[proxy.forward]]`: a local
    /// port to an address in the tunnel; `[[proxy.reverse]]`: a port inside the tunnel to a
    /// local address). The config is `up`'s format plus `[proxy]`, without `[dataplane]`,
    /// `[[tls.*]]`, `[fleet]` or fwmark (`tunneld check` checks it by these rules). The UAPI
    /// socket (`wg show NAME`, `tunneld show NAME`) is in $RUNTIME_DIRECTORY, else
    /// /var/run/wireguard if writable, else $XDG_RUNTIME_DIR/tunneld; the log says where.
    /// SIGHUP reads the file again and applies its peers and users file. Example:
    /// /usr/share/doc/tunneld/examples/proxy.toml; README.md, "No root: tunneld proxy".
    Proxy { config: PathBuf },
    /// Validate config files as `up` does, without touching the system; print every error.
    ///
    /// A config with a `[proxy]` section is checked by `tunneld proxy`'s rules. Everything
    /// `up` would refuse is refused, the dataplane's checks on this machine
    /// included (workers, sub-tunnels, AF_XDP's limits, io_uring, the AEAD). A `[fleet]`
    /// section's files are read (readable PEM; the client key the certificate's, and
    /// readable by its owner alone); etcd is not contacted.
    #[command(after_long_help = tunneld::Settings::NOT_CHECKED)]
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
        /// One interface: its name, or its UAPI socket's path (default: every one in
        /// /var/run/wireguard).
        interface: Option<String>,
    },
    /// Convert a wg-quick .conf file to a tunneld TOML config on stdout.
    Import {
        conf: PathBuf,
        /// Interface name for the new config (default: the file's stem).
        #[arg(long)]
        name: Option<String>,
    },
    /// Create a bare interface, configured from then on by `wg` and `ip` (as `wireguard-go
    /// INTERFACE` does; `tunneld INTERFACE` is the same). Returns once the interface and its
    /// UAPI socket exist, leaving tunneld in the background (`-f`: stays in the foreground);
    /// exits when the interface is deleted or on SIGINT/SIGTERM.
    Bare {
        interface: String,
        /// A `[dataplane]` setting (`workers=2`, `backend=uring`, …), repeatable; also
        /// from `TUNNELD_DATAPLANE` (comma-separated).
        #[arg(long = "dataplane", value_name = "KEY=VALUE")]
        dataplane: Vec<String>,
    },
    /// Write the man pages (tunneld.8, tunneld-up.8, …) and the shell completions (bash, zsh, fish) into DIR,
    /// for packaging (`cargo xtask deb`).
    #[command(hide = true)]
    GenerateAssets { dir: PathBuf },
    #[command(external_subcommand)]
    Interface(Vec<String>),
}

fn main() -> ExitCode {
    keep_large_buffers_mapped();
    let cli = Cli::parse();
    match run(cli.command, cli.foreground) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("tunneld: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// Makes glibc map every allocation of 128 KiB or more on its own and unmap it when freed,
/// as it does at first. By default it raises that threshold to the size of the largest such
/// block freed, after which a user-space connection's 2 MiB TCP buffers (and its rings) come
/// from the heap: zeroed by hand (a memset of megabytes per connection) and kept by the
/// process after the connection ends. Mapped, they cost only the pages a connection touches.
fn keep_large_buffers_mapped() {
    const THRESHOLD: libc::c_int = 128 * 1024;
    // SAFETY: mallopt only changes the allocator's parameters; called before any thread.
    unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, THRESHOLD) };
}

/// The `[fleet]` section's files (its CA, certificate and key) are there and readable; etcd
/// is not contacted.
fn check_fleet_files(path: &std::path::Path) -> Result<(), String> {
    let text = std::fs::read_to_string(path).map_err(|e| e.to_string())?;
    let Ok(config) = tunneld_config::parse(&text) else {
        return Ok(());
    };
    match &config.fleet {
        Some(fleet) => {
            let base = path.parent().unwrap_or(std::path::Path::new("."));
            tunneld_fleet::FleetSettings::from_config(fleet, base)
                .map(drop)
                .map_err(|e| e.to_string())
        }
        None => Ok(()),
    }
}

/// Set by the parent of a backgrounded bare interface: the child says `ready` on stdout.
const READY_ENV: &str = "TUNNELD_BARE_READY";

/// The bare mode: the interface and its UAPI socket, configured by `wg`; in the background
/// unless `foreground`. The background is a copy of this program in the foreground, started
/// in a session of its own, which says `ready` on its standard output once the interface
/// exists (its errors before that reach the caller's standard error).
fn bare(interface: &str, dataplane: &[String], foreground: bool) -> anyhow::Result<ExitCode> {
    if !foreground {
        return spawn_in_background(interface, dataplane);
    }
    init_logging();
    let mut lines: Vec<String> = dataplane.to_vec();
    if let Ok(env) = std::env::var("TUNNELD_DATAPLANE") {
        lines.extend(
            env.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from),
        );
    }
    let settings = lines
        .iter()
        .map(|l| dataplane_line(l))
        .collect::<anyhow::Result<Vec<_>>>()?
        .join("\n");
    let bare = tunneld::BareInterface::create(interface, &settings)?;
    if std::env::var_os(READY_ENV).is_some() {
        say_ready_and_detach();
    }
    tell_systemd(&[NotifyState::Ready]);
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install signal handlers")?;
    let why = 'wait: loop {
        for signal in signals.pending() {
            match signal {
                SIGINT => break 'wait "SIGINT",
                SIGTERM => break 'wait "SIGTERM",
                _ => tracing::info!(
                    "SIGHUP: a bare interface has no file to reload; use wg syncconf"
                ),
            }
        }
        if !bare.interface_exists() {
            break "the interface was deleted";
        }
        if bare.has_failed() {
            break if bare.interface_exists() {
                "a worker stopped"
            } else {
                "the interface was deleted"
            };
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    tell_systemd(&[NotifyState::Stopping]);
    bare.shutdown()?;
    tracing::info!(interface, "{why}: exiting");
    Ok(if why == "a worker stopped" {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}

/// The man page and shell completions, generated from the command line's own definition so
/// they never drift from it.
fn generate_assets(dir: &std::path::Path) -> anyhow::Result<()> {
    use clap::CommandFactory;
    let write = |name: &str, bytes: &[u8]| {
        let path = dir.join(name);
        std::fs::write(&path, bytes).with_context(|| format!("cannot write {}", path.display()))
    };
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let command = Cli::command();
    // tunneld.8, and tunneld-up.8 and so on, which it names.
    let mut pages = vec![("tunneld".to_string(), command.clone())];
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        let name = format!("tunneld-{}", sub.get_name());
        pages.push((name.clone(), sub.clone().name(name)));
    }
    for (name, page_command) in pages {
        let mut page = Vec::new();
        clap_mangen::Man::new(page_command)
            .section("8")
            .render(&mut page)
            .context("cannot render the man page")?;
        write(&format!("{name}.8"), &page)?;
    }
    for (shell, name) in [
        (clap_complete::Shell::Bash, "tunneld.bash"),
        (clap_complete::Shell::Zsh, "_tunneld"),
        (clap_complete::Shell::Fish, "tunneld.fish"),
    ] {
        let mut script = Vec::new();
        clap_complete::generate(shell, &mut command.clone(), "tunneld", &mut script);
        write(name, &script)?;
    }
    Ok(())
}

/// Tells systemd (under `Type=notify`, where `NOTIFY_SOCKET` is set; nothing otherwise) how
/// the service stands. A failure to tell it is logged, never fatal.
fn tell_systemd(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(states) {
        tracing::warn!("cannot notify systemd: {e}");
    }
}

/// `KEY=VALUE` as a TOML line of the `[dataplane]` section: numbers, booleans, lists and
/// quoted strings as they are, any other value as a string (`backend=uring`).
fn dataplane_line(setting: &str) -> anyhow::Result<String> {
    let Some((key, value)) = setting.split_once('=') else {
        anyhow::bail!("--dataplane takes KEY=VALUE (e.g. workers=2), not `{setting}`");
    };
    let value = value.trim();
    let literal = value.parse::<i64>().is_ok()
        || matches!(value, "true" | "false")
        || value.starts_with(['"', '[']);
    Ok(if literal {
        format!("{} = {value}", key.trim())
    } else {
        format!("{} = {value:?}", key.trim())
    })
}

/// Tells the parent the interface is up, then lets go of the pipes it shares with it:
/// standard output and error go to /dev/null (unless `TUNNELD_LOG` asks for logs, which
/// then stay on the inherited standard error).
fn say_ready_and_detach() {
    let mut out = std::io::stdout().lock();
    let _ = out.write_all(b"ready\n").and_then(|()| out.flush());
    drop(out);
    if let Ok(null) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
    {
        use std::os::fd::AsRawFd;
        let fds: &[i32] = if std::env::var_os("TUNNELD_LOG").is_some() {
            &[0, 1]
        } else {
            &[0, 1, 2]
        };
        for fd in fds {
            // SAFETY: dup2 onto the standard descriptors of this process, from a valid one.
            unsafe { libc::dup2(null.as_raw_fd(), *fd) };
        }
    }
}

/// Starts this program again as `tunneld bare -f INTERFACE`, in a session of its own, and
/// waits until it says `ready` (success) or exits (its status, its errors already printed).
fn spawn_in_background(interface: &str, dataplane: &[String]) -> anyhow::Result<ExitCode> {
    use std::io::BufRead;
    use std::os::unix::process::CommandExt;
    let exe = std::env::current_exe().context("cannot find this program to start it again")?;
    let mut command = std::process::Command::new(exe);
    command.arg("bare").arg("--foreground");
    for d in dataplane {
        command.arg("--dataplane").arg(d);
    }
    command
        .arg(interface)
        .env(READY_ENV, "1")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped());
    // SAFETY: setsid is async-signal-safe and touches nothing of the parent's.
    unsafe {
        command.pre_exec(|| {
            libc::setsid();
            Ok(())
        });
    }
    let mut child = command
        .spawn()
        .context("cannot start tunneld in the background")?;
    let mut line = String::new();
    if let Some(out) = child.stdout.take() {
        let _ = std::io::BufReader::new(out).read_line(&mut line);
    }
    if line.trim() == "ready" {
        return Ok(ExitCode::SUCCESS);
    }
    let status = child.wait().context("waiting for the background tunneld")?;
    Ok(ExitCode::from(
        status
            .code()
            .and_then(|c| u8::try_from(c).ok())
            .filter(|c| *c != 0)
            .unwrap_or(1),
    ))
}

fn run(command: Command, foreground: bool) -> anyhow::Result<ExitCode> {
    match command {
        Command::Bare {
            interface,
            dataplane,
        } => bare(&interface, &dataplane, foreground),
        Command::GenerateAssets { dir } => {
            generate_assets(&dir)?;
            Ok(ExitCode::SUCCESS)
        }
        // `tunneld [-f] INTERFACE [-f]`, as wg-quick runs a userspace implementation.
        Command::Interface(args) => {
            let mut args = args.into_iter();
            let interface = args.next().unwrap_or_default();
            let mut foreground = foreground;
            for arg in args {
                match arg.as_str() {
                    "-f" | "--foreground" => foreground = true,
                    other => anyhow::bail!(
                        "unexpected argument `{other}` after the interface name `{interface}` (usage: tunneld [-f] INTERFACE)"
                    ),
                }
            }
            bare(&interface, &[], foreground)
        }
        Command::Up { config } => {
            init_logging();
            up(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Proxy { config } => {
            init_logging();
            proxy(&config)?;
            Ok(ExitCode::SUCCESS)
        }
        Command::Check { configs } => {
            let mut ok = true;
            for path in &configs {
                let checked = tunneld::Settings::check_file(path)
                    .map_err(|e| e.to_string())
                    .and_then(|()| check_fleet_files(path));
                match checked {
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

/// systemd's watchdog (`WatchdogSec=`), fed from the workers' progress rather than from a
/// timer that would go on while they are stuck: every half interval, `WATCHDOG=1` only if
/// every worker has run its timers since the last time. A worker stuck for the interval
/// leaves it unfed, and systemd kills and restarts the service.
struct Watchdog {
    every: std::time::Duration,
    next: std::time::Instant,
    last: Option<Vec<u64>>,
    warned: bool,
}

impl Watchdog {
    fn new(interval: std::time::Duration) -> Watchdog {
        let every = interval / 2;
        Watchdog {
            every,
            next: std::time::Instant::now() + every,
            last: None,
            warned: false,
        }
    }

    fn feed(&mut self, gateway: &tunneld::Gateway) {
        let now = std::time::Instant::now();
        if now < self.next {
            return;
        }
        self.next = now + self.every;
        // TLS forwarding alone has no WireGuard workers: its process is alive if we are.
        let progress = gateway.worker_progress().unwrap_or_default();
        let stuck: Vec<usize> = match &self.last {
            Some(last) => progress
                .iter()
                .zip(last)
                .enumerate()
                .filter(|(_, (now, then))| now <= then)
                .map(|(i, _)| i)
                .collect(),
            None => Vec::new(),
        };
        self.last = Some(progress);
        if stuck.is_empty() {
            self.warned = false;
            tell_systemd(&[NotifyState::Watchdog]);
        } else if !self.warned {
            self.warned = true;
            tracing::error!(
                "worker(s) {stuck:?} made no progress for {:?}: the systemd watchdog is not fed",
                self.every
            );
        }
    }
}

/// A settings error with every line prefixed by the file, as `check` prints them.
fn in_file(path: &std::path::Path, e: tunneld::Error) -> anyhow::Error {
    let shown = path.display().to_string();
    let lines: Vec<String> = e
        .to_string()
        .lines()
        .map(|l| format!("{shown}: {l}"))
        .collect();
    anyhow::anyhow!(lines.join("\n"))
}

/// Tells systemd a reload has begun (RELOADING=1 with the time it asks for).
fn notify_reloading() {
    let mut reloading = vec![NotifyState::Reloading];
    reloading.extend(NotifyState::monotonic_usec_now().ok());
    tell_systemd(&reloading);
}

/// `tunneld up`: starts the gateway the file describes, then waits for a signal: SIGHUP
/// reloads the file, SIGINT and SIGTERM stop it; so does a worker that stops on its own.
fn up(path: &std::path::Path) -> anyhow::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    let in_file = |e| in_file(path, e);
    let settings = tunneld::Settings::from_file(path).map_err(in_file)?;
    let name = settings.interface_name().map(str::to_string);
    // The fleet's files are read, and what of it takes a privilege opened, before the
    // gateway drops its privileges.
    let fleet_settings = match &settings.config().fleet {
        Some(config) => {
            let base = path.parent().unwrap_or(std::path::Path::new("."));
            let prepared = tunneld_fleet::FleetSettings::from_config(config, base)
                .and_then(|mut settings| settings.open_privileged().map(|()| settings))
                .map(|mut fleet| {
                    if let Some(key) = settings.private_key() {
                        fleet.set_static_key(key.clone());
                    }
                    fleet
                });
            Some(prepared.map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?)
        }
        None => None,
    };
    let gateway = tunneld::Gateway::builder(settings)
        .drop_privileges(true)
        .start()
        .map_err(|e| match e {
            tunneld::Error::Invalid(_) => in_file(e),
            other => anyhow::anyhow!(other),
        })?;
    let mut fleet = match fleet_settings {
        Some(settings) => {
            let joined = tunneld_fleet::Fleet::start(&gateway, settings);
            match joined {
                Ok(fleet) => Some(fleet),
                Err(e) => {
                    let _ = gateway.shutdown();
                    return Err(anyhow::anyhow!("{}: {e}", path.display()));
                }
            }
        }
        None => None,
    };
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM, SIGHUP])
        .context("cannot install signal handlers")?;
    let up_status = match &name {
        Some(name) => format!("interface {name} up"),
        None => "TLS forwarding up".into(),
    };
    // Ready once the interface is up, without waiting for the fleet's store: a gateway must
    // start (and forward with its file's peers) while etcd is down, and systemd would
    // otherwise hold its dependents, or kill it at TimeoutStartSec=. What the fleet is doing
    // is in STATUS= (`systemctl status`), kept current.
    let fleet_status = |fleet: &Option<tunneld_fleet::Fleet>| match fleet {
        Some(fleet) => format!("{up_status}; {}", fleet_summary(&fleet.status())),
        None => up_status.clone(),
    };
    let mut status = fleet_status(&fleet);
    tell_systemd(&[NotifyState::Ready, NotifyState::Status(&status)]);
    let mut status_checked = std::time::Instant::now();
    let mut watchdog = sd_notify::watchdog_enabled().map(Watchdog::new);
    let signal = 'wait: loop {
        for signal in signals.pending() {
            match signal {
                SIGINT => break 'wait Some("SIGINT"),
                SIGTERM => break 'wait Some("SIGTERM"),
                _ => {
                    notify_reloading();
                    // Logged by the gateway, success or not; the running settings stay on
                    // error.
                    drop(gateway.reload_file("SIGHUP"));
                    tell_systemd(&[NotifyState::Ready, NotifyState::Status(&status)]);
                }
            }
        }
        if gateway.has_failed() {
            break None;
        }
        if let Some(watchdog) = &mut watchdog {
            watchdog.feed(&gateway);
        }
        if status_checked.elapsed() >= std::time::Duration::from_secs(1) {
            status_checked = std::time::Instant::now();
            let now = fleet_status(&fleet);
            if now != status {
                status = now;
                tell_systemd(&[NotifyState::Status(&status)]);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    tell_systemd(&[NotifyState::Stopping]);
    // Leaving first lets a standby of this site take over while this one still forwards.
    if let Some(fleet) = fleet.as_mut() {
        fleet.stop();
    }
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

/// `tunneld proxy`: starts the proxy the file describes on a runtime of its own, then waits
/// for SIGINT or SIGTERM; SIGHUP reads the file again and applies its peers and users.
fn proxy(path: &std::path::Path) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let in_file = |e| in_file(path, e);
    let settings = tunneld::proxy::ProxySettings::from_file(path).map_err(in_file)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("tunneld-proxy")
        .build()
        .context("cannot start the proxy's runtime")?;
    runtime.block_on(async {
        let mut interrupt =
            signal(SignalKind::interrupt()).context("cannot install signal handlers")?;
        let mut terminate =
            signal(SignalKind::terminate()).context("cannot install signal handlers")?;
        let mut hangup = signal(SignalKind::hangup()).context("cannot install signal handlers")?;
        let mut proxy = tunneld::proxy::Proxy::start(settings)
            .await
            .map_err(|e| match e {
                tunneld::Error::Invalid(_) => in_file(e),
                other => anyhow::anyhow!(other),
            })?;
        let status = format!("proxy {} up", proxy.interface_name());
        tell_systemd(&[NotifyState::Ready, NotifyState::Status(&status)]);
        let signal = loop {
            tokio::select! {
                _ = interrupt.recv() => break "SIGINT",
                _ = terminate.recv() => break "SIGTERM",
                _ = hangup.recv() => {
                    notify_reloading();
                    match tunneld::proxy::ProxySettings::from_file(path) {
                        Ok(settings) => match proxy.reload(settings).await {
                            Ok(_) => {}
                            Err(tunneld::Error::Stopped) => break "the tunnel's stop",
                            Err(e) => tracing::error!("SIGHUP: reload: {e}; nothing changed"),
                        },
                        Err(e) => tracing::error!("SIGHUP: {}; nothing changed", in_file(e)),
                    }
                    tell_systemd(&[NotifyState::Ready, NotifyState::Status(&status)]);
                }
            }
        };
        tell_systemd(&[NotifyState::Stopping]);
        let name = proxy.interface_name().to_string();
        proxy.shutdown().await;
        tracing::info!(interface = %name, "{signal}: proxy stopped, exiting");
        Ok(())
    })
}

/// The fleet's state in a few words, for systemd's STATUS=.
fn fleet_summary(s: &tunneld_fleet::FleetStatus) -> String {
    let who = format!("fleet {}/{}", s.site, s.gateway);
    match (&s.store_error, &s.refused) {
        (_, Some(_)) => format!("{who}: name held by another gateway, not in the fleet"),
        (Some(e), _) if !s.joined => format!("{who}: not joined, the store {e}"),
        (Some(e), _) => format!("{who}: store down ({e}), forwarding with the peers last known"),
        (None, None) if s.active => format!("{who}: active"),
        (None, None) => format!("{who}: standby"),
    }
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
