//! The Redis backend on connection settings the application already has: a one-line
//! engine, a `redis::Client` of its own (database, TLS with its own root certificate), and
//! `redis::ConnectionInfo`; and what `build()` refuses about the server and the user it is
//! given (an evicting `maxmemory-policy`, a user without rights on the wake-up channels).
#![cfg(feature = "redis")]

use std::time::Duration;

use tower_lock::BackendErrorKind;
use tower_lock::{
    LockEngine,
    engine::redis::{
        RedisBackend,
        redis::{self, IntoConnectionInfo},
    },
};
use tower_lock_test_support::redis::RedisServer;

/// Build a backend on `url` under `prefix`; the error's text when refused.
async fn build(url: String, prefix: &str) -> Result<RedisBackend, String> {
    RedisBackend::builder(url)
        .prefix(prefix)
        .build()
        .await
        .map_err(|e| {
            assert_eq!(e.kind(), BackendErrorKind::Config, "{e}");
            e.to_string()
        })
}

/// Every engine key has a TTL, so a server that may evict keys with one could hand a
/// held lock to a second holder: `build()` reads the policy (`CONFIG GET`, or `INFO
/// memory` where `CONFIG` is renamed) and refuses anything but `noeviction`.
#[tokio::test]
async fn build_refuses_a_server_that_may_evict_keys() {
    let evicting = RedisServer::start_with(["--maxmemory-policy", "allkeys-lru"]);
    let err = build(evicting.url(), "evict").await.err();
    let err = err.expect("build() accepted a server with maxmemory-policy allkeys-lru");
    assert!(
        err.contains("maxmemory-policy") && err.contains("allkeys-lru"),
        "{err}"
    );
    // An explicit opt-in.
    let opted_in = RedisBackend::builder(evicting.url())
        .prefix("evict")
        .allow_evicting_policy(true);
    LockEngine::new(opted_in.build().await.unwrap())
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();

    // CONFIG renamed away (as managed services do): the policy is read from INFO.
    let renamed = RedisServer::start_with([
        "--maxmemory-policy",
        "volatile-lru",
        "--rename-command",
        "CONFIG",
        "",
    ]);
    let err = build(renamed.url(), "evict").await.err();
    let err = err.expect("build() accepted a server with maxmemory-policy volatile-lru");
    assert!(err.contains("volatile-lru"), "{err}");
    let opted_in = RedisBackend::builder(renamed.url()).allow_evicting_policy(true);
    opted_in.build().await.unwrap();

    // The shared server runs with the default, noeviction.
    build(RedisServer::shared().url(), "evict").await.unwrap();
}

/// Redis 7 creates users with `resetchannels`: such a user could never receive a grant
/// (nor, for lack of `PUBLISH`, send one). `build()` refuses it and names the missing
/// permission, whether the user may ask `ACL DRYRUN` or not.
#[tokio::test]
async fn build_refuses_a_user_without_rights_on_the_wake_up_channels() {
    let server = RedisServer::start();
    let user = |name: &str, rules: &[&str]| {
        let mut args = vec!["ACL", "SETUSER", name, "on", ">pw", "~*", "+@all"];
        args.extend_from_slice(rules);
        assert_eq!(server.cli(&args), "OK");
        format!("redis://{name}:pw@127.0.0.1:{}", server.port())
    };
    let err = build(user("nochannels", &["resetchannels"]), "acl")
        .await
        .err();
    let err = err.expect("build() accepted a user without channel rights");
    assert!(err.contains("SUBSCRIBE") && err.contains("acl:*"), "{err}");

    // A user that may not run ACL commands: the publish right is tried for real.
    let url = user("noacl", &["-acl", "resetchannels"]);
    let err = build(url, "acl").await.err();
    let err = err.expect("build() accepted a user without channel rights (no ACL DRYRUN)");
    assert!(err.contains("PUBLISH") && err.contains("acl:*"), "{err}");

    // Rights on the engine's channels (its prefix) are enough.
    let url = user("granted", &["resetchannels", "&acl:*"]);
    let engine = LockEngine::new(build(url, "acl").await.unwrap());
    engine
        .lock("k")
        .acquire()
        .await
        .unwrap()
        .release()
        .await
        .unwrap();
}

#[tokio::test]
async fn lock_engine_redis_is_one_line() {
    let server = RedisServer::shared();
    let engine = LockEngine::redis(server.url()).await.unwrap();
    let lease = engine.lock("one-line").acquire().await.unwrap();
    assert!(engine.lock("one-line").try_acquire().await.is_err(), "held");
    lease.release().await.unwrap();
    // The default prefix, as `RedisBackend::connect` documents.
    assert!(server.scan("tower-lock:*lock:one-line").is_empty());
}

#[tokio::test]
async fn a_backend_from_the_applications_client_uses_its_database() {
    let server = RedisServer::shared();
    let client = redis::Client::open(format!("{}/3", server.url())).unwrap();
    let backend = RedisBackend::from_client(client)
        .prefix("byo-client")
        .build()
        .await
        .unwrap();
    let engine = LockEngine::new(backend);
    let lease = engine.lock("k").acquire().await.unwrap();
    // The lease is in database 3, where the application's client points, not in 0.
    let db3 = server.cli(["-n", "3", "--scan", "--pattern", "byo-client:*:lock:k"]);
    assert_eq!(db3.lines().count(), 1, "{db3:?}");
    assert!(server.scan("byo-client:*").is_empty());
    lease.release().await.unwrap();
}

#[tokio::test]
async fn a_backend_from_connection_info_uses_it() {
    let server = RedisServer::shared();
    let info = server.url().into_connection_info().unwrap();
    let settings = info.redis_settings().clone().set_db(5);
    let info = info.set_redis_settings(settings);
    let backend = RedisBackend::from_connection_info(info)
        .prefix("byo-info")
        .build()
        .await
        .unwrap();
    let lease = LockEngine::new(backend).lock("k").acquire().await.unwrap();
    let db5 = server.cli(["-n", "5", "--scan", "--pattern", "byo-info:*:lock:k"]);
    assert_eq!(db5.lines().count(), 1, "{db5:?}");
    lease.release().await.unwrap();
}

#[tokio::test]
async fn connection_settings_that_cannot_work_fail_at_build_time() {
    // A client whose server refuses connections: the build says so, not the first request.
    let client = redis::Client::open("redis://127.0.0.1:1").unwrap();
    let err = RedisBackend::from_client(client)
        .command_timeout(Duration::from_millis(200))
        .build()
        .await
        .unwrap_err();
    assert_eq!(
        err.kind(),
        tower_lock::BackendErrorKind::Unavailable,
        "{err}"
    );
}

/// TLS with the application's own root certificate: the backend speaks TLS through the
/// client it was given, and a client that does not trust the server's CA gets nowhere.
#[cfg(feature = "redis-tls")]
#[tokio::test]
async fn a_tls_client_of_the_applications_own_is_used_as_it_is() {
    use tower_lock_test_support::redis::TlsRedis;

    let server = TlsRedis::start();
    let client = redis::Client::build_with_tls(
        server.tls_url(),
        redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(server.ca_pem()),
        },
    )
    .unwrap();
    let engine = LockEngine::new(
        RedisBackend::from_client(client)
            .prefix("tls")
            .build()
            .await
            .unwrap(),
    );
    // A waiter woken by a hand-off: the subscriber connection speaks TLS too.
    let lease = engine.lock("k").acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("k")
                .wait(Duration::from_secs(5))
                .acquire()
                .await
        })
    };
    while engine.lock("k").waiters().await.unwrap() == 0 {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let first = lease.fence();
    lease.release().await.unwrap();
    let next = waiter.await.unwrap().unwrap();
    assert!(next.fence() > first);
    next.release().await.unwrap();
    assert_eq!(server.server().scan("tls:*:lock:*"), Vec::<String>::new());

    // The platform's roots do not include the test CA: the handshake fails at build time.
    let err = RedisBackend::builder(server.tls_url())
        .command_timeout(Duration::from_millis(500))
        .build()
        .await
        .unwrap_err();
    assert_ne!(err.kind(), tower_lock::BackendErrorKind::Config, "{err}");
}
