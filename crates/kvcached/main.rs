//! kvcached: a memcached-compatible in-memory key-value cache server.
//!
//! `main` turns the command line into a [`config::Config`], prepares the process (limits,
//! privileges, daemon mode, pid file), binds the listening sockets and hands them to
//! [`server::run`].

mod exec;
mod features;
mod runtime;
mod server;
mod setup;
mod state;

use std::process::ExitCode;

use setup::{cli, conffile, config, daemon, VERSION};

fn main() -> ExitCode {
    let args = std::env::args_os().skip(1).collect();
    let (args, file_notes) = match conffile::expand(args, |p| std::fs::read_to_string(p)) {
        Ok(expanded) => expanded,
        Err(msg) => {
            eprintln!("kvcached: {msg}");
            return ExitCode::from(64);
        }
    };
    let (config, notes) = match cli::parse(args) {
        Ok(cli::Action::Run { config, notes }) => (*config, notes),
        Ok(cli::Action::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Ok(cli::Action::Version) => {
            println!(
                "kvcached {} (memcached {VERSION})",
                env!("CARGO_PKG_VERSION")
            );
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("kvcached: {msg}");
            eprintln!("Try 'kvcached -h' for the list of options.");
            return ExitCode::from(64);
        }
    };
    setup::logging::init(config.verbose, config.log_format);
    for note in &file_notes {
        tracing::info!("{note}");
    }
    for note in &notes {
        tracing::warn!("{note}");
    }
    // Like memcached, read the TLS files before anything else (and before dropping
    // privileges); a file that cannot be used stops the start (EX_USAGE).
    let tls = match tls_setup(&config) {
        Ok(tls) => tls,
        Err(msg) => {
            eprintln!("kvcached: {msg}");
            return ExitCode::from(64);
        }
    };
    // Like memcached, refuse to start when -c cannot be honoured (EX_OSERR).
    if let Err(e) = daemon::raise_fd_limit(config.max_connections) {
        eprintln!("kvcached: {e}");
        return ExitCode::from(71);
    }
    match start(config, tls) {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("kvcached: {msg}");
            ExitCode::FAILURE
        }
    }
}

/// The server's TLS (`-Z`), built from `-o ssl_*`, one configuration per listener policy.
fn tls_setup(config: &config::Config) -> Result<Option<kvtls::server::ServerTls>, String> {
    if !config.ssl.enabled {
        return Ok(None);
    }
    let tls =
        kvtls::server::ServerTls::new(config.ssl.settings.clone()).map_err(|e| e.to_string())?;
    Ok(Some(tls))
}

fn start(config: config::Config, tls: Option<kvtls::server::ServerTls>) -> Result<(), String> {
    daemon::drop_privileges(config.user.as_deref())?;
    daemon::ignore_file_size_signal();
    let listeners = runtime::listener::bind_listeners(&config)?;
    let udp = runtime::udp::bind_first(&config)?;
    if listeners.is_empty() && udp.is_empty() {
        tracing::warn!("listening on nothing: -p 0 turns TCP off and UDP is off (-U)");
    }
    if config.max_core_file {
        if let Err(e) = daemon::set_core_limit() {
            tracing::warn!("{e}");
        }
    }
    if config.daemonize {
        // Like memcached: -r keeps the working directory (for core files), -v keeps stderr.
        // SAFETY: this is still the only thread: nothing before it in `main` starts one (the
        // log subscriber, TLS set-up and binding do not), and the server's threads start in
        // `server::run`, below.
        unsafe { daemon::daemonize_with(config.max_core_file, config.verbose > 0) }
            .map_err(|e| format!("failed to daemonize: {e}"))?;
    }
    if let Some(path) = &config.pid_file {
        if let Some(pid) = daemon::running_pid_in(path) {
            tracing::warn!(
                "pid file {} names a running process ({pid}); overwriting",
                path.display()
            );
        }
        daemon::write_pid_file(path)
            .map_err(|e| format!("could not write pid file {}: {e}", path.display()))?;
    }
    if config.lock_memory {
        if let Err(e) = daemon::lock_memory() {
            tracing::warn!("{e}");
        }
    }
    let pid_file = config.pid_file.clone();
    let result = server::run(config, listeners, udp, tls);
    if let Some(path) = pid_file {
        let _ = daemon::remove_pid_file(&path);
    }
    result
}
