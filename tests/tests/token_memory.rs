//! A backend remembers the last token it verified (issue 13: a gateway sends the same token in
//! every transaction of a turn). The memory must never accept what a fresh verification would
//! refuse: a token past its `exp` (plus `ctxguard.jwt_leeway`), or a token under settings that
//! changed since (here the audience; a rotated key file works the same way).
//!
//! Runs as the superuser (`CTXGUARD_TEST_ADMIN_URL`), which may change the `ctxguard.jwt_*`
//! settings in its own session; `scripts/test.sh` provides the URLs and the secret.

mod support;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, EncodingKey, Header};
use postgres::{Client, NoTls};
use serde_json::json;
use support::{env, token};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A token for alice that expires `secs` from now.
fn token_expiring_in(secs: u64) -> String {
    let claims = json!({"sub": "alice", "tenant_id": "acme", "roles": ["ap_clerk"],
                        "exp": now() + secs, "aud": "ctxguard-tests"});
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(env("CTXGUARD_TEST_JWT_SECRET").as_bytes()),
    )
    .unwrap()
}

/// `set_context` with `tok` in a transaction of its own: `Ok(tenant)` or the SQLSTATE.
fn set_context(c: &mut Client, tok: &str) -> Result<String, String> {
    let mut tx = c.transaction().unwrap();
    let r = tx
        .execute(
            "SELECT ctxguard.set_context($1, '{\"pageType\": \"vendor_table\"}')",
            &[&tok],
        )
        .and_then(|_| tx.query_one("SELECT ctxguard.tenant_id()", &[]))
        .map(|row| row.get::<_, String>(0))
        .map_err(|e| e.code().map(|s| s.code().to_string()).unwrap_or_default());
    tx.rollback().unwrap();
    r
}

#[test]
fn a_remembered_token_is_refused_once_it_expires() {
    let mut c = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    c.batch_execute("SET ctxguard.jwt_leeway = 0").unwrap();
    let tok = token_expiring_in(2);
    assert_eq!(set_context(&mut c, &tok), Ok("acme".into()));
    // The same token again: remembered, still good.
    assert_eq!(set_context(&mut c, &tok), Ok("acme".into()));
    // Past exp (the leeway is 0): refused, though this backend verified it a moment ago.
    std::thread::sleep(Duration::from_millis(3100));
    assert_eq!(set_context(&mut c, &tok), Err("28000".into()));
}

#[test]
fn a_remembered_token_is_verified_again_under_changed_settings() {
    let mut c = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let tok = token("alice", "acme", &["ap_clerk"]);
    assert_eq!(set_context(&mut c, &tok), Ok("acme".into()));
    // The token's audience is ctxguard-tests: once only another audience is accepted, the token
    // remembered a moment ago is refused.
    c.batch_execute("SET ctxguard.jwt_audience = 'someone-else'")
        .unwrap();
    assert_eq!(set_context(&mut c, &tok), Err("28000".into()));
    c.batch_execute("RESET ctxguard.jwt_audience").unwrap();
    assert_eq!(set_context(&mut c, &tok), Ok("acme".into()));
    // Two tokens alternating: each verifies on its own (only the last one is remembered).
    let other = token("carol", "globex", &["ap_clerk"]);
    assert_eq!(set_context(&mut c, &other), Ok("globex".into()));
    assert_eq!(set_context(&mut c, &tok), Ok("acme".into()));
    assert_eq!(set_context(&mut c, &other), Ok("globex".into()));
}
