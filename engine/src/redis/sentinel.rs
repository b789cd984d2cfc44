//! Finding the primary that Redis Sentinel names, within a budget.
//!
//! Every Sentinel is asked at once (`SENTINEL GET-MASTER-ADDR-BY-NAME`), each on a
//! connection of its own made for the question, and the first answer wins: one Sentinel
//! that hangs (a paused process, a partition: it accepts the connection and never
//! answers) costs nothing, where asking them in turn would wait on it first every time.
//! If none answers within the budget, the primary found last is used again, so a Sentinel
//! outage alone does not stop reconnects to a primary that is still there.
//!
//! (redis-rs's own `SentinelClient` asks the Sentinels in order over cached connections
//! without a timeout, behind a lock that every new connection needed: one hung Sentinel
//! stopped every reconnect of the engine, the wake-up subscriber's included.)

use std::{sync::Mutex, time::Duration};

use futures_util::future::select_ok;
use redis::{Client, RedisError};

/// The Sentinels and the service they watch.
pub(crate) struct SentinelLookup {
    sentinels: Vec<Client>,
    service: String,
    /// How long one lookup may take: half a connect's budget (the command timeout), the
    /// other half being the connect to the primary itself.
    budget: Duration,
    /// The last primary found.
    last: Mutex<Option<Client>>,
}

impl SentinelLookup {
    /// Clients for `sentinels` (their URLs), each lookup within `budget`; fails on a
    /// malformed URL, or none.
    pub(crate) fn new(
        sentinels: &[String],
        service: &str,
        budget: Duration,
    ) -> Result<Self, RedisError> {
        if sentinels.is_empty() {
            return Err(RedisError::from((
                redis::ErrorKind::InvalidClientConfig,
                "no Sentinel URLs",
            )));
        }
        Ok(SentinelLookup {
            sentinels: sentinels
                .iter()
                .map(|url| Client::open(url.as_str()))
                .collect::<Result<_, _>>()?,
            service: service.to_owned(),
            budget,
            last: Mutex::new(None),
        })
    }

    /// A client for the primary the Sentinels name now, asked within the lookup's budget;
    /// the last one found if none answers in time.
    pub(crate) async fn primary(&self) -> Result<Client, RedisError> {
        let budget = self.budget;
        let config = redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(budget))
            .set_response_timeout(Some(budget));
        let asks = self.sentinels.iter().map(|sentinel| {
            Box::pin(async {
                let mut conn = sentinel
                    .get_multiplexed_async_connection_with_config(&config)
                    .await?;
                let addr: Option<(String, u16)> = redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(&self.service)
                    .query_async(&mut conn)
                    .await?;
                let (host, port) = addr.ok_or_else(|| {
                    RedisError::from((
                        redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                        "the Sentinel does not know the service",
                    ))
                })?;
                let host = if host.contains(':') {
                    format!("[{host}]")
                } else {
                    host
                };
                Client::open(format!("redis://{host}:{port}"))
            })
        });
        let answer = match tokio::time::timeout(budget, select_ok(asks)).await {
            Ok(Ok((primary, _))) => Ok(primary),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "no Sentinel named the primary in time",
            ))),
        };
        let mut last = self.last.lock().unwrap();
        match answer {
            Ok(primary) => {
                *last = Some(primary.clone());
                Ok(primary)
            }
            Err(e) => match last.as_ref() {
                Some(primary) => {
                    tracing::debug!(error = %e, "no Sentinel answered; using the primary found last");
                    Ok(primary.clone())
                }
                None => Err(e),
            },
        }
    }
}
