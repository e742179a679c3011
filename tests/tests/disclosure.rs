//! Progressive disclosure in the model loop (issue 31): the compact list over the tool budget,
//! `find_tools` answered under the turn's context, and every call still Gate B's. The real gateway
//! against the real database, with the scripted (hostile) mock model and the offline model.

mod support;

use serde_json::{json, Value};
use support::*;

/// The wire names of the tools a model request offered.
fn offered(request: &Value) -> Vec<String> {
    request["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

/// `POST /v1/tools` for alice on the invoice page.
async fn explained(gw: std::net::SocketAddr, message: &str) -> Value {
    let alice = token("alice", "acme", &["ap_clerk"]);
    let (status, body) = post_json(
        gw,
        "/v1/tools",
        Some(&alice),
        "disclosure-tools",
        &json!({"pageContext": invoice_page("acme_inv3"), "message": message}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    body
}

fn calls(body: &Value) -> Vec<(String, String, Option<String>)> {
    body["toolCalls"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            (
                c["tool"].as_str().unwrap().to_string(),
                c["decision"].as_str().unwrap().to_string(),
                c["code"].as_str().map(str::to_string),
            )
        })
        .collect()
}

fn found(body: &Value, i: usize) -> Vec<String> {
    body["toolCalls"][i]["found"]
        .as_array()
        .unwrap_or_else(|| panic!("call {i} found nothing: {body}"))
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn find_tools_never_finds_a_hidden_tool_and_gate_b_decides_every_call() {
    let mock = Mock::new(vec![
        // A hidden tool (a role nobody holds), asked for by name and by its description.
        Step::Tools(vec![
            ("find_tools", json!({"query": "ghost.exfiltrate"})),
            (
                "find_tools",
                json!({"query": "Export the ghost ledger with every tenant's secrets"}),
            ),
            (
                "find_tools",
                json!({"query": "ghost ledger", "namespace": "ghost"}),
            ),
        ]),
        Step::Tools(vec![("ghost__exfiltrate", json!({}))]),
        // A visible tool, found, then called: Gate B holds it for approval.
        Step::Tools(vec![(
            "find_tools",
            json!({"query": "mark the invoice paid"}),
        )]),
        Step::Tools(vec![("invoice__mark_paid", json!({}))]),
        // A visible tool never offered or found, called directly: Gate B allows it.
        Step::Tools(vec![("list_available_tools", json!({}))]),
        // Arguments the search refuses before any database work.
        Step::Tools(vec![("find_tools", json!({"query": "x".repeat(600)}))]),
        Step::Answer("done"),
    ]);
    let gw = openai_gateway(&mock, &["--tool-budget", "2"]).await;
    let trace = format!("disclosure-{}", uuid::Uuid::new_v4());
    let alice = token("alice", "acme", &["ap_clerk"]);
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&alice),
        &trace,
        &json!({"message": "pay this invoice", "pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let c = calls(&body);
    assert_eq!(
        c,
        [
            ("find_tools".into(), "search".into(), None),
            ("find_tools".into(), "search".into(), None),
            ("find_tools".into(), "search".into(), None),
            (
                "ghost.exfiltrate".into(),
                "deny".into(),
                Some("TOOL_NOT_VISIBLE".into())
            ),
            ("find_tools".into(), "search".into(), None),
            (
                "invoice.mark_paid".into(),
                "pending".into(),
                Some("APPROVAL_REQUIRED".into())
            ),
            ("list_available_tools".into(), "allow".into(), None),
            (
                "find_tools".into(),
                "deny".into(),
                Some("INVALID_ARGUMENT".into())
            ),
        ],
        "{body}"
    );
    for i in 0..3 {
        assert!(
            !found(&body, i).iter().any(|t| t.starts_with("ghost")),
            "{body}"
        );
    }
    assert!(
        found(&body, 4).contains(&"invoice.mark_paid".to_string()),
        "{body}"
    );
    // The database judged the calls (the searches are not Gate B's and write no audit row).
    let rows = audit(&trace).await;
    let codes: Vec<String> = rows
        .iter()
        .map(|(d, c, _)| c.clone().unwrap_or_else(|| d.clone()))
        .collect();
    assert_eq!(
        codes,
        ["TOOL_NOT_VISIBLE", "APPROVAL_REQUIRED", "allow"],
        "{rows:?}"
    );
    // The model saw the compact list (one page tool and find_tools), then what it found.
    let requests = mock.requests.lock().unwrap().clone();
    let first = offered(&requests[0]);
    assert_eq!(first.len(), 2, "{first:?}");
    assert_eq!(first[1], "find_tools");
    let find = requests[0]["tools"][1]["function"].clone();
    let description = find["description"].as_str().unwrap();
    assert!(
        description.contains("invoice (") && !description.contains("ghost"),
        "{description}"
    );
    // Request i answers step i: the search of step 3 is in the list of request 3 on.
    assert!(
        !offered(&requests[2]).contains(&"invoice__mark_paid".to_string()),
        "{:?}",
        offered(&requests[2])
    );
    assert!(
        offered(&requests[3]).contains(&"invoice__mark_paid".to_string()),
        "found tools join the next step's list: {:?}",
        offered(&requests[3])
    );
    assert!(!offered(&requests[5]).iter().any(|t| t.starts_with("ghost")));
    // The search's answer names what was found, as the model calls it.
    let told = requests[3]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .find(|m| m["role"] == "tool")
        .unwrap()["content"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(told.contains("invoice__mark_paid"), "{told}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_goes_compact_one_tool_or_one_token_over_the_budget() {
    let probe = gateway(&[]).await;
    let budget = explained(probe, "summarize this invoice").await["budget"].clone();
    let n = budget["visibleTools"].as_u64().unwrap();
    let tokens = budget["estimatedTokens"].as_u64().unwrap();
    assert!(n >= 3 && tokens > 100, "{budget}");
    for (limit, compact) in [
        (n.to_string(), false),
        ((n - 1).to_string(), true),
        (format!("{tokens}t"), false),
        (format!("{}t", tokens - 1), true),
    ] {
        let mock = Mock::new(vec![Step::Answer("ok")]);
        let gw = openai_gateway(&mock, &["--tool-budget", &limit]).await;
        let alice = token("alice", "acme", &["ap_clerk"]);
        let (status, body) = post_json(
            gw,
            "/v1/chat",
            Some(&alice),
            "disclosure-switch",
            &json!({"message": "summarize this invoice", "pageContext": invoice_page("acme_inv3")}),
        )
        .await;
        assert_eq!(status, 200, "{body}");
        let list = offered(&mock.requests.lock().unwrap()[0]);
        assert_eq!(
            list.contains(&"find_tools".to_string()),
            compact,
            "{limit}: {list:?}"
        );
        let visible: Vec<String> = body["visibleTools"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().replace('.', "__"))
            .collect();
        assert_eq!(visible, list, "{limit}: visibleTools is the model's list");
        let tools = explained(gw, "summarize this invoice").await;
        if !compact {
            // Today's list: Gate A's ranked list (the database's `offered`), less the tools of
            // upstream servers that are not up (the fixtures' up.echo never is; other suites may
            // have registered more): every DBA tool of it is in the model's list.
            let upstream: Vec<&str> = tools["namespaces"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|ns| ns["server"].is_string())
                .filter_map(|ns| ns["name"].as_str())
                .collect();
            let ranked: Vec<(String, bool)> = tools["tools"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|t| t["offered"] == true)
                .map(|t| {
                    let ns = t["namespace"].as_str().unwrap_or_default();
                    (
                        t["name"].as_str().unwrap().replace('.', "__"),
                        upstream.contains(&ns),
                    )
                })
                .collect();
            assert_eq!(ranked.len() as u64, n.min(24), "{limit}: {tools}");
            for (name, is_upstream) in &ranked {
                assert!(
                    list.contains(name) || *is_upstream,
                    "{limit}: {name} missing: {list:?}"
                );
            }
            assert!(
                list.iter().all(|l| ranked.iter().any(|(r, _)| r == l)),
                "{limit}: {list:?}"
            );
            assert!(!list.contains(&"up__echo".to_string()), "{list:?}");
        }
        assert_eq!(tools["budget"]["compact"], compact, "{limit}: {tools}");
        assert_eq!(tools["budget"]["limit"], limit.as_str());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_tool_panel_says_where_each_tool_stands() {
    let gw = gateway(&["--tool-budget", "2"]).await;
    let out = explained(gw, "summarize this invoice").await;
    let tools = out["tools"].as_array().unwrap();
    assert_eq!(out["budget"]["compact"], true, "{out}");
    let standing = |name: &str| {
        tools.iter().find(|t| t["name"] == name).unwrap()["budget"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert_eq!(standing("invoice.get"), "offered");
    assert_eq!(standing("list_available_tools"), "find_tools");
    assert_eq!(standing("ghost.exfiltrate"), "hidden");
    assert_eq!(standing("invoice.list"), "hidden");
    for t in tools {
        assert!(t["namespace"].is_string(), "{t}");
        let b = t["budget"].as_str().unwrap();
        assert_eq!(b == "hidden", t["visible"] == false, "{t}");
    }
    let first_other = tools.iter().position(|t| t["budget"] != "offered").unwrap();
    assert!(
        tools[first_other..]
            .iter()
            .all(|t| t["budget"] != "offered"),
        "offered first"
    );
    let namespaces: Vec<&str> = out["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    assert!(
        namespaces.contains(&"invoice") && !namespaces.contains(&"ghost"),
        "{namespaces:?}"
    );
    assert_eq!(
        out["budget"]["offered"],
        json!(["invoice.get", "find_tools"])
    );
    // Within the budget: offered or left out (below CTXGUARD_MAX_TOOLS), never find_tools.
    let gw = gateway(&["--max-tools", "2"]).await;
    let out = explained(gw, "summarize this invoice").await;
    let kinds: std::collections::BTreeSet<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["budget"].as_str().unwrap())
        .collect();
    assert_eq!(
        kinds,
        ["hidden", "left_out", "offered"].into_iter().collect(),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_offline_model_searches_when_no_offered_tool_fits() {
    let gw = gateway(&["--tool-budget", "2"]).await;
    let alice = token("alice", "acme", &["ap_clerk"]);
    let trace = format!("disclosure-offline-{}", uuid::Uuid::new_v4());
    let (status, body) = post_json(
        gw,
        "/v1/chat",
        Some(&alice),
        &trace,
        &json!({"message": "which role and path does a handler run with?", "pageContext": invoice_page("acme_inv3")}),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let c = calls(&body);
    assert_eq!(c[0].0, "find_tools", "{body}");
    assert_eq!(c[0].1, "search", "{body}");
    assert!(
        found(&body, 0).contains(&"test.whoami".to_string()),
        "{body}"
    );
    assert_eq!(c[1], ("test.whoami".into(), "allow".into(), None), "{body}");
    assert_eq!(body["visibleTools"], json!(["invoice.get", "find_tools"]));
    let answer = body["answer"].as_str().unwrap();
    assert!(
        answer.contains("test.whoami") && !answer.contains("find_tools"),
        "{answer}"
    );
}
