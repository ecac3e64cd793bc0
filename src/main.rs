//! kvcached: a memcached-compatible in-memory key-value cache server.

mod cli;
mod config;
mod daemon;

fn main() {
    let _ = cli::parse(std::env::args_os().skip(1));
}
