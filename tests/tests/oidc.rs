//! Bring your own identity provider: a real OpenID provider (npm `oidc-provider`,
//! tests/oidc/provider.mjs) issues RS256 and ES256 JWT access tokens for resource indicators, with
//! the tenant in a namespaced claim (`"https://ctxguard.test/tenant"`) and the roles in
//! `realm_access.roles`. `jwks-sync` writes its JWKS to the file `ctxguard.jwks_file` names; a
//! role configured like a DBA would (`ALTER ROLE … SET ctxguard.jwt_issuer / jwt_audience /
//! claim_tenant / claim_roles`) verifies them. Then the keys rotate.
//!
//! Needs (scripts/test.sh sets them): `CTXGUARD_TEST_OIDC_NODE_MODULES` (oidc-provider installed by
//! tests/oidc/install.sh), `CTXGUARD_TEST_OIDC_DIR` (rsa1.pem, rsa2.pem, ec1.pem; the JWKS file is
//! written there, readable by the server), `CTXGUARD_TEST_OIDC_PORT` (this test uses it and the
//! next port).

mod support;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

use ctxguard_gateway::jwks_sync::{sync, Outcome, SyncArgs};
use jsonwebtoken::{Algorithm, EncodingKey};
use serde_json::{json, Value};
use support::{admin, connect_as, env, invoice_page};

const ROLE: &str = "ctxguard_oidc_test";

/// The provider, killed when dropped.
struct Provider {
    child: Child,
    issuer: String,
}

impl Provider {
    /// Start tests/oidc/provider.mjs with these keys and wait for its "ready" line.
    fn start(port: u16, keys: &[&str]) -> Provider {
        let dir = PathBuf::from(env("CTXGUARD_TEST_OIDC_DIR"));
        let keys: Vec<String> = keys
            .iter()
            .map(|k| dir.join(format!("{k}.pem")).display().to_string())
            .collect();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc/provider.mjs");
        let mut child = Command::new("node")
            .arg(script)
            .env("OIDC_NODE_MODULES", env("CTXGUARD_TEST_OIDC_NODE_MODULES"))
            .env("OIDC_PORT", port.to_string())
            .env("OIDC_KEYS", keys.join(","))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("node runs tests/oidc/provider.mjs");
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let issuer = line
            .strip_prefix("ready ")
            .unwrap_or_else(|| panic!("provider did not start: {line:?}"))
            .trim()
            .to_string();
        Provider { child, issuer }
    }

    /// A JWT access token for `client` and `resource` (client credentials grant).
    async fn token(&self, client: &str, resource: &str) -> String {
        let resp: Value = support::http()
            .post(format!("{}/token", self.issuer))
            // (Values of plain letters, digits, '-' and ':': nothing to escape.)
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&client_id={client}&client_secret={client}-secret\
                 &resource={resource}&scope=ctxguard"
            ))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        resp["access_token"]
            .as_str()
            .unwrap_or_else(|| panic!("no access token: {resp}"))
            .to_string()
    }
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn pem(name: &str) -> String {
    std::fs::read_to_string(Path::new(&env("CTXGUARD_TEST_OIDC_DIR")).join(format!("{name}.pem")))
        .unwrap()
}

/// The claims of a JWT (unverified: to forge variants of a real token).
fn claims_of(token: &str) -> Value {
    use base64::Engine;
    let part = token.split('.').nth(1).unwrap();
    serde_json::from_slice(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(part)
            .unwrap(),
    )
    .unwrap()
}

/// A token with this header (JSON) and claims, signed with `key` for `alg`.
fn forge(header: Value, claims: &Value, alg: Algorithm, key: &EncodingKey) -> String {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let message = format!(
        "{}.{}",
        b64.encode(header.to_string()),
        b64.encode(claims.to_string())
    );
    let sig = jsonwebtoken::crypto::sign(message.as_bytes(), key, alg).unwrap();
    format!("{message}.{sig}")
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `verify_token` as the configured role: the identity, or the SQLSTATE and message.
async fn verify(db: &tokio_postgres::Client, token: &str) -> Result<Value, (String, String)> {
    match db
        .query_one("SELECT ctxguard.verify_token($1)", &[&token])
        .await
    {
        Ok(row) => Ok(row.get(0)),
        Err(e) => {
            let db_err = e.as_db_error().expect("a database error");
            Err((
                db_err.code().code().to_string(),
                db_err.message().to_string(),
            ))
        }
    }
}

async fn refused(db: &tokio_postgres::Client, token: &str, why: &str) {
    assert_eq!(
        verify(db, token).await,
        Err((
            "28000".into(),
            format!("ctxguard: invalid context token: {why}")
        )),
    );
}

async fn jwks_sync(issuer: &str, out: &Path) -> Outcome {
    sync(&SyncArgs {
        url: None,
        issuer: Some(issuer.to_string()),
        out: out.to_path_buf(),
        timeout_secs: 10,
    })
    .await
    .unwrap()
}

/// `ALTER SYSTEM SET` + reload, then wait until a new session sees `value` (the postmaster has
/// re-read the configuration).
async fn set_system(name: &str, value: Option<&str>) {
    let su = admin().await;
    match value {
        Some(v) => {
            su.batch_execute(&format!("ALTER SYSTEM SET {name} = '{v}'"))
                .await
                .unwrap();
        }
        None => su
            .batch_execute(&format!("ALTER SYSTEM RESET {name}"))
            .await
            .unwrap(),
    }
    su.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let want = value.unwrap_or_default().to_string();
    loop {
        let row = admin()
            .await
            .query_one(&format!("SELECT current_setting('{name}')"), &[])
            .await
            .unwrap();
        if row.get::<_, String>(0) == want {
            break;
        }
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn tokens_of_a_real_openid_provider_verify_and_survive_key_rotation() {
    let port: u16 = env("CTXGUARD_TEST_OIDC_PORT").parse().unwrap();
    let dir = PathBuf::from(env("CTXGUARD_TEST_OIDC_DIR"));
    let jwks_file = dir.join("jwks.json");
    let _ = std::fs::remove_file(&jwks_file);

    let provider = Provider::start(port, &["rsa1", "ec1"]);
    let issuer = provider.issuer.clone();

    // jwks-sync: discovers jwks_uri from the OpenID configuration, checks, writes; then idempotent.
    match jwks_sync(&issuer, &jwks_file).await {
        Outcome::Updated { keys, skipped } => {
            assert_eq!(keys, ["rsa1:RSA-2048", "ec1:EC P-256"]);
            assert!(skipped.is_empty());
        }
        other => panic!("{other:?}"),
    }
    assert!(matches!(
        jwks_sync(&issuer, &jwks_file).await,
        Outcome::Unchanged { .. }
    ));
    set_system("ctxguard.jwks_file", Some(&jwks_file.display().to_string())).await;

    // A role configured the way a DBA configures the gateway's role for this provider.
    let su = admin().await;
    su.batch_execute(&format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
           CREATE ROLE {ROLE} LOGIN NOSUPERUSER NOBYPASSRLS IN ROLE ctxguard_gateway; END IF; END $$;
         ALTER ROLE {ROLE} SET ctxguard.jwt_issuer = '{issuer}';
         ALTER ROLE {ROLE} SET ctxguard.jwt_audience = 'urn:ctxguard:rs, urn:ctxguard:es';
         ALTER ROLE {ROLE} SET ctxguard.claim_tenant = '\"https://ctxguard.test/tenant\"';
         ALTER ROLE {ROLE} SET ctxguard.claim_roles = 'realm_access.roles';"
    ))
    .await
    .unwrap();
    let url =
        env("CTXGUARD_TEST_DATABASE_URL").replace("user=ctxguard_gateway", &format!("user={ROLE}"));
    assert!(
        url.contains(ROLE),
        "the test database URL names the gateway role"
    );
    let mut db = connect_as(&url).await;

    // RS256 and ES256 tokens of the provider verify; tenant and roles come from the mapped claims.
    let rs = provider.token("svc-acme", "urn:ctxguard:rs").await;
    let es = provider.token("svc-acme", "urn:ctxguard:es").await;
    let want = json!({"tenantId": "acme", "userId": "svc-acme", "roles": ["ap_clerk", "viewer"]});
    assert_eq!(verify(&db, &rs).await, Ok(want.clone()));
    assert_eq!(verify(&db, &es).await, Ok(want.clone()));
    let tx = db.transaction().await.unwrap();
    tx.execute(
        "SELECT ctxguard.set_context($1, $2)",
        &[&es, &invoice_page("acme_inv3")],
    )
    .await
    .unwrap();
    let row = tx
        .query_one("SELECT ctxguard.tenant_id(), ctxguard.user_id()", &[])
        .await
        .unwrap();
    assert_eq!(
        (row.get::<_, String>(0), row.get::<_, String>(1)),
        ("acme".into(), "svc-acme".into())
    );
    tx.rollback().await.unwrap();

    // The key settings are not readable by the role.
    for setting in ["ctxguard.jwks_file", "ctxguard.jwks"] {
        let e = db
            .query_one(&format!("SHOW {setting}"), &[])
            .await
            .unwrap_err();
        assert_eq!(e.code().unwrap().code(), "42501", "{setting}");
    }

    // Refusals.
    let other = provider.token("svc-acme", "urn:other").await;
    refused(&db, &other, "token audience is not accepted").await;
    let bad_tenant = provider.token("svc-bad-tenant", "urn:ctxguard:rs").await;
    refused(
        &db,
        &bad_tenant,
        "token claim tenant_id is missing or invalid",
    )
    .await;
    {
        // The same keys behind another issuer: signature fine, issuer wrong.
        let elsewhere = Provider::start(port + 1, &["rsa1", "ec1"]);
        let t = elsewhere.token("svc-acme", "urn:ctxguard:rs").await;
        refused(&db, &t, "token issuer is not accepted").await;
    }
    let rsa1 = EncodingKey::from_rsa_pem(pem("rsa1").as_bytes()).unwrap();
    let mut expired = claims_of(&rs);
    expired["iat"] = json!(now() - 3600);
    expired["exp"] = json!(now() - 1800);
    let h = json!({"alg": "RS256", "typ": "at+jwt", "kid": "rsa1"});
    // Positive control: the forging itself yields a token that verifies.
    assert_eq!(
        verify(
            &db,
            &forge(h.clone(), &claims_of(&rs), Algorithm::RS256, &rsa1)
        )
        .await,
        Ok(want.clone())
    );
    refused(
        &db,
        &forge(h.clone(), &expired, Algorithm::RS256, &rsa1),
        "token has expired",
    )
    .await;
    let rsa2 = EncodingKey::from_rsa_pem(pem("rsa2").as_bytes()).unwrap();
    let unknown = forge(
        json!({"alg": "RS256", "kid": "rsa2"}),
        &claims_of(&rs),
        Algorithm::RS256,
        &rsa2,
    );
    refused(&db, &unknown, "token key id (kid) names no configured key").await;
    let jku = forge(
        json!({"alg": "RS256", "kid": "rsa1", "jku": format!("{issuer}/jwks")}),
        &claims_of(&rs),
        Algorithm::RS256,
        &rsa1,
    );
    refused(
        &db,
        &jku,
        "token header names or carries a key (jku, x5u, x5c, jwk), which is never used",
    )
    .await;
    // Algorithm confusion: HS256 with the RSA public key (its PEM, and the JWKS text) as secret.
    let public_pem = String::from_utf8(
        Command::new("openssl")
            .args(["pkey", "-pubout", "-in"])
            .arg(dir.join("rsa1.pem"))
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert!(public_pem.starts_with("-----BEGIN PUBLIC KEY-----"));
    let jwks_text = std::fs::read_to_string(&jwks_file).unwrap();
    for secret in [public_pem.as_str(), jwks_text.as_str()] {
        let t = forge(
            json!({"alg": "HS256", "kid": "rsa1"}),
            &claims_of(&rs),
            Algorithm::HS256,
            &EncodingKey::from_secret(secret.as_bytes()),
        );
        refused(&db, &t, "token signature is invalid").await;
    }

    // Rotation: the provider now signs with rsa2 (added) and no longer has rsa1 (removed).
    drop(provider);
    let provider = Provider::start(port, &["rsa2", "ec1"]);
    match jwks_sync(&provider.issuer, &jwks_file).await {
        Outcome::Updated { keys, .. } => assert_eq!(keys, ["rsa2:RSA-2048", "ec1:EC P-256"]),
        other => panic!("{other:?}"),
    }
    su.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    // The same long-lived session: new tokens verify, the removed key's token no longer does.
    let rs2 = provider.token("svc-acme", "urn:ctxguard:rs").await;
    assert_eq!(
        jsonwebtoken::decode_header(&rs2).unwrap().kid.as_deref(),
        Some("rsa2")
    );
    assert_eq!(verify(&db, &rs2).await, Ok(want.clone()));
    refused(&db, &rs, "token key id (kid) names no configured key").await;
    assert_eq!(
        verify(&db, &es).await,
        Ok(want.clone()),
        "the kept key still verifies"
    );
    // And a session opened after the rotation agrees.
    let fresh = connect_as(&url).await;
    assert_eq!(verify(&fresh, &rs2).await, Ok(want.clone()));
    refused(&fresh, &rs, "token key id (kid) names no configured key").await;

    // A broken file refuses every JWKS token (fail closed), a good one restores them.
    std::fs::write(&jwks_file, "{\"keys\": \"not a list\"}").unwrap();
    refused(&db, &rs2, "configured verification key is invalid").await;
    assert!(matches!(
        jwks_sync(&provider.issuer, &jwks_file).await,
        Outcome::Updated { .. }
    ));
    assert_eq!(verify(&db, &rs2).await, Ok(want));

    // A missing file is no key: refused, call after call (fail closed).
    std::fs::remove_file(&jwks_file).unwrap();
    for _ in 0..2 {
        refused(&db, &rs2, "configured verification key is invalid").await;
    }

    set_system("ctxguard.jwks_file", None).await;
    let after = connect_as(&url).await;
    refused(
        &after,
        &rs2,
        "no verification key is configured for this algorithm",
    )
    .await;
}
