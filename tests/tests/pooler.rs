//! The gateway behind pgbouncer in transaction mode (SECURITY_MATRIX F.41): two gateways, two
//! tenants, a server pool of 2 (scripts/lib.sh `start_pgbouncer`). Every answer and every audit row
//! belongs to its own tenant and user, and no session state (settings, temporary objects, prepared
//! statements, LISTENs, advisory locks) is left on the pooled server connections.
//!
//! Needs `CTXGUARD_TEST_POOLER_URL` (the gateway role through pgbouncer) and
//! `CTXGUARD_TEST_POOLER_ADMIN_URL` (pgbouncer's admin console) besides the usual variables.

mod support;

use std::collections::HashMap;

use futures::StreamExt;
use serde_json::{json, Value};
use support::*;

const REQUESTS: usize = 10_000;

/// (tenant, user, invoice id prefix) of the four callers: two users in each of two tenants of
/// this run's own.
fn callers(run: &str) -> Vec<(String, String, String)> {
    let (a, b) = (format!("poola-{run}"), format!("poolb-{run}"));
    vec![
        (a.clone(), format!("u1-{run}"), format!("{a}-inv")),
        (b.clone(), format!("u1-{run}"), format!("{b}-inv")),
        (a.clone(), format!("u2-{run}"), format!("{a}-inv")),
        (b.clone(), format!("u2-{run}"), format!("{b}-inv")),
    ]
}

/// This run's two tenants: 12 invoices each (ids `<tenant>-inv<k>`), and a per-generation byte
/// budget that lets one generation per caller carry its share of the requests (each request
/// minting a generation of its own would fill the ledger's generation slots).
async fn make_tenants(run: &str) {
    let admin = admin().await;
    for tenant in [format!("poola-{run}"), format!("poolb-{run}")] {
        admin
            .execute(
                "INSERT INTO demo.vendors (tenant_id, id, name, country, email)
                 VALUES ($1, $1 || '-v', 'Vendor of ' || $1, 'DE', 'billing@vendor.example')",
                &[&tenant],
            )
            .await
            .unwrap();
        admin
            .execute(
                "INSERT INTO demo.invoices (tenant_id, id, vendor_id, number, amount, status, issued_on, due_on)
                 SELECT $1, $1 || '-inv' || g, $1 || '-v', 'N-' || g, 100 + g, 'open', DATE '2026-09-01', DATE '2026-10-01'
                   FROM generate_series(1, 12) g",
                &[&tenant],
            )
            .await
            .unwrap();
        admin
            .execute(
                "INSERT INTO ctxguard.tenant_limits (tenant_id, max_bytes_per_generation) VALUES ($1, 100000000)",
                &[&tenant],
            )
            .await
            .unwrap();
    }
}

async fn pgbouncer_show(what: &str) -> Vec<Vec<Option<String>>> {
    let admin = connect_as(&env("CTXGUARD_TEST_POOLER_ADMIN_URL")).await;
    admin
        .simple_query(&format!("SHOW {what}"))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((0..r.len()).map(|i| r.get(i).map(str::to_string)).collect())
            }
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_statements_are_unnamed_behind_pgbouncer_and_prepared_on_postgres_itself() {
    let pooled = env("CTXGUARD_TEST_POOLER_URL");
    let direct = env("CTXGUARD_TEST_DATABASE_URL");
    assert_eq!(ctxguard_gateway::db::probe_direct(&pooled).await, Ok(false));
    assert_eq!(ctxguard_gateway::db::probe_direct(&direct).await, Ok(true));
    // Over TCP straight to PostgreSQL as well (the cluster listens on 127.0.0.1 too).
    let tcp = direct.replace(&format!("host={}", host_of(&direct)), "host=127.0.0.1");
    assert_ne!(tcp, direct);
    assert_eq!(ctxguard_gateway::db::probe_direct(&tcp).await, Ok(true));

    let (_, state) = gateway_at(&pooled, &[]).await;
    assert_eq!(state.core.db.statements(), "auto");
    assert!(state.core.db.unnamed().await);
    assert_eq!(state.core.db.statements(), "unnamed");
    let (_, state) = gateway_at(&direct, &[]).await;
    assert!(!state.core.db.unnamed().await);
    assert_eq!(state.core.db.statements(), "prepared");
}

fn host_of(url: &str) -> &str {
    url.split_whitespace()
        .find_map(|kv| kv.strip_prefix("host="))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_interleaved_requests_of_two_tenants_through_two_gateways_stay_apart() {
    let pooled = env("CTXGUARD_TEST_POOLER_URL");
    let (gw_a, a) = gateway_at(&pooled, &["--pool-size", "8"]).await;
    let (gw_b, b) = gateway_at(&pooled, &["--pool-size", "8"]).await;
    let run = uuid::Uuid::new_v4().simple().to_string()[..12].to_string();
    make_tenants(&run).await;
    let callers = callers(&run);
    let tokens: Vec<String> = callers
        .iter()
        .map(|(tenant, user, _)| token(user, tenant, &[]))
        .collect();
    let client = http();
    // One generation per caller, minted by a first call (not counted below).
    let mut generations = Vec::new();
    for (who, tok) in tokens.iter().enumerate() {
        let (status, body) = post_json(gw_a, "/internal/mcp/execute", Some(tok), &format!("poolwarm-{run}-{who}"),
            &json!({"tool_name": "invoice.get", "arguments": {}, "pageContext": invoice_page(&format!("{}1", callers[who].2))})).await;
        assert_eq!(
            (status, body["status"].as_str()),
            (200, Some("ok")),
            "{body}"
        );
        generations.push(body["generation_id"].as_str().unwrap().to_string());
    }
    let outcomes: Vec<(usize, u16, Value)> = futures::stream::iter(0..REQUESTS)
        .map(|i| {
            let (who, gw) = (i % 4, if (i / 4) % 2 == 0 { gw_a } else { gw_b });
            let invoice = format!("{}{}", callers[who].2, 1 + i % 12);
            let tok = tokens[who].clone();
            let generation = generations[who].clone();
            let client = client.clone();
            let trace = format!("pool-{run}-{i}");
            async move {
                let resp = client
                    .post(format!("http://{gw}/internal/mcp/execute"))
                    .bearer_auth(tok)
                    .header("x-request-id", &trace)
                    .json(&json!({"tool_name": "invoice.get", "arguments": {},
                                  "generation_id": generation,
                                  "pageContext": invoice_page(&invoice)}))
                    .send()
                    .await
                    .unwrap();
                let status = resp.status().as_u16();
                (i, status, resp.json().await.unwrap_or(Value::Null))
            }
        })
        .buffer_unordered(24)
        .collect()
        .await;

    // Through the pool: both gateways' clients share at most 2 server connections.
    assert_eq!(a.core.db.statements(), "unnamed");
    assert_eq!(b.core.db.statements(), "unnamed");
    let pools = pgbouncer_show("POOLS").await;
    let ours: Vec<_> = pools
        .iter()
        .filter(|r| r[1].as_deref() == Some("ctxguard_gateway"))
        .collect();
    assert!(!ours.is_empty(), "pgbouncer pools: {pools:?}");
    let servers = pgbouncer_show("SERVERS").await;
    let gateway_servers = servers
        .iter()
        .filter(|r| r[1].as_deref() == Some("ctxguard_gateway"))
        .count();
    assert!(
        (1..=2).contains(&gateway_servers),
        "server pool of 2: {servers:?}"
    );
    let clients = pgbouncer_show("CLIENTS").await;
    let gateway_clients = clients
        .iter()
        .filter(|r| r[1].as_deref() == Some("ctxguard_gateway"))
        .count();
    assert!(
        gateway_clients > 2,
        "the gateways' {gateway_clients} connections were multiplexed onto {gateway_servers}"
    );

    // Every answer: 200, the invoice of the caller's own page.
    for (i, status, body) in &outcomes {
        let invoice = format!("{}{}", callers[i % 4].2, 1 + i % 12);
        assert_eq!(
            (
                *status,
                body["status"].as_str(),
                body["result"]["id"].as_str()
            ),
            (200, Some("ok"), Some(invoice.as_str())),
            "request {i}: {body}"
        );
        assert_eq!(body["trace_id"], format!("pool-{run}-{i}"));
    }

    // Every audit row: the caller's tenant, user and entity, exactly one per request.
    let rows = admin()
        .await
        .query(
            "SELECT trace_id, tenant_id, user_id, entity_id, decision FROM ctxguard.audit_log
              WHERE trace_id LIKE $1",
            &[&format!("pool-{run}-%")],
        )
        .await
        .unwrap();
    assert_eq!(rows.len(), REQUESTS, "one audit row per request");
    let mut seen: HashMap<usize, usize> = HashMap::new();
    for r in &rows {
        let trace: String = r.get(0);
        let i: usize = trace.rsplit('-').next().unwrap().parse().unwrap();
        *seen.entry(i).or_default() += 1;
        let (tenant, user, prefix) = &callers[i % 4];
        let want = (
            Some(tenant.clone()),
            Some(user.clone()),
            Some(format!("{prefix}{}", 1 + i % 12)),
            "allow".to_string(),
        );
        let got: (Option<String>, Option<String>, Option<String>, String) =
            (r.get(1), r.get(2), r.get(3), r.get(4));
        assert_eq!(got, want, "audit row of request {i}");
    }
    assert_eq!(seen.len(), REQUESTS);

    // Nothing of a session is left on the pooled server connections: two transactions held at
    // once get both of the pool's server connections.
    let c1 = connect_as(&pooled).await;
    let c2 = connect_as(&pooled).await;
    let check = "SELECT pg_catalog.pg_backend_pid(),
                        (SELECT count(*) FROM pg_catalog.pg_prepared_statements),
                        (SELECT count(*) FROM pg_catalog.pg_listening_channels()),
                        (SELECT count(*) FROM pg_catalog.pg_class
                          WHERE relnamespace = pg_catalog.pg_my_temp_schema()),
                        (SELECT count(*) FROM pg_catalog.pg_settings WHERE source = 'session'
                          AND name NOT IN ('client_encoding', 'DateStyle', 'TimeZone',
                                           'standard_conforming_strings', 'application_name')),
                        (SELECT count(*) FROM pg_catalog.pg_locks
                          WHERE locktype = 'advisory' AND pid = pg_catalog.pg_backend_pid()),
                        coalesce(pg_catalog.current_setting('ctxguard.tenant_id', true), '')";
    let mut pids = Vec::new();
    c1.batch_execute("BEGIN").await.unwrap();
    c2.batch_execute("BEGIN").await.unwrap();
    for c in [&c1, &c2] {
        let r = c.query_typed_one(check, &[]).await.unwrap();
        let state: (i64, i64, i64, i64, i64, String) =
            (r.get(1), r.get(2), r.get(3), r.get(4), r.get(5), r.get(6));
        assert_eq!(
            state,
            (0, 0, 0, 0, 0, String::new()),
            "session state on a pooled server connection"
        );
        pids.push(r.get::<_, i32>(0));
    }
    assert_ne!(pids[0], pids[1], "two server connections checked");
    c1.batch_execute("COMMIT").await.unwrap();
    c2.batch_execute("COMMIT").await.unwrap();

    // This run's tenants leave the demo data as they found it (other tests count its rows).
    let admin = admin().await;
    for table in ["demo.invoices", "demo.vendors", "ctxguard.tenant_limits"] {
        admin
            .execute(
                &format!("DELETE FROM {table} WHERE tenant_id IN ($1, $2)"),
                &[&format!("poola-{run}"), &format!("poolb-{run}")],
            )
            .await
            .unwrap();
    }
}
