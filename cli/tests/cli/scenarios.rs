//! The scenarios, written once and run on every store: two nodes (engines with their own
//! connections and labels) on one store, one holding a key and one waiting for it.

use std::time::Duration;

use bytes::Bytes;
use tokio::time::{Instant, sleep, timeout};
use tower_lock_engine::{HolderLabel, LockEngine, Record};

use crate::run::{args, cli};

/// `engine` labelled `label`.
pub(crate) fn labelled(engine: LockEngine, label: &str) -> LockEngine {
    engine.holder_label(HolderLabel::new(label).unwrap())
}

/// Until `n` callers wait for `key` (observable store state, no event to await).
async fn until_waiters(engine: &LockEngine, key: &str, n: usize) {
    let give_up = Instant::now() + Duration::from_secs(10);
    while engine.lock(key).waiters().await.unwrap() != n {
        assert!(Instant::now() < give_up, "never saw {n} waiters on {key}");
        sleep(Duration::from_millis(5)).await;
    }
}

/// `a` holds `key`, `b` waits for it: `status` and `list` show `a`'s label, fence and the
/// waiter; `release` refuses another holder's name and an unconfirmed release, then hands
/// the key to the waiter with a higher fence, and `a`'s lease is lost.
pub(crate) async fn a_held_key_is_shown_listed_and_released_to_its_waiter(
    store: &[String],
    a: LockEngine,
    b: LockEngine,
    key: &str,
) {
    let ttl = Duration::from_secs(30);
    let held = a.lock(key).ttl(ttl).acquire().await.unwrap();
    let waiter = {
        let (b, key) = (b.clone(), key.to_owned());
        tokio::spawn(async move {
            b.lock(&key)
                .ttl(ttl)
                .wait(Duration::from_secs(20))
                .acquire()
                .await
        })
    };
    until_waiters(&a, key, 1).await;

    let status = cli(args(store, &["--json", "status", key]), "").await;
    assert_eq!(status.code, 0, "{status:?}");
    let json = status.json();
    assert_eq!(json["state"], "held", "{json}");
    assert_eq!(json["waiters"], 1, "{json}");
    assert_eq!(json["holders"][0]["label"], "node-a:1", "{json}");
    assert_eq!(json["holders"][0]["token"], held.token().as_str(), "{json}");
    assert_eq!(json["holders"][0]["fence"], held.fence().get(), "{json}");
    assert_eq!(json["holders"][0]["mode"], "lock", "{json}");
    let left = json["holders"][0]["lease_left_ms"].as_u64().unwrap();
    assert!(left > 20_000 && left <= 30_000, "{json}");
    let text = cli(args(store, &["status", key]), "").await;
    assert!(
        text.stdout.contains("held") && text.stdout.contains("label=node-a:1"),
        "{text:?}"
    );

    for filter in [&[][..], &["--held"][..], &["--waiting"][..]] {
        let mut more = vec!["--json", "list", "--prefix-match", key];
        more.extend_from_slice(filter);
        let list = cli(args(store, &more), "").await;
        assert_eq!(list.code, 0, "{list:?}");
        let json = list.json();
        let keys = json["keys"].as_array().unwrap();
        assert_eq!(keys.len(), 1, "{filter:?}: {json}");
        assert_eq!(keys[0]["key"], key, "{json}");
        assert_eq!(keys[0]["held"], true, "{json}");
        assert_eq!(keys[0]["waiters"], 1, "{json}");
        assert_eq!(keys[0]["holders"][0]["label"], "node-a:1", "{json}");
    }

    let other = cli(
        args(
            store,
            &["--json", "release", key, "--holder", "node-b:2", "--yes"],
        ),
        "",
    )
    .await;
    assert_eq!(other.code, 1, "not held by node-b: {other:?}");
    assert_eq!(other.json()["released"], false);
    let unconfirmed = cli(
        args(store, &["release", key, "--holder", "node-a:1"]),
        "n\n",
    )
    .await;
    assert_eq!(unconfirmed.code, 4, "{unconfirmed:?}");
    assert!(unconfirmed.stderr.contains("node-a:1"), "{unconfirmed:?}");
    assert!(!held.is_lost(), "nothing was released yet");

    let released = cli(
        args(store, &["release", key, "--holder", "node-a:1"]),
        "y\n",
    )
    .await;
    assert_eq!(released.code, 0, "{released:?}");
    let next = timeout(Duration::from_secs(10), waiter)
        .await
        .expect("the waiter is granted")
        .unwrap()
        .expect("granted");
    assert!(next.fence() > held.fence(), "a higher fence for the waiter");
    // Told by the release itself (its renewal is 10 s away), before the waiter's grant.
    assert!(held.is_lost(), "the released holder's lease is lost");
    let status = cli(args(store, &["--json", "status", key]), "").await;
    assert_eq!(status.json()["holders"][0]["label"], "node-b:2");
    assert_eq!(status.json()["holders"][0]["fence"], next.fence().get());

    let last = next.fence().get();
    next.release().await.unwrap();
    drop(held);
    let free = cli(args(store, &["--json", "status", key]), "").await;
    assert_eq!(free.code, 1, "a free key: {free:?}");
    assert_eq!(free.json()["state"], "free");
    assert_eq!(
        free.json()["last_fence"],
        last,
        "the released key's last fence: {free:?}"
    );
    let nothing = cli(args(store, &["release", key, "--yes"]), "").await;
    assert_eq!(nothing.code, 1, "nothing to release: {nothing:?}");
}

/// A record stored with a completion is read (body size, when) and deleted by key.
pub(crate) async fn a_record_is_read_and_deleted_by_key(
    store: &[String],
    a: LockEngine,
    key: &str,
) {
    let lease = a.lock(key).acquire().await.unwrap();
    lease
        .complete(
            Record::new(Bytes::from("fp"), Bytes::from("meta"), Bytes::from("hello")),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
    let got = cli(args(store, &["--json", "record", "get", key]), "").await;
    assert_eq!(got.code, 0, "{got:?}");
    let json = got.json();
    assert_eq!(json["found"], true, "{json}");
    assert_eq!(json["body_bytes"], 5, "{json}");
    assert_eq!(json["kept"], true, "{json}");
    assert!(json["stored_at_unix_ms"].as_u64().unwrap() > 0, "{json}");
    let left = json["expires_in_ms"].as_u64().expect("the record's expiry");
    assert!(left > 50_000 && left <= 60_000, "a 60 s retention: {json}");
    let deleted = cli(args(store, &["record", "delete", key]), "").await;
    assert_eq!(deleted.code, 0, "{deleted:?}");
    let gone = cli(args(store, &["--json", "record", "get", key]), "").await;
    assert_eq!(gone.code, 1, "{gone:?}");
    assert_eq!(gone.json()["found"], false);
}
