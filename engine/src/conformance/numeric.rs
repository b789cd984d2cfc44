//! The numeric capability: compare-and-set for every comparison, expiry and deletion, TTLs
//! out of range.

use std::time::Duration;

use tokio::time::sleep;

use super::{Harness, assert_no_residue};
use crate::{Compare, LockError, MAX_TTL};

pub async fn numeric_compare_and_set_follows_each_comparison(h: &impl Harness) {
    let engine = h.engine();
    let n = engine.numeric("number").epsilon(0.01);
    // (comparison, given, applies when stored is 10)
    let table = [
        (Compare::Greater, 11.0, true),
        (Compare::Greater, 10.0, false),
        (Compare::Less, 9.0, true),
        (Compare::Less, 10.0, false),
        (Compare::GreaterOrEqual, 9.995, true),
        (Compare::GreaterOrEqual, 9.9, false),
        (Compare::LessOrEqual, 10.005, true),
        (Compare::LessOrEqual, 10.1, false),
        (Compare::Equal, 10.005, true),
        (Compare::Equal, 10.1, false),
        (Compare::NotEqual, 10.1, true),
        (Compare::NotEqual, 10.005, false),
    ];
    for (compare, given, applies) in table {
        // Start from exactly 10 (an absent key satisfies any comparison).
        assert!(n.get().await.unwrap().is_none());
        assert!(
            n.set_if(Compare::Greater, 10.0, None).await.unwrap(),
            "absent key satisfies"
        );
        assert_eq!(
            n.set_if(compare, given, None).await.unwrap(),
            applies,
            "{compare:?} {given} vs 10"
        );
        let expected = if applies { given } else { 10.0 };
        assert_eq!(
            n.get().await.unwrap(),
            Some(expected),
            "{compare:?} {given}"
        );
        // Compare-and-delete follows the same rule.
        n.delete_if(Compare::NotEqual, f64::MAX).await.unwrap();
        assert!(n.set_if(Compare::Greater, 10.0, None).await.unwrap());
        assert_eq!(
            n.delete_if(compare, given).await.unwrap(),
            applies,
            "delete {compare:?} {given}"
        );
        assert_eq!(n.get().await.unwrap().is_none(), applies);
        n.delete_if(Compare::NotEqual, f64::MAX).await.unwrap();
    }
    assert!(matches!(
        n.set_if(Compare::Greater, f64::NAN, None).await,
        Err(LockError::InvalidValue(_))
    ));
    assert_eq!(n.get().await.unwrap(), None);
    assert_no_residue(h).await;
}

pub async fn numeric_values_expire_and_delete(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let n = engine.numeric("expiring");
    assert!(n.set_if(Compare::Greater, 5.5, Some(u * 2)).await.unwrap());
    assert_eq!(n.get().await.unwrap(), Some(5.5));
    sleep(u * 4).await;
    assert_eq!(n.get().await.unwrap(), None, "the TTL removes the value");
    assert!(n.set_if(Compare::Less, -3.25, None).await.unwrap());
    assert!(!n.delete_if(Compare::Greater, -4.0).await.unwrap());
    assert!(n.delete_if(Compare::Less, -4.0).await.unwrap());
    assert_eq!(n.get().await.unwrap(), None);
    assert_no_residue(h).await;
}

/// A numeric value's TTL past [`MAX_TTL`] is refused with the same typed error on every
/// backend (never a protocol error of the store, never accepted), and nothing is stored;
/// `MAX_TTL` itself is accepted.
pub async fn numeric_ttls_past_the_maximum_are_refused(h: &impl Harness) {
    let engine = h.engine();
    let n = engine.numeric("huge-ttl");
    for ttl in [
        MAX_TTL + Duration::from_millis(1),
        Duration::from_millis(100_000_000_000_000_001),
        Duration::MAX,
    ] {
        let result = n.set_if(Compare::Greater, 1.0, Some(ttl)).await;
        assert!(
            matches!(result, Err(LockError::InvalidValue(_))),
            "a numeric TTL of {ttl:?}: {result:?}"
        );
    }
    assert_eq!(n.get().await.unwrap(), None);
    assert!(
        n.set_if(Compare::Greater, 1.0, Some(MAX_TTL))
            .await
            .unwrap()
    );
    assert!(n.delete_if(Compare::Equal, 1.0).await.unwrap());
    assert_no_residue(h).await;
}
