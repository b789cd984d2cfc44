//! The subscriber connection on one server: RESP3 (`SUBSCRIBE`, messages as pushes), made
//! through the command pool's connector, so a Sentinel failover is followed.

use std::{sync::Arc, time::Duration};

use redis::{PushInfo, RedisError, aio::MultiplexedConnection};

use super::{
    HubState, Pushes, Sink, Subscriber,
    task::{Link, Step, subscriber},
    timeout,
};
use crate::{BoxFuture, redis::connector::Connector};

/// The subscriber of a hub on one server, whose connections `connector` makes (for
/// Sentinel: to the primary it names now).
pub(crate) fn single(connector: Arc<Connector>) -> Subscriber {
    subscriber(move |push, limit| {
        let connector = connector.clone();
        Box::pin(async move { connect(&connector, push, limit).await })
    })
}

/// A RESP3 connection to the server the connector names now (for Sentinel: the current
/// primary), sending its pushes to `push`.
async fn connect(
    connector: &Connector,
    push: Pushes,
    timeout: Duration,
) -> Result<MultiplexedConnection, RedisError> {
    let client = connector.resp3_client().await?;
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout))
        .set_push_sender(push);
    client
        .get_multiplexed_async_connection_with_config(&config)
        .await
}

impl Link for MultiplexedConnection {
    fn on_push(&mut self, _shared: &HubState, push: &PushInfo) -> Step {
        // The connection dropped (the only push that comes here but subscription
        // confirmations, which need nothing).
        if push.kind == redis::PushKind::Disconnection {
            Step::Lost
        } else {
            Step::Ignore
        }
    }
}

impl Sink for MultiplexedConnection {
    fn subscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), RedisError>> {
        Box::pin(timeout(limit, Self::subscribe(self, channels)))
    }

    fn unsubscribe<'a>(
        &'a mut self,
        channels: &'a [String],
        limit: Duration,
    ) -> BoxFuture<'a, Result<(), RedisError>> {
        Box::pin(timeout(limit, Self::unsubscribe(self, channels)))
    }
}
