//! `tower-lock-cli`: what an engineer on call runs against the store the services share
//! (one Redis, a Sentinel-watched one, a Cluster, or Postgres) to see who holds a key and
//! who waits, release it safely, read or delete an idempotency record, and compute the key
//! a layer derives from a request, without knowing the store's layout.
//!
//! ```text
//! tower-lock-cli --redis redis://10.0.0.5 status 'billing/header=x-tenant-id/acme'
//! tower-lock-cli --postgres postgres://app@db/app --json list --held
//! tower-lock-cli --redis-cluster redis://10.0.0.5:7000 release KEY --holder web-3:4242 --yes
//! tower-lock-cli key --namespace billing --header x-tenant-id acme
//! ```
//!
//! Every command takes `--json` (one JSON document on stdout). Exit codes, for scripts:
//!
//! | code | meaning |
//! | --- | --- |
//! | 0 | done: the key is held (`status`), the record exists (`record get`), released, listed, computed |
//! | 1 | nothing there: the key is free (`status`), no record, nothing held to release (or not by `--holder`) |
//! | 2 | usage: bad arguments, an invalid key or option (clap's own code for a usage error) |
//! | 3 | the backend is unavailable or failed (connection, timeout, schema not migrated) |
//! | 4 | not confirmed: `release` without `--yes` was not answered `y` |

mod args;
mod connect;
mod key;
mod list;
mod output;
mod record;
mod release;
mod status;

use std::process::ExitCode;

use clap::Parser;

use args::{Cli, Command};
use output::{Failure, Outcome};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let json = cli.json;
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => return Failure::backend(format!("cannot start a runtime: {e}")).exit(json),
    };
    match runtime.block_on(run(cli)) {
        Ok(outcome) => outcome.exit(json),
        Err(failure) => failure.exit(json),
    }
}

async fn run(cli: Cli) -> Result<Outcome, Failure> {
    match &cli.command {
        // Needs no backend.
        Command::Key(k) => key::run(k),
        Command::Status { key } => status::run(&connect::engine(&cli.store).await?, key).await,
        Command::List(l) => list::run(&cli.store, l).await,
        Command::Release(r) => release::run(&connect::engine(&cli.store).await?, r).await,
        Command::Record(r) => record::run(&connect::engine(&cli.store).await?, r).await,
    }
}
