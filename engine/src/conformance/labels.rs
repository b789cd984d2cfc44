//! Holder labels: who holds a key, as [`holders`](crate::Lock::holders) tells it, on every
//! backend and in each mode: stored with the grant, carried through a hand-off, kept across
//! re-entry and extension, and absent when the engine gives none.

use super::{Harness, InMode, assert_no_residue, until_waiters};
use crate::{HolderLabel, Mode, Token};

/// `h`'s engine in `mode`, labelled `label` (`None`: without a label).
fn labelled(h: &impl Harness, mode: Mode, label: Option<&str>) -> InMode {
    let engine = h.engine();
    let engine = match label {
        Some(label) => engine.holder_label(HolderLabel::new(label).unwrap()),
        None => engine.without_holder_label(),
    };
    InMode { engine, mode }
}

/// The label and fence `holders` reports for `key`'s one holder.
async fn one_holder(engine: &InMode, key: &str) -> (Option<String>, Option<u64>) {
    let holders = engine.lock(key).holders().await.unwrap();
    assert_eq!(holders.len(), 1, "one holder of {key}: {holders:?}");
    let holder = &holders[0];
    (
        holder.label().map(str::to_owned),
        holder.fence.map(|f| f.get()),
    )
}

pub async fn holders_show_each_holders_label_through_handoff_reentry_and_extension(
    h: &impl Harness,
    mode: Mode,
) {
    let a = labelled(h, mode, Some("node-a:1 POST /orders/{id}"));
    let b = labelled(h, mode, Some("node-b:2"));
    let ttl = h.unit() * 20;
    let token = Token::new("label-owner").unwrap();
    let first = a
        .lock("labelled")
        .ttl(ttl)
        .token(token.clone())
        .acquire()
        .await
        .unwrap();
    let want_a = Some("node-a:1 POST /orders/{id}".to_owned());
    assert_eq!(
        one_holder(&a, "labelled").await,
        (want_a.clone(), Some(first.fence().get()))
    );
    // Re-entry by token (from the other node's engine, which labels otherwise) and an
    // extension keep the label the grant stored.
    let again = b
        .lock("labelled")
        .ttl(ttl)
        .token(token)
        .acquire()
        .await
        .unwrap();
    again.extend_to(ttl).await.unwrap();
    assert_eq!(one_holder(&b, "labelled").await.0, want_a);
    // A waiter on the other node is handed the key with its own label and fence.
    let waiter = {
        let b = b.clone();
        tokio::spawn(async move { b.lock("labelled").ttl(ttl).acquire().await })
    };
    until_waiters(&a, "labelled", 1).await;
    // `first` and `again` are one lease (one token): released once; `first`'s drop then
    // finds the key another's, and changes nothing.
    again.release().await.unwrap();
    let second = waiter.await.unwrap().unwrap();
    drop(first);
    assert_eq!(
        one_holder(&b, "labelled").await,
        (Some("node-b:2".to_owned()), Some(second.fence().get()))
    );
    second.release().await.unwrap();
    // An engine without a label stores none.
    let bare = labelled(h, mode, None);
    let third = bare.lock("labelled").ttl(ttl).acquire().await.unwrap();
    assert_eq!(one_holder(&bare, "labelled").await.0, None);
    third.release().await.unwrap();
    assert_no_residue(h).await;
}
