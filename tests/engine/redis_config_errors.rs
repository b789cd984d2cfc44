//! What the Redis builder refuses is a typed [`ConfigError`], one variant per refusal,
//! reachable from the `BackendError` that `build()` returns and from a `LockError`; its
//! text is the error's.
#![cfg(feature = "redis")]

use std::time::Duration;

use tower_lock::{
    BackendErrorKind, LockError,
    engine::{
        BackendError, ConfigError,
        redis::{MAX_COMMAND_TIMEOUT, MAX_PREFIX_LEN, RedisBackend, RedisBackendBuilder},
    },
};
use tower_lock_test_support::redis::RedisServer;

/// The refusal `build()` gives, checked to be a `Config` error that says what its
/// `ConfigError` says, and reachable the same way through a `LockError`.
async fn refusal(builder: RedisBackendBuilder) -> ConfigError {
    let err: BackendError = builder.build().await.expect_err("build() refuses this");
    assert_eq!(err.kind(), BackendErrorKind::Config, "{err}");
    let config = err.config().expect("a typed refusal").clone();
    assert!(
        err.to_string()
            .starts_with(&format!("configuration error: {config}")),
        "{err}"
    );
    assert_eq!(LockError::from(err).config(), Some(&config));
    config
}

#[tokio::test]
async fn settings_out_of_range_are_refused_each_with_its_variant() {
    // Port 1: nothing listens, but none of these gets as far as connecting.
    let builder = || RedisBackend::builder("redis://127.0.0.1:1");
    let prefix = "x".repeat(MAX_PREFIX_LEN + 1);
    assert_eq!(
        refusal(builder().prefix(prefix.clone())).await,
        ConfigError::Prefix {
            prefix,
            max: MAX_PREFIX_LEN
        }
    );
    assert!(matches!(
        refusal(builder().prefix("a{b}")).await,
        ConfigError::Prefix { prefix, .. } if prefix == "a{b}"
    ));
    assert_eq!(refusal(builder().pool_size(0)).await, ConfigError::PoolSize);
    assert_eq!(
        refusal(builder().command_timeout(Duration::ZERO)).await,
        ConfigError::CommandTimeout {
            timeout: Duration::ZERO,
            max: MAX_COMMAND_TIMEOUT
        }
    );
    for (replicas, timeout) in [(0, Duration::from_millis(100)), (1, Duration::MAX)] {
        assert_eq!(
            refusal(builder().replica_ack(replicas, timeout)).await,
            ConfigError::ReplicaAck {
                max: MAX_COMMAND_TIMEOUT
            }
        );
    }
}

#[tokio::test]
async fn a_url_that_cannot_be_used_is_refused_as_invalid_url() {
    for url in ["not a url", "http://127.0.0.1:6379"] {
        let err = RedisBackend::builder(url).build().await.unwrap_err();
        assert_eq!(err.config(), Some(&ConfigError::InvalidUrl), "{url}: {err}");
        // The cause redis-rs gave is kept as the source.
        assert!(std::error::Error::source(&err).is_some(), "{url}: {err}");
    }
}

#[tokio::test]
async fn an_evicting_server_is_refused_as_evicting_policy() {
    let server = RedisServer::start_with(["--maxmemory-policy", "allkeys-lru"]);
    assert_eq!(
        refusal(RedisBackend::builder(server.url()).prefix("cfg-evict")).await,
        ConfigError::EvictingPolicy("allkeys-lru".into())
    );
}

#[tokio::test]
async fn a_server_that_hides_its_policy_is_refused_as_unreadable() {
    let server = RedisServer::start_with([
        "--rename-command",
        "CONFIG",
        "",
        "--rename-command",
        "INFO",
        "",
    ]);
    assert_eq!(
        refusal(RedisBackend::builder(server.url()).prefix("cfg-hidden")).await,
        ConfigError::EvictionPolicyUnreadable
    );
}

#[tokio::test]
async fn a_user_without_channel_rights_is_refused_as_channel_rights() {
    let server = RedisServer::start();
    let user = |name: &str, rules: &[&str]| {
        let mut args = vec!["ACL", "SETUSER", name, "on", ">pw", "~*", "+@all"];
        args.extend_from_slice(rules);
        assert_eq!(server.cli(&args), "OK");
        format!("redis://{name}:pw@127.0.0.1:{}", server.port())
    };
    // Asked with ACL DRYRUN: the user is named, and the first right it lacks.
    let url = user("nochannels", &["resetchannels"]);
    let refused = refusal(RedisBackend::builder(url).prefix("cfg-acl")).await;
    assert!(
        matches!(
            &refused,
            ConfigError::ChannelRights { user: Some(user), command: "SUBSCRIBE", prefix, .. }
                if user == "nochannels" && prefix == "cfg-acl"
        ),
        "{refused:?}"
    );
    // A user that may not run ACL commands: the publish right is tried for real.
    let url = user("noacl", &["-acl", "resetchannels"]);
    let refused = refusal(RedisBackend::builder(url).prefix("cfg-acl")).await;
    assert!(
        matches!(
            &refused,
            ConfigError::ChannelRights { user: None, command: "PUBLISH", reason, .. }
                if reason == "NOPERM"
        ),
        "{refused:?}"
    );
}

#[cfg(feature = "redis-sentinel")]
#[tokio::test]
async fn no_sentinel_is_refused_as_sentinel_urls() {
    for urls in [vec![], vec!["not a url"]] {
        let builder = RedisBackend::sentinel(urls.clone(), "mymaster");
        assert_eq!(
            refusal(builder).await,
            ConfigError::SentinelUrls,
            "{urls:?}"
        );
    }
}

#[cfg(feature = "redis-cluster")]
#[tokio::test]
async fn no_cluster_node_is_refused_as_cluster_urls() {
    for nodes in [vec![], vec!["not a url"]] {
        let builder = RedisBackend::cluster(nodes.clone());
        assert_eq!(
            refusal(builder).await,
            ConfigError::ClusterUrls,
            "{nodes:?}"
        );
    }
}

/// A rolling upgrade: a node of the earlier key layout (locks and shared leases apart)
/// watches its server on `<prefix>:{session}:wake:`; while one does, `build()` refuses the
/// prefix (`EarlierLayout`), and builds once it has gone. A node of this layout never
/// trips it, and another prefix is free to use meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_in_use_by_the_earlier_key_layout_is_refused_until_it_is_left() {
    let server = RedisServer::shared();
    let prefix = tower_lock_test_support::prefix::unique("upgrade");
    let channel = format!("{prefix}:{{session}}:wake:");
    // What an earlier node's watch connection does.
    let mut earlier = std::process::Command::new("redis-cli")
        .args(["-p", &server.port().to_string(), "SUBSCRIBE", &channel])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("run redis-cli SUBSCRIBE");
    let give_up = std::time::Instant::now() + Duration::from_secs(10);
    while server.cli(["PUBSUB", "NUMSUB", &channel]).lines().nth(1) != Some("1") {
        assert!(std::time::Instant::now() < give_up, "never subscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let builder = || RedisBackend::builder(server.url()).prefix(prefix.clone());
    let refused = refusal(builder()).await;
    assert_eq!(
        refused,
        ConfigError::EarlierLayout {
            prefix: prefix.clone(),
            nodes: 1
        }
    );
    assert!(refused.to_string().contains("new prefix"), "{refused}");
    // Another prefix is not the earlier nodes' business.
    let other = RedisBackend::builder(server.url())
        .prefix(format!("{prefix}-new"))
        .build()
        .await
        .expect("a prefix of its own");
    drop(other);
    earlier.kill().unwrap();
    earlier.wait().unwrap();
    while server.cli(["PUBSUB", "NUMSUB", &channel]).lines().nth(1) != Some("0") {
        assert!(std::time::Instant::now() < give_up, "never unsubscribed");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The earlier nodes gone, this layout takes the prefix; its own nodes never trip it.
    let first = builder().build().await.expect("the prefix left");
    let second = builder()
        .build()
        .await
        .expect("a node of this layout beside another");
    drop((first, second));
}
