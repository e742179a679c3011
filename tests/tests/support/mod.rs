//! Shared pieces of the gateway integration tests: the real gateway router served on a local port,
//! a scriptable mock OpenAI-compatible server (a real HTTP server), tokens, and a database client
//! for asserting outcomes.
#![allow(dead_code, reason = "each test binary uses a different subset")]

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use clap::Parser;
use ctxguard_gateway::config::Config;
use ctxguard_gateway::http::AppState;
use jsonwebtoken::{encode, EncodingKey, Header};
use serde_json::{json, Value};

pub fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run scripts/test.sh"))
}

/// Connection string `url` with its database replaced by `database`.
pub fn with_dbname(url: &str, database: &str) -> String {
    url.split_whitespace()
        .map(|kv| {
            if kv.starts_with("dbname=") {
                format!("dbname={database}")
            } else {
                kv.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// A token for a demo user (acme or globex), with the test audience.
pub fn token(sub: &str, tenant: &str, roles: &[&str]) -> String {
    let exp = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
        + 600;
    let claims = json!({"sub": sub, "tenant_id": tenant, "roles": roles, "exp": exp, "aud": "ctxguard-tests"});
    encode(
        &Header::default(),
        &claims,
        &EncodingKey::from_secret(env("CTXGUARD_TEST_JWT_SECRET").as_bytes()),
    )
    .unwrap()
}

/// One scripted answer of the mock model.
#[derive(Clone)]
pub enum Step {
    /// Ask for these tool calls: (wire name, arguments).
    Tools(Vec<(&'static str, Value)>),
    Answer(&'static str),
    Status(u16, Option<&'static str>),
    Sleep(Duration),
    /// Answer with this assistant `message` as it is (OpenAI-compatible only): any number of
    /// tool calls, arguments or answer of any size.
    Message(Value),
    /// Wait, then answer with the inner step (a model that takes its time between tool calls).
    After(Duration, Box<Step>),
}

#[derive(Clone, Default)]
pub struct Mock {
    script: Arc<Mutex<VecDeque<Step>>>,
    /// Every request body the mock received.
    pub requests: Arc<Mutex<Vec<Value>>>,
    /// When the script is empty, repeat this step forever (for endless loops).
    pub repeat: Arc<Mutex<Option<Step>>>,
}

async fn completions(State(mock): State<Mock>, Json(body): Json<Value>) -> Response {
    mock.requests.lock().unwrap().push(body);
    let step = mock.next_step().await;
    match step {
        Some(Step::Tools(calls)) => {
            let calls: Vec<Value> = calls
                .iter()
                .enumerate()
                .map(|(i, (name, args))| json!({"id": format!("call_{}_{i}", uuid::Uuid::new_v4().simple()), "type": "function",
                                                "function": {"name": name, "arguments": args.to_string()}}))
                .collect();
            Json(json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": calls}}]})).into_response()
        }
        Some(Step::Answer(text)) => {
            Json(json!({"choices": [{"message": {"role": "assistant", "content": text}}]}))
                .into_response()
        }
        Some(Step::Status(code, retry_after)) => {
            let mut r = (StatusCode::from_u16(code).unwrap(), "upstream trouble").into_response();
            if let Some(ra) = retry_after {
                r.headers_mut().insert("retry-after", ra.parse().unwrap());
            }
            r
        }
        Some(Step::Sleep(d)) => {
            tokio::time::sleep(d).await;
            Json(json!({"choices": [{"message": {"role": "assistant", "content": "too late"}}]}))
                .into_response()
        }
        Some(Step::Message(message)) => {
            Json(json!({"choices": [{"message": message}]})).into_response()
        }
        Some(Step::After(..)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "waits are resolved by next_step",
        )
            .into_response(),
        None => Json(json!({"choices": [{"message": {"role": "assistant", "content": "done"}}]}))
            .into_response(),
    }
}

/// The same script, spoken as the Anthropic Messages API.
async fn messages(State(mock): State<Mock>, Json(body): Json<Value>) -> Response {
    mock.requests.lock().unwrap().push(body);
    let step = mock.next_step().await;
    match step {
        Some(Step::Tools(calls)) => {
            let content: Vec<Value> = calls
                .iter()
                .map(|(name, args)| json!({"type": "tool_use", "id": format!("toolu_{}", uuid::Uuid::new_v4().simple()), "name": name, "input": args}))
                .collect();
            Json(json!({"content": content, "stop_reason": "tool_use"})).into_response()
        }
        Some(Step::Answer(text)) => {
            Json(json!({"content": [{"type": "text", "text": text}], "stop_reason": "end_turn"}))
                .into_response()
        }
        Some(Step::Status(code, _)) => {
            (StatusCode::from_u16(code).unwrap(), "upstream trouble").into_response()
        }
        Some(Step::Message(_)) => {
            (StatusCode::NOT_IMPLEMENTED, "Step::Message is OpenAI-only").into_response()
        }
        Some(Step::Sleep(d)) => {
            tokio::time::sleep(d).await;
            Json(json!({"content": [{"type": "text", "text": "too late"}]})).into_response()
        }
        Some(Step::After(..)) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            "waits are resolved by next_step",
        )
            .into_response(),
        None => Json(json!({"content": [{"type": "text", "text": "done"}]})).into_response(),
    }
}

impl Mock {
    /// The next scripted step, or the repeated one once the script is spent (after its wait, for
    /// a delayed one).
    async fn next_step(&self) -> Option<Step> {
        let mut step = self
            .script
            .lock()
            .unwrap()
            .pop_front()
            .or_else(|| self.repeat.lock().unwrap().clone());
        while let Some(Step::After(wait, inner)) = step {
            tokio::time::sleep(wait).await;
            step = Some(*inner);
        }
        step
    }

    pub fn new(steps: Vec<Step>) -> Mock {
        Mock {
            script: Arc::new(Mutex::new(steps.into())),
            ..Default::default()
        }
    }

    /// Serve on a random local port; returns the base URL (…/v1).
    pub async fn serve(&self) -> String {
        let app = Router::new()
            .route("/v1/chat/completions", post(completions))
            .route("/v1/messages", post(messages))
            .with_state(self.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        format!("http://{addr}/v1")
    }

    pub fn request_count(&self) -> usize {
        self.requests.lock().unwrap().len()
    }
}

/// A gateway whose OpenAI-compatible provider is `mock` (served here), plus CLI-style overrides.
pub async fn openai_gateway(mock: &Mock, extra: &[&str]) -> SocketAddr {
    let base = mock.serve().await;
    let mut args = vec!["--provider", "openai", "--llm-base-url", base.as_str()];
    args.extend_from_slice(extra);
    gateway(&args).await
}

/// The real gateway router on a random local port. `extra` are CLI-style overrides.
pub async fn gateway(extra: &[&str]) -> SocketAddr {
    gateway_with_state(extra).await.0
}

/// The real gateway router on a random local port, and its state (for what `main` does besides
/// serving, such as upstream MCP discovery). `extra` are CLI-style overrides.
pub async fn gateway_with_state(extra: &[&str]) -> (SocketAddr, Arc<AppState>) {
    gateway_on(&env("CTXGUARD_TEST_DATABASE_URL"), extra).await
}

/// The real gateway router on a random local port, connected to `url` (e.g. through pgbouncer).
pub async fn gateway_at(url: &str, extra: &[&str]) -> (SocketAddr, Arc<AppState>) {
    gateway_on(url, extra).await
}

/// The real gateway router on a random local port, on the database at `url` (as the gateway role).
pub async fn gateway_on(url: &str, extra: &[&str]) -> (SocketAddr, Arc<AppState>) {
    let mut args = vec!["ctxguard-gateway", "--database-url", url];
    args.extend_from_slice(extra);
    let config = Config::try_parse_from(args).unwrap();
    config.validate().unwrap();
    let state = Arc::new(AppState::from_config(config).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let served = state.clone();
    tokio::spawn(async move {
        ctxguard_gateway::http::serve(listener, served)
            .await
            .unwrap()
    });
    (addr, state)
}

pub fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// POST JSON with a bearer token and a request id; returns (status, body).
pub async fn post_json(
    addr: SocketAddr,
    path: &str,
    token: Option<&str>,
    trace: &str,
    body: &Value,
) -> (u16, Value) {
    let mut r = http()
        .post(format!("http://{addr}{path}"))
        .header("x-request-id", trace)
        .json(body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    (status, resp.json().await.unwrap_or(Value::Null))
}

/// The database URLs of the demo's roles (`sql/demo/schema.sql`), besides the gateway role's
/// `CTXGUARD_TEST_DATABASE_URL`: the discovery role (ctxguard_discovery: `sync_mcp_tools` only) and
/// the demo screens' role (ctxguard_app).
pub fn discovery_url() -> String {
    env("CTXGUARD_TEST_DISCOVERY_URL")
}

pub fn app_url() -> String {
    env("CTXGUARD_TEST_APP_URL")
}

/// A connection as one of the demo's roles (or the admin), for asserting what it may do.
pub async fn connect_as(url: &str) -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap();
    tokio::spawn(conn);
    client
}

/// A superuser connection for asserting database outcomes.
pub async fn admin() -> tokio_postgres::Client {
    connect_as(&env("CTXGUARD_TEST_ADMIN_URL")).await
}

/// `(decision, code)` of every audit row written under this trace id, in order.
pub async fn audit(trace: &str) -> Vec<(String, Option<String>, Option<String>)> {
    admin()
        .await
        .query(
            "SELECT decision, code, tool FROM ctxguard.audit_log WHERE trace_id = $1 ORDER BY id",
            &[&trace],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .collect()
}

/// One call of `tool` (no arguments) on `page` with `tok`'s context, in a transaction of its own on
/// a blocking client; committed, or rolled back.
pub fn call_in_transaction(
    c: &mut postgres::Client,
    tok: &str,
    page: &Value,
    tool: &str,
    commit: bool,
) -> Value {
    let mut tx = c.transaction().unwrap();
    tx.execute("SELECT ctxguard.set_context($1, $2)", &[&tok, page])
        .unwrap();
    let v: Value = tx
        .query_one("SELECT ctxguard.call_tool($1)", &[&tool])
        .unwrap()
        .get(0);
    if commit {
        tx.commit().unwrap();
    } else {
        tx.rollback().unwrap();
    }
    v
}

pub fn invoice_page(id: &str) -> Value {
    json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": id}})
}

/// A superuser's blocking connection to database `db` of the test cluster.
pub fn admin_on(db: &str) -> postgres::Client {
    postgres::Client::connect(
        &with_dbname(&env("CTXGUARD_TEST_ADMIN_URL"), db),
        postgres::NoTls,
    )
    .unwrap()
}

/// The gateway role's blocking connection to database `db` of the test cluster.
pub fn gateway_on_db(db: &str) -> postgres::Client {
    postgres::Client::connect(
        &with_dbname(&env("CTXGUARD_TEST_DATABASE_URL"), db),
        postgres::NoTls,
    )
    .unwrap()
}

/// Drop database `db` (ending its sessions) if it is there.
pub fn drop_db(db: &str) {
    admin_on("postgres")
        .batch_execute(&format!("DROP DATABASE IF EXISTS {db} WITH (FORCE)"))
        .unwrap();
}

/// A new database `db` (dropped first if it is there) with the extension and page type `page`,
/// then `sql` run in it as the superuser.
pub fn scratch_db(db: &str, page: &str, sql: &str) {
    drop_db(db);
    admin_on("postgres")
        .batch_execute(&format!("CREATE DATABASE {db}"))
        .unwrap();
    admin_on(db)
        .batch_execute(&format!(
            "SET client_min_messages = warning; CREATE EXTENSION ctxguard;
             SELECT ctxguard.register_page_type('{page}', NULL, 'A page.'); {sql}"
        ))
        .unwrap();
}

/// One built-in call (`list_available_tools`) in database `db` as the gateway role, by acme's
/// viewer `user` on page type `page`, committed: its envelope.
pub fn builtin_call(db: &str, user: &str, page: &str) -> Value {
    call_in_transaction(
        &mut gateway_on_db(db),
        &token(user, "acme", &["viewer"]),
        &json!({ "pageType": page }),
        "list_available_tools",
        true,
    )
}

/// An envelope's error code, or its status when it has none.
pub fn envelope_code(v: &Value) -> &str {
    v["error"]["code"]
        .as_str()
        .or_else(|| v["status"].as_str())
        .unwrap_or("?")
}
