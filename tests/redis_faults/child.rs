//! Child processes for the fault tests: this test binary run again, running one test that
//! plays a role (holds a lock, waits in a queue, ...) until it ends or is killed.

use std::process::{Child, Command, Stdio};

/// Run this test binary again as a child process that runs only the test `name` of
/// `module` (pass `module_path!()`), with `env` set; its output is discarded.
pub(crate) fn rerun(module: &str, name: &str, env: &[(&str, &str)]) -> Child {
    // libtest names a test by its module path, without the crate's name.
    let module = module.split_once("::").map_or(module, |(_, rest)| rest);
    Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("{module}::{name}"),
            "--nocapture",
            "--test-threads=1",
        ])
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .spawn()
        .expect("spawn child test process")
}
