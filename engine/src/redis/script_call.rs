//! [`ScriptCall`]: one script call, written straight into the command it is.

use redis::{Script, ToRedisArgs};

/// One script call (`EVALSHA sha numkeys keys... args...`), built as the one command it
/// is: its keys and arguments are written into the command's buffer as they are added, so
/// a call costs the command's two buffers and nothing per argument (redis-rs's
/// `ScriptInvocation` keeps a `Vec` per argument, then copies them into a command).
pub(crate) struct ScriptCall {
    pub(super) cmd: redis::Cmd,
    /// Keys still to add before the first argument.
    keys_left: usize,
    /// Whether running it twice is harmless (see [`repeatable`](Self::repeatable)).
    pub(super) repeatable: bool,
}

impl ScriptCall {
    /// A call of `script` with `keys` keys (added first, with [`key`](Self::key)).
    pub(crate) fn new(script: &Script, keys: usize) -> Self {
        let mut cmd = redis::Cmd::with_capacity(3 + keys + 8, 96 + 64 * keys);
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys);
        Self {
            cmd,
            keys_left: keys,
            repeatable: false,
        }
    }

    /// Mark the call as one that may run twice with the outcome of once: it acts by its
    /// token (a release, a grant that is a re-entry the second time, a renewal, a leave)
    /// or only reads. A connection that drops after such a call was handed to it is then
    /// given the call again on a fresh connection (the server had most likely closed it
    /// while idle, before reading the call), within the same deadline.
    pub(crate) fn repeatable(&mut self) -> &mut Self {
        self.repeatable = true;
        self
    }

    /// Add a key (`KEYS[i]`).
    pub(crate) fn key(&mut self, key: impl ToRedisArgs) -> &mut Self {
        debug_assert!(self.keys_left > 0, "more keys than announced");
        self.keys_left = self.keys_left.saturating_sub(1);
        self.cmd.arg(key);
        self
    }

    /// The command, to write every key and then every argument into at once.
    pub(crate) fn keys_and_args(&mut self) -> &mut redis::Cmd {
        self.keys_left = 0;
        &mut self.cmd
    }

    /// Add an argument (`ARGV[i]`), after every key.
    pub(crate) fn arg(&mut self, arg: impl ToRedisArgs) -> &mut Self {
        debug_assert_eq!(self.keys_left, 0, "an argument before the last key");
        self.cmd.arg(arg);
        self
    }
}
