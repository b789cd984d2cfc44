//! `canonical_json()` forgives formatting only: key order and whitespace do not make
//! another request, but no number stands for another (they are compared as written) and no
//! member is dropped (a repeated member counts, in its order).

use std::sync::atomic::Ordering;

use http::StatusCode;

use super::{app::replay_app, post_with, preset, until_recorded};
use crate::scenarios::Stack;

/// Under `canonical_json()`, a transfer that differs from the stored one only in a number
/// that a 64-bit float cannot tell apart (an amount past 2^64, `0.1` and
/// `0.10000000000000001`, a 24-digit account number), or in a repeated member, is `422`,
/// never the first transfer's replay; the same transfer with its keys reordered and spaced
/// out is replayed.
pub async fn canonical_json_never_lets_one_number_or_member_stand_for_another(on: Stack) {
    let table = on.table("replay-canonical").await;
    let layer = preset(&table).canonical_json().build().unwrap();
    let app = replay_app(on, layer).await;
    let cases = [
        (
            "wei",
            r#"{"to":"alice","amount":18446744073709551617}"#,
            r#"{ "amount": 18446744073709551617, "to": "alice" }"#,
            r#"{"to":"alice","amount":18446744073709551616}"#,
        ),
        (
            "fraction",
            r#"{"to":"alice","amount":0.1}"#,
            r#"{"amount":0.1,"to":"alice"}"#,
            r#"{"to":"alice","amount":0.10000000000000001}"#,
        ),
        (
            "account",
            r#"{"account":123456789012345678901234,"amount":5}"#,
            r#"{"amount":5,"account":123456789012345678901234}"#,
            r#"{"account":123456789012345678901235,"amount":5}"#,
        ),
        (
            "repeated",
            r#"{"to":"alice","amount":5,"to":"mallory"}"#,
            r#"{"amount":5, "to":"alice", "to":"mallory"}"#,
            r#"{"amount":5,"to":"mallory"}"#,
        ),
    ];
    for (n, (k, first, same, other)) in cases.into_iter().enumerate() {
        let reply = post_with(&app.server, "/orders", k, first).await;
        assert_eq!(reply.status, StatusCode::CREATED, "{k}");
        until_recorded(&table, k).await;
        let again = post_with(&app.server, "/orders", k, same).await;
        assert_eq!(
            again.header("idempotent-replayed"),
            Some("true"),
            "{k}: {same} is {first} formatted otherwise"
        );
        let another = post_with(&app.server, "/orders", k, other).await;
        assert_eq!(
            another.status,
            StatusCode::UNPROCESSABLE_ENTITY,
            "{k}: {other} after {first} was answered {} {:?}",
            another.status,
            another.text()
        );
        assert_eq!(app.runs.load(Ordering::SeqCst), n + 1, "{k}");
    }
}
