//! The pool capability: membership, and the health of every member read at one instant.

use super::{Harness, assert_no_residue};
use crate::{LockStatus, Token};

pub async fn pool_membership_and_health(h: &impl Harness) {
    let engine = h.engine();
    let u = h.unit();
    let pool = engine.pool("workers").expected_ttl(u * 10);
    assert!(pool.is_empty().await.unwrap());
    assert_eq!(pool.add(["w:1", "w:2", "w:3"]).await.unwrap(), 3);
    assert_eq!(pool.add(["w:3", "w:4"]).await.unwrap(), 4);
    assert_eq!(pool.remove(["w:4", "w:missing"]).await.unwrap(), 3);
    assert!(pool.contains("w:2").await.unwrap());
    assert!(!pool.contains("w:4").await.unwrap());
    assert_eq!(pool.len().await.unwrap(), 3);
    let held = engine.lock("w:1").ttl(u * 10).acquire().await.unwrap();
    engine
        .admin()
        .set("w:2", &Token::new("down").unwrap(), Some(u * 100))
        .await
        .unwrap();
    let statuses = pool.statuses().await.unwrap();
    let names: Vec<&str> = statuses.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(names, ["w:1", "w:2", "w:3"]);
    assert!(matches!(statuses[0].1, LockStatus::Locked { .. }));
    assert!(matches!(statuses[1].1, LockStatus::Reserved { .. }));
    assert_eq!(statuses[2].1, LockStatus::Free);
    let health = pool.health().await.unwrap();
    assert_eq!((health.locked, health.free), (2, 1));
    assert_eq!(pool.replace(["w:a", "w:b"]).await.unwrap(), 2);
    let members: Vec<String> = pool
        .members()
        .await
        .unwrap()
        .iter()
        .map(|k| k.to_string())
        .collect();
    assert_eq!(members, ["w:a", "w:b"]);
    assert_eq!(pool.health().await.unwrap().free, 2);
    pool.clear().await.unwrap();
    assert!(pool.is_empty().await.unwrap());
    held.release().await.unwrap();
    engine.admin().force_release("w:2").await.unwrap();
    assert_no_residue(h).await;
}
