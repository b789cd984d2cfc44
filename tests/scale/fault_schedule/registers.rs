//! The fenced registers the schedule's critical sections write.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use super::{LOCK_KEYS, PERMIT_KEY};

/// Fenced registers, one per key (the lock keys and the mixed one): a read or a write carrying a fence lower than the
/// highest the register has seen is refused.
#[derive(Clone)]
pub(super) enum Registers {
    /// In the test process: `(highest fence, value)` per key; the flag says whether it
    /// checks fences (`false`: the deliberate break, a store that accepts every write).
    Local(Arc<Mutex<HashMap<String, (u64, u64)>>>, bool),
    #[cfg(feature = "redis")]
    Redis(redis::aio::MultiplexedConnection),
}

#[cfg(feature = "redis")]
const FENCED: &str = r"
local fence = tonumber(redis.call('HGET', KEYS[1], 'fence') or '0')
if tonumber(ARGV[1]) < fence then return {0, 0} end
redis.call('HSET', KEYS[1], 'fence', ARGV[1])
if ARGV[2] ~= '' then
  redis.call('HSET', KEYS[1], 'value', ARGV[2])
  return {1, tonumber(ARGV[2])}
end
return {1, tonumber(redis.call('HGET', KEYS[1], 'value') or '0')}
";

impl Registers {
    /// A fenced read (`value: None`) or write; `None` when refused.
    pub(super) async fn call(&self, key: &str, fence: u64, value: Option<u64>) -> Option<u64> {
        match self {
            Self::Local(cells, fenced) => {
                let mut cells = cells.lock().unwrap();
                let cell = cells.entry(key.to_owned()).or_default();
                if *fenced && fence < cell.0 {
                    return None;
                }
                cell.0 = fence;
                if let Some(v) = value {
                    cell.1 = v;
                }
                Some(cell.1)
            }
            #[cfg(feature = "redis")]
            Self::Redis(conn) => {
                let (accepted, v): (u8, u64) = redis::Script::new(FENCED)
                    .key(format!("reg:{key}"))
                    .arg(fence.to_string())
                    .arg(value.map(|v| v.to_string()).unwrap_or_default())
                    .invoke_async(&mut conn.clone())
                    .await
                    .expect("the register's server has no faults");
                (accepted == 1).then_some(v)
            }
        }
    }

    /// Each register's value now.
    pub(super) async fn finals(&self) -> Vec<(String, u64)> {
        let mut out = Vec::new();
        for key in [LOCK_KEYS[0], LOCK_KEYS[1], PERMIT_KEY] {
            // A read with fence 0 is refused once any write landed: read the value directly.
            let value = match self {
                Self::Local(cells, _) => cells.lock().unwrap().get(key).map_or(0, |c| c.1),
                #[cfg(feature = "redis")]
                Self::Redis(conn) => {
                    let v: Option<u64> = redis::cmd("HGET")
                        .arg(format!("reg:{key}"))
                        .arg("value")
                        .query_async(&mut conn.clone())
                        .await
                        .unwrap();
                    v.unwrap_or(0)
                }
            };
            out.push((key.to_owned(), value));
        }
        out
    }
}
