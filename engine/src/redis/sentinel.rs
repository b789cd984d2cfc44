//! Redis Sentinel (feature `redis-sentinel`, gated once, where this module is declared):
//! [`RedisBackend::sentinel`], and finding the primary Sentinel names, within a budget.
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

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use futures_util::future::select_ok;
use redis::{Client, RedisError};

use super::{
    RedisBackend, RedisBackendBuilder,
    builder::{Target, one_server},
    commands::Commands,
    connector::ClientSource,
    wakeup::Subscriber,
};
use crate::{BackendError, BoxFuture, ConfigError};

impl RedisBackend {
    /// A builder for the primary that Redis Sentinel names `service` (`mymaster` in
    /// Sentinel's examples), given the URLs of some Sentinels (`redis://host:26379`).
    /// Every new connection asks Sentinel for the current primary, so after a failover the
    /// backend follows it: connections that fail (or find their server demoted:
    /// `READONLY`) are retired, and their replacements go to the new primary.
    #[must_use]
    pub fn sentinel<I, S>(sentinels: I, service: impl Into<String>) -> RedisBackendBuilder
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        RedisBackendBuilder::new(Arc::new(Sentinels {
            urls: sentinels.into_iter().map(Into::into).collect(),
            service: service.into(),
        }))
    }
}

/// Sentinels and the name of the primary they watch.
#[derive(Debug)]
struct Sentinels {
    urls: Vec<String>,
    service: String,
}

impl Target for Sentinels {
    fn connect(
        &self,
        timeout: Duration,
        pool_size: u32,
    ) -> BoxFuture<'_, Result<(Commands, Subscriber), BackendError>> {
        // Half a connect's budget for the lookup, half for the connect itself.
        let lookup = SentinelLookup::new(&self.urls, &self.service, timeout / 2);
        Box::pin(async move {
            let lookup =
                lookup.map_err(|e| BackendError::from(ConfigError::SentinelUrls).with_source(e))?;
            Ok(one_server(Box::new(lookup), timeout, pool_size))
        })
    }

    fn uses_tls(&self) -> bool {
        self.urls.iter().any(|url| super::tls::is_tls_url(url))
    }
}

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
        Ok(Self {
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

impl ClientSource for SentinelLookup {
    fn client(&self) -> BoxFuture<'_, Result<Client, RedisError>> {
        Box::pin(self.primary())
    }

    fn describe(&self) -> String {
        "the redis primary that Sentinel names".to_owned()
    }
}
