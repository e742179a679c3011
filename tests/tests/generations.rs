//! Generations follow the database's lifetime: with a tenant's `generation_ttl` of 2 seconds, a
//! chat turn whose tool calls span several lifetimes keeps working (the gateway renews the
//! generation before it lapses), and a generation the database refuses anyway is renewed once and
//! the call retried (`/internal/mcp/execute`). The tenant is one only this file uses.

mod support;

use std::collections::HashSet;
use std::time::Duration;

use serde_json::json;
use support::*;

const TENANT: &str = "ttl-edges";

async fn set_generation_ttl(secs: Option<i32>) {
    admin()
        .await
        .execute(
            "INSERT INTO ctxguard.tenant_limits (tenant_id, generation_ttl) VALUES ($1, $2)
             ON CONFLICT (tenant_id) DO UPDATE SET generation_ttl = EXCLUDED.generation_ttl",
            &[&TENANT, &secs],
        )
        .await
        .unwrap();
}

/// (decision, generation) of every audit row written under this trace id, in order.
async fn audited(trace: &str) -> Vec<(String, Option<uuid::Uuid>)> {
    admin()
        .await
        .query(
            "SELECT decision, generation FROM ctxguard.audit_log WHERE trace_id = $1 ORDER BY id",
            &[&trace],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn generations_follow_the_tenants_lifetime() {
    set_generation_ttl(Some(2)).await;
    let tok = token("erin", TENANT, &["ap_clerk"]);

    // The database says what it enforces: the tenant's lifetime under its context, the settings
    // without one.
    let mut db = admin().await;
    let tx = db.transaction().await.unwrap();
    let without: i32 = tx
        .query_one("SELECT generation_ttl FROM ctxguard.effective_ttls()", &[])
        .await
        .unwrap()
        .get(0);
    tx.execute(
        "SELECT ctxguard.set_context($1, '{\"pageType\": \"vendor_table\"}')",
        &[&tok],
    )
    .await
    .unwrap();
    let with: (i32, i32, i32) = tx
        .query_one(
            "SELECT generation_ttl, approval_ttl, external_call_ttl FROM ctxguard.effective_ttls()",
            &[],
        )
        .await
        .map(|r| (r.get(0), r.get(1), r.get(2)))
        .unwrap();
    tx.rollback().await.unwrap();
    assert_ne!(without, 2, "no context: the setting");
    assert_eq!(with.0, 2, "the tenant's override");
    assert!(with.1 >= 10 && with.2 >= 5, "{with:?}");

    // A model that takes 0.9 s before each of its five tool calls: the turn spans 2+ lifetimes.
    let step = || {
        Step::After(
            Duration::from_millis(900),
            Box::new(Step::Tools(vec![("vendor__list", json!({}))])),
        )
    };
    let mock = Mock::new(vec![
        step(),
        step(),
        step(),
        step(),
        step(),
        Step::Answer("done"),
    ]);
    let gw = openai_gateway(&mock, &[]).await;
    let trace = format!("ttl-chat-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&tok),
        &trace,
        &json!({"message": "list the vendors", "pageContext": {"pageType": "vendor_table"}}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let decisions: Vec<&str> = body["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["decision"].as_str().unwrap())
        .collect();
    assert_eq!(decisions, ["allow"; 5], "{body}");
    let rows = audited(&trace).await;
    assert_eq!(rows.len(), 5);
    let generations: HashSet<_> = rows.iter().filter_map(|(_, g)| *g).collect();
    assert!(
        generations.len() >= 2,
        "the turn's generation was renewed: {rows:?}"
    );
    assert_eq!(
        body["generationId"].as_str().unwrap(),
        rows.last().unwrap().1.unwrap().to_string(),
        "the answer names the generation in force at its end"
    );

    // A generation the database refuses (here: expired behind the gateway's back) is renewed
    // once and the call retried; the caller learns the new id.
    let exec = |generation: Option<String>, trace: String| {
        let tok = tok.clone();
        async move {
            post_json(
                gw,
                "/internal/mcp/execute",
                Some(&tok),
                &trace,
                &json!({"tool_name": "vendor.list", "arguments": {}, "trace_id": trace,
                        "pageContext": {"pageType": "vendor_table"}, "generation_id": generation}),
            )
            .await
        }
    };
    let (status, first) = exec(None, format!("ttl-exec-{}", uuid::Uuid::new_v4())).await;
    assert_eq!(status, 200, "{first}");
    let g1 = first["generation_id"].as_str().unwrap().to_string();
    admin()
        .await
        .execute(
            "UPDATE ctxguard.generations SET expires_at = now() - interval '1 second' WHERE id = $1::text::uuid",
            &[&g1],
        )
        .await
        .unwrap();
    let trace = format!("ttl-exec-{}", uuid::Uuid::new_v4());
    let (status, second) = exec(Some(g1.clone()), trace.clone()).await;
    assert_eq!(status, 200, "{second}");
    assert_eq!(second["status"], "ok", "{second}");
    let g2 = second["generation_id"].as_str().unwrap();
    assert_ne!(g2, g1, "a new generation");
    assert_eq!(
        audited(&trace).await,
        [(
            "allow".to_string(),
            Some(uuid::Uuid::parse_str(g2).unwrap())
        )]
    );

    set_generation_ttl(None).await;
}
