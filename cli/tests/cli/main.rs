//! `tower-lock-cli` run as a process against real servers (a redis-server, a Redis Cluster,
//! a Postgres cluster, each started by the test-support fixtures) while real engines hold
//! and wait: its output asserted, its `--json` parsed, its exit codes checked.

mod postgres;
mod redis;
mod redis_cluster;
mod run;
mod scenarios;
mod usage;
