//! The record capability's cases: a record written with [`Lease::complete`] appears in the
//! same atomic step as the release, only for the holder, and expires after its retention
//! (counted from the completion).

use std::time::Duration;

use crate::{Acquired, Lease, LockEngine, LockError, LockKey, Record};
use bytes::Bytes;
use tokio::time::{sleep, timeout};

use super::{Harness, assert_no_residue, until_waiters};

fn record(tag: &str) -> Record {
    Record::new(
        Bytes::from(format!("fp-{tag}")),
        Bytes::from(format!("meta-{tag}")),
        // Binary, with a NUL and invalid UTF-8: stored byte for byte.
        Bytes::from([b"body\0\xff-".as_slice(), tag.as_bytes()].concat()),
    )
}

fn key(s: &str) -> LockKey {
    LockKey::new(s).unwrap()
}

async fn stored(engine: &LockEngine, k: &str) -> Option<Record> {
    engine.record(&key(k)).await.expect("read the record")
}

pub async fn a_record_appears_with_the_release_for_the_holder_only(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    assert!(engine.has_records());
    let lease = engine.lock("rec-a").ttl(u * 100).acquire().await.unwrap();
    assert_eq!(stored(&engine, "rec-a").await, None);
    let rec = record("a");
    lease
        .complete(rec.clone(), u * 1000)
        .await
        .expect("complete");
    let got = stored(&engine, "rec-a").await.expect("the record is there");
    assert_eq!(got, rec, "stored byte for byte, completion time to the ms");
    // Completing released the key.
    let next = engine.lock("rec-a").try_acquire().await.expect("released");
    // A second completion replaces the record.
    let rec2 = record("a2");
    next.complete(rec2.clone(), u * 1000).await.unwrap();
    assert_eq!(stored(&engine, "rec-a").await, Some(rec2));
    // Records are per key.
    assert_eq!(stored(&engine, "rec-a-other").await, None);
}

pub async fn a_lapsed_holder_writes_no_record_and_keeps_the_next_holder(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let stale = engine
        .lock("rec-b")
        .ttl(u * 5)
        .auto_renew(false)
        .acquire()
        .await
        .unwrap();
    let next = engine
        .lock("rec-b")
        .ttl(u * 100)
        .wait(u * 50)
        .acquire()
        .await
        .expect("granted once the stale lease ran out");
    let err = stale
        .complete(record("stale"), u * 1000)
        .await
        .expect_err("a lapsed holder must not complete");
    assert!(
        matches!(err, LockError::NotOwned | LockError::Expired),
        "{err:?}"
    );
    assert_eq!(stored(&engine, "rec-b").await, None, "nothing written");
    assert!(next.owned().await.unwrap(), "the next holder keeps the key");
    next.release().await.unwrap();
    assert_no_residue(h).await;
}

pub async fn a_waiter_granted_by_a_completion_finds_the_record(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    for fifo in [false, true] {
        let k = format!("rec-c-{fifo}");
        let holder = engine
            .lock(&k)
            .fifo(fifo)
            .ttl(u * 100)
            .acquire()
            .await
            .unwrap();
        let waiter = {
            let (engine, k) = (engine.clone(), k.clone());
            tokio::spawn(async move {
                let lease: Lease = engine
                    .lock(&k)
                    .fifo(fifo)
                    .ttl(u * 100)
                    .wait(u * 200)
                    .acquire()
                    .await
                    .expect("granted");
                // Read while holding: the record must already be there.
                let rec = engine.record(lease.key()).await.unwrap();
                lease.release().await.unwrap();
                rec
            })
        };
        until_waiters(&engine, &k, 1).await;
        let rec = record(&k);
        holder.complete(rec.clone(), u * 1000).await.unwrap();
        let seen = timeout(Duration::from_secs(10), waiter)
            .await
            .expect("the waiter was granted")
            .unwrap();
        assert_eq!(seen, Some(rec), "fifo = {fifo}");
    }
}

pub async fn records_expire_after_their_retention(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lease = engine.lock("rec-d").ttl(u * 100).acquire().await.unwrap();
    // Held longer than the retention: retention counts from the completion, not from
    // the acquire (a slow operation's record must not be born expired).
    sleep(u * 15).await;
    lease.complete(record("d"), u * 10).await.unwrap();
    assert!(
        stored(&engine, "rec-d").await.is_some(),
        "retention counts from the completion"
    );
    // What an operator reads: the retention left, by the store's clock.
    let left = engine.record_expiry(&key("rec-d")).await.unwrap();
    assert!(
        left.is_some_and(|left| left > Duration::ZERO && left <= u * 10),
        "the record's expiry: {left:?} of a {:?} retention",
        u * 10
    );
    sleep(u * 12).await;
    assert_eq!(stored(&engine, "rec-d").await, None, "expired");
    assert_eq!(
        engine.record_expiry(&key("rec-d")).await.unwrap(),
        None,
        "no expiry once it expired"
    );
    assert_no_residue(h).await;
}

pub async fn a_record_or_tombstone_is_deleted_by_key_and_the_lock_is_left_alone(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    // A kept record: read, deleted, gone; deleting again finds nothing.
    let lease = engine.lock("rec-e").ttl(u * 100).acquire().await.unwrap();
    lease.complete(record("e"), u * 1000).await.unwrap();
    assert!(stored(&engine, "rec-e").await.is_some());
    assert!(
        engine.forget_record(&key("rec-e")).await.unwrap(),
        "deleted"
    );
    assert_eq!(stored(&engine, "rec-e").await, None);
    assert!(!engine.forget_record(&key("rec-e")).await.unwrap());
    // The key runs again as if nothing had completed.
    let again = engine.lock("rec-e").try_acquire().await.expect("free");
    // Deleting a record never touches a held lock: the holder keeps the key and completes.
    assert!(!engine.forget_record(&key("rec-e")).await.unwrap());
    assert!(again.owned().await.unwrap(), "the holder keeps the key");
    let rec = record("e2");
    again.complete(rec.clone(), u * 1000).await.unwrap();
    assert_eq!(stored(&engine, "rec-e").await, Some(rec));
    // A tombstone reads back as one (fingerprint and completion time, nothing else) and
    // is deleted the same way.
    let lease = engine.lock("rec-f").ttl(u * 100).acquire().await.unwrap();
    let full = record("f");
    let tombstone = Record::tombstone(full.fingerprint.clone(), full.completed_at);
    lease.complete(tombstone.clone(), u * 1000).await.unwrap();
    let got = stored(&engine, "rec-f")
        .await
        .expect("the tombstone is there");
    assert_eq!(got, tombstone);
    assert!(!got.kept);
    assert!(engine.forget_record(&key("rec-f")).await.unwrap());
    assert_eq!(stored(&engine, "rec-f").await, None);
    assert!(engine.forget_record(&key("rec-e")).await.unwrap());
    assert_no_residue(h).await;
}

pub async fn acquire_or_record_grants_a_free_key_and_answers_a_stored_record(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let lock = engine.lock("rec-f").ttl(u * 100);
    let Acquired::Lease(lease) = lock.acquire_or_record().await.unwrap() else {
        panic!("no record yet: the key is granted");
    };
    assert!(lease.owned().await.unwrap());
    // Held: another caller is refused as by `acquire`.
    let busy = engine.lock("rec-f").try_acquire().await;
    assert!(matches!(busy, Err(LockError::Busy { .. })), "{busy:?}");
    let rec = record("f");
    lease.complete(rec.clone(), u * 1000).await.unwrap();
    match lock.acquire_or_record().await.unwrap() {
        Acquired::Record(got) => assert_eq!(got, rec),
        Acquired::Lease(_) => panic!("a stored record must be answered"),
    }
    // Answering the record took nothing.
    let free = engine.lock("rec-f").try_acquire().await.expect("free");
    free.release().await.unwrap();
    assert!(engine.forget_record(&key("rec-f")).await.unwrap());
    assert_no_residue(h).await;
}

pub async fn acquire_or_record_after_a_wait_answers_the_record_its_holder_wrote(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let holder = engine.lock("rec-g").ttl(u * 100).acquire().await.unwrap();
    let waiter = {
        let engine = engine.clone();
        tokio::spawn(async move {
            engine
                .lock("rec-g")
                .ttl(u * 100)
                .wait(u * 100)
                .acquire_or_record()
                .await
        })
    };
    until_waiters(&engine, "rec-g", 1).await;
    let rec = record("g");
    holder.complete(rec.clone(), u * 1000).await.unwrap();
    match waiter.await.unwrap().unwrap() {
        Acquired::Record(got) => assert_eq!(got, rec),
        Acquired::Lease(_) => panic!("the holder completed first: its record is answered"),
    }
    // The waiter was handed the key, found the record, and gave the key back.
    let free = engine
        .lock("rec-g")
        .try_acquire()
        .await
        .expect("given back");
    free.release().await.unwrap();
    assert!(engine.forget_record(&key("rec-g")).await.unwrap());
    assert_no_residue(h).await;
}
