//! Seed 004's `[CONTEXT]` block, every id checked by the database: a matter outside the user's
//! tenant, or a document that is not the named matter's own, is refused like a foreign matter (422,
//! nothing run, nothing audited); the valid combination works and is audited with its page.

mod support;

use serde_json::{json, Value};
use support::*;

const SMITH: &str = "25e70284-6124-4a2b-9c89-abc123def456"; // acme, holds smith_agreement
const COYOTE: &str = "6f1c2d9e-1b7a-4c55-9d2e-0a1b2c3d4e5f"; // acme, holds coyote_complaint
const GLOBEX: &str = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"; // another tenant's matter

fn block(matter: &str, document: Option<&str>, question: &str) -> String {
    let mut m =
        format!("[CONTEXT] The user has selected matter \"Some matter\" (matter_id: {matter}).");
    if let Some(d) = document {
        m.push_str(&format!(
            "\nThe user is currently viewing document \"Some document.pdf\" (document_id: {d})."
        ));
    }
    format!("{m}\n{question}")
}

async fn chat(gw: std::net::SocketAddr, message: &str) -> (u16, Value, String) {
    let trace = format!("ctx004-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&token("alice", "acme", &["ap_clerk"])),
        &trace,
        &json!({"message": message}),
    )
    .await;
    (status, body, trace)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_id_of_a_context_block_is_checked_by_the_database() {
    let gw = gateway(&[]).await;
    let refused = [
        (
            "another tenant's matter with one of the user's documents",
            block(GLOBEX, Some("smith_agreement"), "summarize it"),
        ),
        (
            "the user's matter with a document of another of their matters",
            block(COYOTE, Some("smith_agreement"), "summarize it"),
        ),
        (
            "another tenant's matter alone",
            block(GLOBEX, None, "summarize the matter"),
        ),
    ];
    for (what, message) in refused {
        let (status, body, trace) = chat(gw, &message).await;
        assert_eq!(status, 422, "{what}: {body}");
        assert_eq!(body["error"]["code"], "INVALID_PAGE_CONTEXT", "{what}");
        assert_eq!(
            body["error"]["message"], "invalid page context: entity not found",
            "{what}: the same refusal as a foreign matter"
        );
        assert!(
            audit(&trace).await.is_empty(),
            "{what}: the page was never set"
        );
    }

    // A block that starts like seed 004's but does not parse: refused before any database work,
    // with the reason, never treated as a plain question.
    let malformed = [
        (
            "a matter id that is no UUID",
            "[CONTEXT] The user has selected matter \"Some matter\" (matter_id: 25e70284-6124-4a2b-9c89-abc123def45Z).\nsummarize",
            "malformed [CONTEXT] message",
        ),
        (
            "a UUID-shaped id that is not one",
            "[CONTEXT] The user has selected matter \"Some matter\" (matter_id: ------------------------------------).\nsummarize",
            "matter_id must be a UUID",
        ),
    ];
    for (what, message, reason) in malformed {
        let (status, body, trace) = chat(gw, message).await;
        assert_eq!(
            (
                status,
                body["error"]["code"].as_str(),
                body["error"]["message"].as_str()
            ),
            (400, Some("BAD_REQUEST"), Some(reason)),
            "{what}: {body}"
        );
        assert!(audit(&trace).await.is_empty(), "{what}: nothing ran");
    }

    // The valid combination: the document's own matter, in the user's tenant.
    let (status, body, trace) = chat(
        gw,
        &block(SMITH, Some("smith_agreement"), "what is this document?"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["pageType"], "document_viewer");
    let rows = admin()
        .await
        .query(
            "SELECT page_type, entity_type, entity_id, decision FROM ctxguard.audit_log WHERE trace_id = $1",
            &[&trace],
        )
        .await
        .unwrap();
    assert!(!rows.is_empty(), "the turn's calls are audited: {body}");
    for r in &rows {
        let (page, kind, id): (String, String, String) = (r.get(0), r.get(1), r.get(2));
        assert_eq!(
            (page.as_str(), kind.as_str(), id.as_str()),
            ("document_viewer", "document", "smith_agreement")
        );
    }
    // The turn is stored with the page it ran on, matter included.
    let page: Value = admin()
        .await
        .query_one(
            "SELECT page FROM ctxguard.conversation_turns WHERE conversation_id = $1",
            &[&body["conversationId"].as_str().unwrap()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        page["entity"],
        json!({"type": "document", "id": "smith_agreement", "within": {"type": "matter", "id": SMITH}})
    );
}
