//! The "next client" harness (issue 29): one server connection used by an attacker session, then
//! by a victim session, (a) directly: a pool of one connection, the attacker's SQL run on it, then
//! handed to the gateway's `Db` code; (b) through pgbouncer in transaction mode (a server pool of
//! 2) in front of two gateways. For each class of leftover (temporary types and domains over every
//! type the gateway and ctxguard name, temporary tables named like ctxguard's, a hostile
//! `search_path` with functions and operators, each setting the gateway pins, role defaults, idle
//! open transactions, read-only session characteristics) the victim's results, errors and audit
//! rows equal those of a fresh connection; no attacker function ran; no token reached the server
//! log.
//!
//! Needs the usual variables, `CTXGUARD_TEST_POOLER_URL` and `CTXGUARD_TEST_PGDATA` (the server
//! log is `$CTXGUARD_TEST_PGDATA/../postgres.log`).

mod support;

use std::time::Duration;

use ctxguard_gateway::config::database::StatementMode;
use ctxguard_gateway::db::{Db, Scope, ToolName};
use futures::FutureExt;
use serde_json::{json, Value};
use support::*;

/// The tests of this file change role defaults and shared objects: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Every type the gateway or ctxguard names (as a domain base in pg_temp, a spy in its CHECK).
const TYPES: &[&str] = &[
    "text",
    "jsonb",
    "json",
    "uuid",
    "int2",
    "int4",
    "int8",
    "bool",
    "numeric",
    "float4",
    "float8",
    "timestamptz",
    "timestamp",
    "date",
    "interval",
    "bytea",
    "name",
    "oid",
    "regclass",
    "regconfig",
    "regprocedure",
    "regproc",
    "regtype",
    "regrole",
    "regnamespace",
    "tsvector",
    "tsquery",
    "varchar",
    "bpchar",
    "inet",
    "xid8",
];

/// Temporary tables named like the tables the gateway and ctxguard read.
const TABLES: &[&str] = &[
    "tools",
    "page_types",
    "mcp_servers",
    "conversation_turns",
    "effective_ttls",
    "pg_extension",
    "audit_log",
    "mcp_sessions",
    "tool_policies",
    "generations",
    "documents",
    "pg_settings",
];

/// One hostile session state per pinned setting (and the SET forms that reach the same ones).
const SETTINGS: &[(&str, &str)] = &[
    ("statement_timeout", "SET statement_timeout = 1"),
    ("lock_timeout", "SET lock_timeout = 1"),
    (
        "idle_in_transaction_session_timeout",
        "SET idle_in_transaction_session_timeout = 1",
    ),
    (
        "log_parameter_max_length_on_error",
        "SET log_parameter_max_length_on_error = -1",
    ),
    ("search_path", "SET search_path = nextclient, pg_catalog, pg_temp"),
    ("role", "SET ROLE ctxguard_gateways"),
    ("row_security", "SET row_security = off"),
    ("default_transaction_read_only", "SET default_transaction_read_only = on"),
    (
        "default_transaction_read_only",
        "SET SESSION CHARACTERISTICS AS TRANSACTION READ ONLY",
    ),
    (
        "default_transaction_isolation",
        "SET SESSION CHARACTERISTICS AS TRANSACTION ISOLATION LEVEL SERIALIZABLE",
    ),
    (
        "default_transaction_isolation",
        "SET default_transaction_isolation = 'repeatable read'",
    ),
    ("synchronous_commit", "SET synchronous_commit = off"),
    ("debug_print_parse", "SET debug_print_parse = on"),
    ("debug_print_rewritten", "SET debug_print_rewritten = on"),
    ("debug_print_plan", "SET debug_print_plan = on"),
    ("client_min_messages", "SET client_min_messages = debug5"),
    ("jit", "SET jit = on; SET jit_above_cost = 0; SET jit_optimize_above_cost = 0"),
    (
        "max_parallel_workers_per_gather",
        "SET max_parallel_workers_per_gather = 8; SET parallel_setup_cost = 0; SET parallel_tuple_cost = 0; SET min_parallel_table_scan_size = 0",
    ),
    ("standard_conforming_strings", "SET standard_conforming_strings = off"),
    ("transform_null_equals", "SET transform_null_equals = on"),
    ("array_nulls", "SET array_nulls = off"),
    ("TimeZone", "SET TimeZone = 'Pacific/Kiritimati'"),
    ("DateStyle", "SET DateStyle = 'SQL, DMY'"),
    ("IntervalStyle", "SET IntervalStyle = 'sql_standard'"),
    ("extra_float_digits", "SET extra_float_digits = -15"),
    ("bytea_output", "SET bytea_output = escape"),
    (
        "default_text_search_config",
        "SET default_text_search_config = 'pg_catalog.simple'",
    ),
    // The victim's stale page is refused (an ERROR): FATAL with this, its connection dropped.
    ("exit_on_error", "SET exit_on_error = on"),
    // Printed names double-quoted: the entity check's SQL was built from one (a backend's every
    // later detail page failed).
    ("quote_all_identifiers", "SET quote_all_identifiers = on"),
];

/// The role defaults a client of the gateway role can give it (`ALTER ROLE CURRENT_USER SET`).
const ROLE_DEFAULTS: &[&str] = &[
    "statement_timeout = 1",
    "lock_timeout = 1",
    "idle_in_transaction_session_timeout = 1",
    "log_parameter_max_length_on_error = -1",
    "search_path = nextclient, pg_catalog, pg_temp",
    "row_security = off",
    "default_transaction_read_only = on",
    "default_transaction_isolation = serializable",
    "debug_print_plan = on",
    "TimeZone = 'Pacific/Kiritimati'",
    "DateStyle = 'SQL, DMY'",
    "standard_conforming_strings = off",
    "exit_on_error = on",
    "quote_all_identifiers = on",
];

/// The shared pieces an attacker's leftovers point at: a spy that records what it sees (owned by
/// the admin, callable by anyone), and in schema `nextclient` functions and operators named like
/// the catalog's, for a hostile `search_path`.
async fn prepare_spy() {
    admin()
        .await
        .batch_execute(
            "CREATE SCHEMA IF NOT EXISTS nextclient;
             GRANT USAGE ON SCHEMA nextclient TO PUBLIC;
             CREATE TABLE IF NOT EXISTS nextclient.spied (at timestamptz DEFAULT now(), v text);
             GRANT INSERT, SELECT ON nextclient.spied TO PUBLIC;
             CREATE OR REPLACE FUNCTION nextclient.spy(v text) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN INSERT INTO nextclient.spied (v) VALUES (v); RETURN true; END $$;
             CREATE OR REPLACE FUNCTION nextclient.spy_eq(a text, b text) RETURNS boolean LANGUAGE plpgsql AS
               $$ BEGIN PERFORM nextclient.spy(a || '=' || b); RETURN a OPERATOR(pg_catalog.=) b; END $$;
             CREATE OR REPLACE FUNCTION nextclient.replace(a text, b text, c text) RETURNS text LANGUAGE plpgsql AS
               $$ BEGIN PERFORM nextclient.spy(a); RETURN pg_catalog.replace(a, b, c); END $$;
             CREATE OR REPLACE FUNCTION nextclient.jsonb_build_object(VARIADIC a text[]) RETURNS jsonb LANGUAGE plpgsql AS
               $$ BEGIN PERFORM nextclient.spy(a::pg_catalog.text); RETURN '{}'; END $$;
             DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_catalog.pg_operator WHERE oprname = '='
                                AND oprnamespace = 'nextclient'::regnamespace) THEN
                 CREATE OPERATOR nextclient.= (LEFTARG = text, RIGHTARG = text, FUNCTION = nextclient.spy_eq);
               END IF;
             END $$;
             GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA nextclient TO PUBLIC;
             TRUNCATE nextclient.spied;",
        )
        .await
        .unwrap();
}

async fn spied() -> Vec<String> {
    admin()
        .await
        .query("SELECT coalesce(v, '<null>') FROM nextclient.spied", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect()
}

/// The attacker's SQL: temporary domains over every type with the spy in their CHECK, and
/// temporary tables named like ctxguard's.
fn temp_objects_sql() -> String {
    let mut s = String::new();
    for t in TYPES {
        s.push_str(&format!(
            "CREATE DOMAIN pg_temp.{t} AS pg_catalog.{t} CHECK (nextclient.spy(VALUE::pg_catalog.text));\n"
        ));
    }
    for t in TABLES {
        s.push_str(&format!(
            "CREATE TEMP TABLE {t} (name text, description text, tenant_id text);\n"
        ));
    }
    s
}

/// What a victim sees of one call, without what differs between any two runs (ids, times, names).
fn outcome<T: std::fmt::Debug>(
    what: &str,
    r: &Result<T, ctxguard_gateway::error::ApiError>,
    pick: impl Fn(&T) -> Value,
) -> String {
    match r {
        Ok(v) => format!("{what}: ok {}", pick(v)),
        Err(e) => format!("{what}: {} {e}", e.code()),
    }
}

/// The victim's calls through `db`, as `sub` (a user of acme): their outcomes, in order.
async fn victim(db: &Db, sub: &str, trace: &str) -> Vec<String> {
    let tok = token(sub, "acme", &["ap_clerk"]);
    let scope = |page: Value, step: &str| Scope {
        token: tok.clone(),
        page,
        generation: None,
        trace_id: format!("{trace}-{step}"),
    };
    let mut out = Vec::new();
    let r = db.verify_token(&tok).await;
    out.push(outcome("verify_token", &r, |v| {
        json!([v["tenantId"], v["roles"]])
    }));
    let r = db
        .context(&scope(invoice_page("acme_inv2"), "context"))
        .await;
    out.push(outcome("context", &r, |v| {
        json!([v["tenantId"], v["pageType"], v["entity"]])
    }));
    let r = db
        .page_tools(
            &scope(invoice_page("acme_inv2"), "tools"),
            Some("invoice"),
            Some(8),
        )
        .await;
    out.push(outcome("page_tools", &r, |(tools, d)| {
        json!([d, tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>()])
    }));
    let r = db
        .explain_page(
            &scope(invoice_page("acme_inv2"), "explain"),
            Some("invoice"),
            8,
            200,
        )
        .await;
    out.push(outcome("explain_page", &r, |(v, ranked, overview)| {
        json!([
            ranked.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            overview.tools(),
            v["page"],
            v["tools"].as_array().map(|a| a
                .iter()
                .map(|t| json!([t["name"], t["visible"], t["offered"]]))
                .collect::<Vec<_>>())
        ])
    }));
    // Progressive disclosure (issue 31): the search and the page's namespaces.
    let r = db
        .search_candidates(
            &scope(invoice_page("acme_inv2"), "find"),
            "mark the invoice paid",
        )
        .await;
    out.push(outcome("find_tools", &r, |found| {
        json!([
            found.lexical,
            found
                .visible
                .iter()
                .map(|t| t.name.clone())
                .collect::<Vec<_>>(),
            found.overview.tools()
        ])
    }));
    let r = db
        .page_listing(&scope(invoice_page("acme_inv2"), "listing"))
        .await;
    out.push(outcome("page_listing", &r, |(tools, d, overview)| {
        json!([
            d,
            tools.iter().map(|t| t.name.clone()).collect::<Vec<_>>(),
            overview
                .namespaces
                .iter()
                .map(|n| json!([n.name, n.tools, n.bytes]))
                .collect::<Vec<_>>()
        ])
    }));
    for (step, name) in [
        ("call", ToolName::Catalog("invoice.get")),
        ("wire", ToolName::Wire("invoice__get")),
    ] {
        let r = db
            .call_tool(&scope(invoice_page("acme_inv3"), step), &name, &json!({}))
            .await;
        out.push(outcome("call_tool", &r, |v| {
            json!([v["status"], v["code"], v["result"]])
        }));
    }
    // A stale page: set_context fails (with the token among the statement's parameters).
    let r = db
        .call_tool(
            &scope(invoice_page("acme_inv_gone"), "stale"),
            &ToolName::Catalog("invoice.get"),
            &json!({}),
        )
        .await;
    out.push(outcome("stale page", &r, |v| v.clone()));
    let r = db
        .mint_generation(
            &scope(invoice_page("acme_inv2"), "mint"),
            &format!("{trace}-conv"),
        )
        .await;
    out.push(outcome("mint_generation", &r, |(_, ttl)| {
        json!(ttl.as_secs())
    }));
    let sid = format!("{trace}-session");
    let r = db
        .mcp_session_open(&tok, &sid, &json!({"protocolVersion": "2025-06-18"}), 600)
        .await;
    out.push(outcome("mcp_session_open", &r, |_| Value::Null));
    let r = db.mcp_session_load(&tok, &sid).await;
    out.push(outcome("mcp_session_load", &r, |v| json!(v)));
    let r = db.mcp_session_close(&tok, &sid).await;
    out.push(outcome("mcp_session_close", &r, |v| json!(v)));
    let r = db.mcp_servers(None).await;
    out.push(outcome("mcp_servers", &r, |v| {
        json!(v.iter().map(|s| s.name.clone()).collect::<Vec<_>>())
    }));
    let r = db.extension_version().await;
    out.push(outcome("extension_version", &r, |v| json!(v)));
    out.iter()
        .map(|s| s.replace(sub, "<victim>").replace(trace, "<trace>"))
        .collect()
}

/// `(step, decision, code, tool, user, entity)` of the audit rows of a victim run.
async fn audit_rows(trace: &str, sub: &str) -> Vec<String> {
    admin()
        .await
        .query(
            "SELECT trace_id, decision, code, tool, user_id, entity_id FROM ctxguard.audit_log
              WHERE trace_id LIKE $1 || '-%' ORDER BY id",
            &[&trace],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| {
            let t: String = r.get(0);
            format!(
                "{} {} {:?} {:?} {:?} {:?}",
                t.trim_start_matches(trace),
                r.get::<_, String>(1),
                r.get::<_, Option<String>>(2),
                r.get::<_, Option<String>>(3),
                r.get::<_, Option<String>>(4)
                    .map(|u| u.replace(sub, "<victim>")),
                r.get::<_, Option<String>>(5)
            )
        })
        .collect()
}

/// pgbouncer closes every server connection once released (the admin console's RECONNECT).
async fn pgbouncer_reconnect() {
    let console = connect_as(&env("CTXGUARD_TEST_POOLER_ADMIN_URL")).await;
    console.simple_query("RECONNECT").await.unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
}

fn gateway_url() -> String {
    env("CTXGUARD_TEST_DATABASE_URL")
}

/// A pool of exactly one connection to `url`, with `attack` run on that connection first.
async fn attacked_pool(url: &str, attack: &str) -> deadpool_postgres::Pool {
    let mut cfg = deadpool_postgres::Config::new();
    cfg.url = Some(url.to_string());
    cfg.manager = Some(deadpool_postgres::ManagerConfig {
        recycling_method: deadpool_postgres::RecyclingMethod::Fast,
    });
    cfg.pool = Some(deadpool_postgres::PoolConfig::new(1));
    let pool = cfg
        .create_pool(
            Some(deadpool_postgres::Runtime::Tokio1),
            tokio_postgres::NoTls,
        )
        .unwrap();
    if !attack.is_empty() {
        let c = pool.get().await.unwrap();
        c.batch_execute(attack)
            .await
            .unwrap_or_else(|e| panic!("the attack itself failed: {e:?}\n{attack}"));
    }
    pool
}

/// The server log from `offset` on.
fn log_since(offset: u64) -> String {
    let path = std::path::Path::new(&env("CTXGUARD_TEST_PGDATA"))
        .parent()
        .unwrap()
        .join("postgres.log");
    let all = std::fs::read(&path).unwrap_or_default();
    String::from_utf8_lossy(all.get(offset as usize..).unwrap_or_default()).into_owned()
}

fn log_len() -> u64 {
    let path = std::path::Path::new(&env("CTXGUARD_TEST_PGDATA"))
        .parent()
        .unwrap()
        .join("postgres.log");
    std::fs::metadata(path).map(|m| m.len()).unwrap_or(0)
}

/// No token is in the server log written since `offset`.
fn assert_no_token_in_log(offset: u64, subs: &[String]) {
    let log = log_since(offset);
    // Every JWT starts with a base64 JSON header, "eyJ". (Names may be logged: ctxguard's refusal
    // lines say who was refused; the victims' must be there at all for the check to mean anything.)
    assert!(
        subs.iter().all(|s| log.contains(s.as_str())) || subs.is_empty(),
        "the victims' calls left no trace in the log read (wrong log file?)"
    );
    assert!(
        !log.contains("eyJ"),
        "a JWT in the server log: {}",
        log.lines()
            .filter(|l| l.contains("eyJ"))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// A scenario: (name, attacker SQL). The victim runs on a one-connection pool the attacker used.
async fn direct_scenarios(mode: StatementMode, scenarios: &[(String, String)]) {
    let run = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    prepare_spy().await;
    let url = gateway_url();
    let fresh_db = Db::from_pool(attacked_pool(&url, "").await, &url, mode);
    let fresh_sub = format!("nc-fresh-{run}");
    let fresh_trace = format!("nc-{run}-fresh");
    let want = victim(&fresh_db, &fresh_sub, &fresh_trace).await;
    assert!(
        want.iter().any(|s| s.starts_with("call_tool: ok [\"ok\"")),
        "{want:#?}"
    );
    let want_audit = audit_rows(&fresh_trace, &fresh_sub).await;
    assert!(!want_audit.is_empty());
    let offset = log_len();
    let mut subs = Vec::new();
    let mut failures = Vec::new();
    for (i, (name, attack)) in scenarios.iter().enumerate() {
        let sub = format!("nc-victim-{run}-{i}");
        let trace = format!("nc-{run}-{i}");
        let at = log_len();
        let db = Db::from_pool(attacked_pool(&url, attack).await, &url, mode);
        let got = victim(&db, &sub, &trace).await;
        if got != want {
            failures.push(format!(
                "{name}: results differ:\n  want {want:?}\n  got  {got:?}"
            ));
        }
        let got_audit = audit_rows(&trace, &sub).await;
        if got_audit != want_audit {
            failures.push(format!(
                "{name}: audit rows differ:\n  want {want_audit:?}\n  got  {got_audit:?}"
            ));
        }
        let spy = spied().await;
        if !spy.is_empty() {
            failures.push(format!("{name}: the attacker's function ran on: {spy:?}"));
            admin()
                .await
                .batch_execute("TRUNCATE nextclient.spied")
                .await
                .unwrap();
        }
        if let Some(line) = log_since(at).lines().find(|l| l.contains("eyJ")) {
            failures.push(format!("{name}: a token in the server log: {line:.160}"));
        }
        subs.push(sub);
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios:\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n")
    );
    assert_no_token_in_log(offset, &subs);
}

fn every_scenario() -> Vec<(String, String)> {
    let mut s = vec![
        (
            "temporary domains and tables".to_string(),
            temp_objects_sql(),
        ),
        (
            "temporary domains, search_path with functions and operators".to_string(),
            format!(
                "{}SET search_path = nextclient, pg_catalog, public;",
                temp_objects_sql()
            ),
        ),
        (
            "an open transaction left idle".to_string(),
            "BEGIN; SELECT 1".to_string(),
        ),
    ];
    s.extend(
        SETTINGS
            .iter()
            .map(|(n, sql)| (format!("{n}: {sql}"), sql.to_string())),
    );
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_a_previous_client_used_serves_the_next_as_a_fresh_one_prepared() {
    let _serial = SERIAL.lock().await;
    direct_scenarios(StatementMode::Prepared, &every_scenario()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_a_previous_client_used_serves_the_next_as_a_fresh_one_unnamed() {
    let _serial = SERIAL.lock().await;
    direct_scenarios(StatementMode::Unnamed, &every_scenario()).await;
}

#[test]
fn every_pinned_setting_is_attacked() {
    for (name, _, _) in ctxguard_gateway::db::sql::PINS {
        assert!(
            SETTINGS.iter().any(|(n, _)| n == name),
            "no scenario leaves {name} set"
        );
    }
}

/// Every user-settable setting of this server is pinned or deliberately left (with why).
#[tokio::test]
async fn every_user_settable_setting_is_pinned_or_deliberately_not() {
    let rows = admin()
        .await
        .query(
            "SELECT name FROM pg_catalog.pg_settings WHERE context = 'user' AND name !~ '[.]' ORDER BY name",
            &[],
        )
        .await
        .unwrap();
    let mut missing = Vec::new();
    for r in rows {
        let name: String = r.get(0);
        let pinned = ctxguard_gateway::db::sql::PINS
            .iter()
            .any(|(n, _, _)| n.eq_ignore_ascii_case(&name));
        let unpinned = ctxguard_gateway::db::sql::UNPINNED
            .iter()
            .any(|(names, _)| names.iter().any(|n| n.eq_ignore_ascii_case(&name)));
        if !pinned && !unpinned {
            missing.push(name);
        }
    }
    assert!(
        missing.is_empty(),
        "user-settable settings in neither PINS nor UNPINNED: {missing:?}"
    );
}

/// Role defaults: what a client of the gateway role can make every new connection of the role start
/// with. Reset at the end, whatever happens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn role_defaults_of_the_gateway_role_change_nothing() {
    let _serial = SERIAL.lock().await;
    let url = gateway_url();
    let attacker = connect_as(&url).await;
    let set: String = ROLE_DEFAULTS
        .iter()
        .map(|s| format!("ALTER ROLE CURRENT_USER SET {s};"))
        .collect();
    let body = async {
        attacker.batch_execute(&set).await.unwrap();
        // Every new connection of the role starts with them (the pools below connect after).
        direct_scenarios(
            StatementMode::Prepared,
            &[("role defaults".into(), String::new())],
        )
        .await;
        direct_scenarios(
            StatementMode::Unnamed,
            &[("role defaults".into(), String::new())],
        )
        .await;
    };
    let result = std::panic::AssertUnwindSafe(body).catch_unwind().await;
    admin()
        .await
        .batch_execute("ALTER ROLE ctxguard_gateway RESET ALL")
        .await
        .unwrap();
    if let Err(p) = result {
        std::panic::resume_unwind(p);
    }
}

/// Through pgbouncer (transaction mode, a server pool of 2) in front of two gateways: the attacker,
/// a client of the same pool, leaves state on both server connections (two transactions held at
/// once get both), then the gateways serve victims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_pgbouncer_two_gateways_serve_the_next_clients_as_fresh_ones() {
    let _serial = SERIAL.lock().await;
    prepare_spy().await;
    let pooled = env("CTXGUARD_TEST_POOLER_URL");
    let (gw_a, _) = gateway_at(&pooled, &["--pool-size", "2"]).await;
    let (gw_b, _) = gateway_at(&pooled, &["--pool-size", "2"]).await;
    let run = uuid::Uuid::new_v4().simple().to_string()[..10].to_string();
    let offset = log_len();
    pgbouncer_reconnect().await;

    async fn calls(gws: [std::net::SocketAddr; 2], sub: &str, trace: &str) -> Vec<String> {
        let tok = token(sub, "acme", &["ap_clerk"]);
        let mut out = Vec::new();
        for (i, gw) in gws.iter().enumerate() {
            for (step, page) in [("ok", "acme_inv3"), ("stale", "acme_inv_gone")] {
                let (status, body) = post_json(
                    *gw,
                    "/internal/mcp/execute",
                    Some(&tok),
                    &format!("{trace}-{i}{step}"),
                    &json!({"tool_name": "invoice.get", "arguments": {}, "pageContext": invoice_page(page)}),
                )
                .await;
                out.push(format!(
                    "{i}{step}: {status} {} {} {}",
                    body["status"], body["code"], body["result"]["id"]
                ));
            }
        }
        out
    }
    let gws = [gw_a, gw_b];
    let fresh_sub = format!("nc-pfresh-{run}");
    let want = calls(gws, &fresh_sub, &format!("ncp-{run}-fresh")).await;
    assert!(want[0].starts_with("0ok: 200 \"ok\""), "{want:?}");
    let want_audit = audit_rows(&format!("ncp-{run}-fresh"), &fresh_sub).await;

    let mut scenarios = vec![(
        "temporary domains and tables".to_string(),
        temp_objects_sql(),
    )];
    scenarios.extend(
        SETTINGS
            .iter()
            .map(|(n, sql)| (format!("{n}: {sql}"), sql.to_string())),
    );
    let mut subs = Vec::new();
    let mut failures = Vec::new();
    for (i, (name, attack)) in scenarios.iter().enumerate() {
        // Both server connections of the pool: two transactions at once.
        let a1 = connect_as(&pooled).await;
        let a2 = connect_as(&pooled).await;
        // (The attack and its COMMIT in one message: with idle_in_transaction_session_timeout = 1
        // the attacker's own session would end while it waits.)
        for a in [&a1, &a2] {
            a.batch_execute("BEGIN").await.unwrap();
        }
        for a in [&a1, &a2] {
            a.batch_execute(&format!("{attack}; COMMIT"))
                .await
                .unwrap_or_else(|e| panic!("{name}: {e:?}"));
        }
        drop((a1, a2));
        let sub = format!("nc-pvictim-{run}-{i}");
        let trace = format!("ncp-{run}-{i}");
        let at = log_len();
        let got = calls(gws, &sub, &trace).await;
        if got != want {
            failures.push(format!(
                "{name}: results differ:\n  want {want:?}\n  got  {got:?}"
            ));
        }
        let got_audit = audit_rows(&trace, &sub).await;
        if got_audit != want_audit {
            failures.push(format!(
                "{name}: audit rows differ:\n  want {want_audit:?}\n  got  {got_audit:?}"
            ));
        }
        let spy = spied().await;
        if !spy.is_empty() {
            failures.push(format!("{name}: the attacker's function ran on: {spy:?}"));
            admin()
                .await
                .batch_execute("TRUNCATE nextclient.spied")
                .await
                .unwrap();
        }
        if let Some(line) = log_since(at).lines().find(|l| l.contains("eyJ")) {
            failures.push(format!("{name}: a token in the server log: {line:.160}"));
        }
        subs.push(sub);
        // The next scenario starts on new server connections.
        pgbouncer_reconnect().await;
    }
    assert!(
        failures.is_empty(),
        "{} of {} scenarios:\n{}",
        failures.len(),
        scenarios.len(),
        failures.join("\n")
    );
    assert_no_token_in_log(offset, &subs);

    // Idle open transactions holding both server connections: the victims are still served
    // (pgbouncer's idle_transaction_timeout ends the idle clients), within its bound.
    let i1 = connect_as(&pooled).await;
    let i2 = connect_as(&pooled).await;
    for i in [&i1, &i2] {
        i.batch_execute("SET idle_in_transaction_session_timeout = 0; BEGIN; SELECT 1")
            .await
            .unwrap();
    }
    let started = std::time::Instant::now();
    let sub = format!("nc-pidle-{run}");
    let got = tokio::time::timeout(
        Duration::from_secs(30),
        calls(gws, &sub, &format!("ncp-{run}-idle")),
    )
    .await
    .expect("served within 30 s");
    assert_eq!(got, want, "after idle transactions");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert!(
        i1.batch_execute("SELECT 1").await.is_err(),
        "the idle client was disconnected"
    );
}

/// A caller's own SQL around a ctxguard call (here a `DO` block) that ctxguard refuses leaves no
/// page text in the server log: ctxguard's refusal lines are `LOG` lines, which
/// `log_min_error_statement` ranks above `ERROR`, and they carried the caller's statement and its
/// context (found by an attacker's review).
#[tokio::test]
async fn a_refusal_line_carries_no_page_text_into_the_log() {
    let _serial = SERIAL.lock().await;
    let attacker = connect_as(&gateway_url()).await;
    let marker = format!("pagetextmarker{}", std::process::id());
    let tok = token("logvictim", "acme", &["ap_clerk"]);
    attacker
        .execute("SELECT set_config('logtest.token', $1, false)", &[&tok])
        .await
        .unwrap();
    let offset = log_len();
    attacker
        .batch_execute(&format!(
            "DO $$ BEGIN
               PERFORM ctxguard.set_context(current_setting('logtest.token'),
                 '{{\"pageType\": \"invoice_detail\", \"entity\": {{\"type\": \"invoice\", \"id\": \"{marker}\"}}}}');
             EXCEPTION WHEN others THEN NULL; END $$;"
        ))
        .await
        .unwrap();
    // The log is written asynchronously by the logging collector: give it a moment.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = log_since(offset);
    assert!(
        log.contains("logvictim"),
        "the refusals left no line in the log read (wrong log file?)"
    );
    assert!(
        !log.contains(&marker),
        "page text in the server log: {}",
        log.lines()
            .filter(|l| l.contains(&marker))
            .take(3)
            .collect::<Vec<_>>()
            .join("\n")
    );
}
