//! What needs no store, and the exit codes of a wrong call and an unreachable store.

use crate::run::cli;

#[tokio::test]
async fn key_computes_what_a_layer_derives() {
    let header = cli(
        [
            "key",
            "--namespace",
            "billing",
            "--header",
            "x-tenant-id",
            "acme",
        ]
        .map(String::from)
        .to_vec(),
        "",
    )
    .await;
    assert_eq!(header.code, 0, "{header:?}");
    assert_eq!(header.stdout, "billing/header=x-tenant-id/acme\n");
    let idempotency = cli(
        ["--json", "key", "--idempotency-key", "\"8e03978e\""]
            .map(String::from)
            .to_vec(),
        "",
    )
    .await;
    assert_eq!(idempotency.json()["key"], "/idempotency-key/8e03978e");
    let path = cli(
        [
            "key",
            "--namespace",
            "a/b",
            "--path",
            "/orders/42",
            "--method",
            "POST",
        ]
        .map(String::from)
        .to_vec(),
        "",
    )
    .await;
    assert_eq!(path.stdout, "a%2Fb/method-path/POST /orders/42\n");
}

#[tokio::test]
async fn usage_errors_exit_2_and_an_unreachable_store_3() {
    let no_store = cli(["status", "k"].map(String::from).to_vec(), "").await;
    assert_eq!(no_store.code, 2, "{no_store:?}");
    assert!(no_store.stderr.contains("--redis"), "{no_store:?}");
    let bad_flag = cli(["status", "--nope"].map(String::from).to_vec(), "").await;
    assert_eq!(bad_flag.code, 2, "{bad_flag:?}");
    let down = cli(
        ["--json", "--redis", "redis://127.0.0.1:1", "status", "k"]
            .map(String::from)
            .to_vec(),
        "",
    )
    .await;
    assert_eq!(down.code, 3, "{down:?}");
    assert_eq!(down.json()["exit"], 3);
}
