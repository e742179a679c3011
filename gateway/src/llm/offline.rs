//! The offline model: deterministic, no network. It picks among the *visible* tools by word overlap
//! between the user's message and each tool's name and description, fills arguments it can read
//! from the message, follows documents a tool result points to, and answers only from tool results.
//! When no offered tool fits and the list is compact, it asks `find_tools` with the message once
//! and picks among what was found. With no matching tool it says so instead of guessing (seed 000
//! §7).

use std::collections::BTreeSet;

use async_trait::async_trait;
use serde_json::{json, Map, Value};

use super::{ChatModel, Completion, LlmError, Message, StreamLimits, ToolCall, ToolSpec};
use crate::catalog::compact::FIND_TOOLS;

pub struct Offline;

/// The pause between the words of a streamed offline answer: long enough for a page to show the
/// answer growing, short enough for tests.
pub const WORD_PAUSE: std::time::Duration = std::time::Duration::from_millis(4);

const STOP: &[&str] = &[
    "a", "an", "the", "of", "on", "in", "to", "for", "and", "or", "is", "are", "do", "does", "i",
    "me", "my", "we", "what", "which", "who", "how", "have", "has", "this", "that", "it", "be",
    "can", "you", "your", "please", "with", "get", "show", "tell", "give", "about", "all", "any",
    "there", "here", "page", "current", "list",
];

fn words(text: &str) -> BTreeSet<String> {
    text.split(|c: char| !c.is_alphanumeric())
        .map(|w| w.to_lowercase())
        .map(|w| {
            if w.len() > 3 && w.ends_with('s') {
                w[..w.len() - 1].to_string()
            } else {
                w
            }
        })
        .filter(|w| w.len() > 1 && !STOP.contains(&w.as_str()))
        .collect()
}

/// Intent words that point at a kind of tool even without naming it.
fn intent_bonus(message: &BTreeSet<String>, tool: &ToolSpec) -> usize {
    let n = &tool.name;
    let summarise = [
        "summarize",
        "summarise",
        "summary",
        "detail",
        "overview",
        "explain",
    ]
    .iter()
    .any(|w| message.contains(*w));
    let listing = message
        .iter()
        .any(|w| ["which", "list", "vendor", "invoice"].contains(&w.as_str()));
    let mut bonus = 0;
    if summarise && (n.ends_with(".get") || n == "read_doc_metadata") {
        bonus += 2;
    }
    if listing && n.ends_with(".list") {
        bonus += 1;
    }
    if message
        .iter()
        .any(|w| ["search", "find", "where", "mention", "mentioned"].contains(&w.as_str()))
        && n == "doc_local_search"
    {
        bonus += 2;
    }
    bonus
}

fn score(message: &BTreeSet<String>, tool: &ToolSpec) -> usize {
    let name_words = words(&tool.name.replace(['.', '_'], " "));
    let desc_words = words(&tool.description);
    2 * message.intersection(&name_words).count()
        + message.intersection(&desc_words).count()
        + intent_bonus(message, tool)
}

/// Fill the arguments the schema asks for from the message; `None` if a required one is unknown.
fn fill_arguments(tool: &ToolSpec, message: &str) -> Option<Value> {
    let props = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
        .cloned()
        .unwrap_or_default();
    let required: Vec<&str> = tool
        .input_schema
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let lower = message.to_lowercase();
    let numbers: Vec<i64> = message
        .split(|c: char| !c.is_ascii_digit())
        .filter_map(|d| d.parse().ok())
        .collect();
    let mut args = Map::new();
    for (key, schema) in &props {
        if let Some(options) = schema.get("enum").and_then(Value::as_array) {
            if let Some(v) = options
                .iter()
                .find(|o| o.as_str().is_some_and(|s| lower.contains(s)))
            {
                args.insert(key.clone(), v.clone());
            }
        } else if key == "query" {
            args.insert(
                key.clone(),
                json!(message.chars().take(200).collect::<String>()),
            );
        } else if key == "page_start" && !numbers.is_empty() {
            args.insert(key.clone(), json!(numbers[0].max(1)));
        } else if key == "page_end" && !numbers.is_empty() {
            args.insert(
                key.clone(),
                json!(numbers.get(1).copied().unwrap_or(numbers[0]).max(1)),
            );
        }
    }
    required
        .iter()
        .all(|r| args.contains_key(*r))
        .then_some(Value::Object(args))
}

/// Follow-up calls a tool result suggests: read a document it lists.
fn follow_up(
    results: &[(String, Value)],
    tools: &[ToolSpec],
    done: &BTreeSet<String>,
) -> Option<ToolCall> {
    tools.iter().find(|t| t.name == "read_doc_pages")?;
    for (_, r) in results {
        let docs = r
            .pointer("/result/documents")
            .or_else(|| r.pointer("/error/details/available_documents"));
        for d in docs.and_then(Value::as_array).into_iter().flatten() {
            let Some(id) = d.get("doc_id").and_then(Value::as_str) else {
                continue;
            };
            let key = format!("read_doc_pages:{id}");
            if d.get("status")
                .and_then(Value::as_str)
                .is_none_or(|s| s == "ready")
                && !done.contains(&key)
            {
                return Some(ToolCall {
                    id: key,
                    name: "read_doc_pages".into(),
                    arguments: json!({"doc_id": id, "page_start": 1, "page_end": 1}),
                });
            }
        }
    }
    None
}

fn scalar(v: &Value) -> Option<String> {
    match v {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// A plain-language rendering of one tool result: only what the tool returned.
fn describe(tool: &str, envelope: &Value) -> String {
    if envelope.get("status").and_then(Value::as_str) != Some("ok") {
        let code = envelope
            .pointer("/error/code")
            .and_then(Value::as_str)
            .unwrap_or("ERROR");
        return format!("- {tool} was refused ({code}).");
    }
    let r = envelope.get("result").cloned().unwrap_or(Value::Null);
    let mut lines = Vec::new();
    if let Value::Object(o) = &r {
        for (k, v) in o {
            match v {
                Value::Array(items) if items.iter().all(Value::is_object) && !items.is_empty() => {
                    let names: Vec<String> = items
                        .iter()
                        .take(20)
                        .map(|i| {
                            ["name", "number", "title", "doc_id", "id", "page"]
                                .iter()
                                .find_map(|f| i.get(*f).and_then(scalar))
                                .unwrap_or_default()
                        })
                        .collect();
                    let texts: Vec<String> = items
                        .iter()
                        .filter_map(|i| {
                            i.get("text")
                                .or_else(|| i.get("snippet"))
                                .and_then(Value::as_str)
                        })
                        .map(|t| t.chars().take(300).collect())
                        .collect();
                    lines.push(format!("{k} ({}): {}", items.len(), names.join(", ")));
                    if !texts.is_empty() {
                        lines.push(format!("text: {}", texts.join(" … ")));
                    }
                }
                Value::Object(inner) => {
                    let parts: Vec<String> = inner
                        .iter()
                        .filter_map(|(ik, iv)| scalar(iv).map(|s| format!("{ik} {s}")))
                        .collect();
                    lines.push(format!("{k}: {}", parts.join(", ")));
                }
                other => {
                    if let Some(s) = scalar(other) {
                        let s: String = s.chars().take(400).collect();
                        lines.push(format!("{k}: {s}"));
                    }
                }
            }
        }
    } else if let Some(s) = scalar(&r) {
        lines.push(s);
    }
    format!("- From {tool}: {}", lines.join("; "))
}

#[async_trait]
impl ChatModel for Offline {
    fn provider(&self) -> &'static str {
        "offline"
    }

    /// The answer word by word (as a hosted model streams it), [`WORD_PAUSE`] apart when a client
    /// reads it as it comes (`limits.listener`); at once otherwise (nobody would see the pace, and
    /// a JSON client would wait for it: ~0.1 s a turn).
    async fn stream(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
        limits: StreamLimits,
        text: tokio::sync::mpsc::Sender<String>,
    ) -> Result<Completion, LlmError> {
        let completion = self.complete(messages, tools).await?;
        for (i, word) in completion.text.split_inclusive(' ').enumerate() {
            if i > 0 && limits.listener {
                tokio::time::sleep(WORD_PAUSE).await;
            }
            if text.send(word.to_string()).await.is_err() {
                break;
            }
        }
        Ok(completion)
    }

    async fn complete(
        &self,
        messages: &[Message],
        tools: &[ToolSpec],
    ) -> Result<Completion, LlmError> {
        let last_user = messages.iter().rposition(|m| matches!(m, Message::User(_)));
        let question = match last_user.map(|i| &messages[i]) {
            Some(Message::User(q)) => q.clone(),
            _ => String::new(),
        };
        let this_turn = &messages[last_user.map_or(0, |i| i + 1)..];
        let mut done = BTreeSet::new();
        let mut results: Vec<(String, Value)> = Vec::new();
        for m in this_turn {
            match m {
                Message::Assistant { tool_calls, .. } => {
                    done.extend(tool_calls.iter().map(|c| c.id.clone()))
                }
                Message::Tool { name, content, .. } => results.push((
                    name.clone(),
                    serde_json::from_str(content).unwrap_or(Value::Null),
                )),
                _ => {}
            }
        }
        // The compact list's search (`catalog/compact.rs`): asked once, with the message, when no offered
        // tool fits; what it finds joins `tools` at the next step.
        let searched = results.iter().any(|(n, _)| n == FIND_TOOLS);
        results.retain(|(n, _)| n != FIND_TOOLS);
        if results.is_empty() {
            let msg_words = words(&question);
            let mut ranked: Vec<(usize, &ToolSpec)> = tools
                .iter()
                .filter(|t| t.name != "list_available_tools" && t.name != FIND_TOOLS)
                .map(|t| (score(&msg_words, t), t))
                .filter(|(s, _)| *s > 0)
                .collect();
            ranked.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| a.1.name.cmp(&b.1.name)));
            let call = ranked.iter().find_map(|(_, t)| {
                fill_arguments(t, &question).map(|arguments| ToolCall {
                    id: format!("{}:1", t.name),
                    name: t.name.clone(),
                    arguments,
                })
            });
            let search =
                (!searched && tools.iter().any(|t| t.name == FIND_TOOLS)).then(|| ToolCall {
                    id: format!("{FIND_TOOLS}:1"),
                    name: FIND_TOOLS.into(),
                    arguments: json!({"query": question.chars().take(200).collect::<String>()}),
                });
            return Ok(match call.or(search) {
                Some(c) => Completion { tool_calls: vec![c], ..Completion::default() },
                None => Completion {
                    text: "I can't answer that from the tools available on this page, and I won't guess. \
                           Try asking about what this page shows."
                        .into(),
                    ..Completion::default()
                },
            });
        }
        if let Some(c) = follow_up(&results, tools, &done) {
            return Ok(Completion {
                tool_calls: vec![c],
                ..Completion::default()
            });
        }
        let mut text = String::from("Here is what the tools on this page returned:\n");
        for (name, r) in &results {
            text.push_str(&describe(name, r));
            text.push('\n');
        }
        Ok(Completion {
            text: text.trim_end().to_string(),
            ..Completion::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, schema: Value) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: schema,
            read_only: true,
            danger: "safe".into(),
            requires_approval: false,
            server: None,
            title: None,
            namespace: None,
            deferred: false,
        }
    }

    fn demo_tools() -> Vec<ToolSpec> {
        vec![
            tool(
                "vendor.list",
                "List the vendors of the current company (name, country).",
                json!({"type": "object", "properties": {"limit": {"type": "integer"}}}),
            ),
            tool(
                "invoice.get",
                "Get the invoice on this page: number, amount, status, dates and vendor.",
                json!({"type": "object", "properties": {}}),
            ),
            tool(
                "read_doc_pages",
                "Read pages page_start..page_end of a document.",
                json!({"type": "object", "properties": {"doc_id": {"type": "string"}, "page_start": {"type": "integer"}, "page_end": {"type": "integer"}}, "required": ["doc_id", "page_start", "page_end"]}),
            ),
        ]
    }

    fn run(messages: Vec<Message>, tools: &[ToolSpec]) -> Completion {
        tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap()
            .block_on(Offline.complete(&messages, tools))
            .unwrap()
    }

    /// The answer's words as `stream` sends them, and how long it took.
    fn streamed(listener: bool) -> (Vec<String>, std::time::Duration) {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .unwrap();
        rt.block_on(async {
            let (tx, mut rx) = tokio::sync::mpsc::channel(1024);
            let limits = StreamLimits {
                listener,
                ..StreamLimits::default()
            };
            let started = std::time::Instant::now();
            // No tool fits: the offline model explains in a sentence of many words.
            Offline
                .stream(
                    &[Message::User("what vendors do I have?".into())],
                    &[],
                    limits,
                    tx,
                )
                .await
                .unwrap();
            let took = started.elapsed();
            let mut words = Vec::new();
            while let Some(w) = rx.recv().await {
                words.push(w);
            }
            (words, took)
        })
    }

    #[test]
    fn the_answer_is_paced_only_for_a_client_reading_it_as_it_comes() {
        let (paced, took_paced) = streamed(true);
        let (at_once, took_at_once) = streamed(false);
        assert_eq!(paced, at_once, "the same words either way");
        assert!(paced.len() > 3, "{paced:?}");
        let pauses = WORD_PAUSE * u32::try_from(paced.len() - 1).unwrap();
        assert!(took_paced >= pauses, "{took_paced:?} < {pauses:?}");
        assert!(
            took_at_once < took_paced,
            "{took_at_once:?} against {took_paced:?}"
        );
    }

    #[test]
    fn seed_000_questions_pick_the_right_tools() {
        let c = run(
            vec![Message::User("what vendors do I have?".into())],
            &demo_tools()[..1],
        );
        assert_eq!(c.tool_calls[0].name, "vendor.list");
        let c = run(
            vec![Message::User("summarize this invoice".into())],
            &demo_tools()[1..],
        );
        assert_eq!(c.tool_calls[0].name, "invoice.get");
    }

    #[test]
    fn follows_linked_documents_then_answers_from_results_only() {
        let tools = demo_tools();
        let call = ToolCall {
            id: "invoice.get:1".into(),
            name: "invoice.get".into(),
            arguments: json!({}),
        };
        let inv = json!({"status": "ok", "result": {"number": "ACME-2026-0003", "amount": "1257.00", "documents": [{"doc_id": "acme_inv3_pdf", "title": "Invoice.pdf"}]}});
        let mut msgs = vec![
            Message::User("summarize this invoice".into()),
            Message::Assistant {
                text: String::new(),
                tool_calls: vec![call],
                provider_items: vec![],
            },
            Message::Tool {
                call_id: "invoice.get:1".into(),
                name: "invoice.get".into(),
                content: inv.to_string(),
            },
        ];
        let c = run(msgs.clone(), &tools);
        assert_eq!(c.tool_calls[0].name, "read_doc_pages");
        assert_eq!(c.tool_calls[0].arguments["doc_id"], "acme_inv3_pdf");
        msgs.push(Message::Assistant {
            text: String::new(),
            tool_calls: c.tool_calls.clone(),
            provider_items: vec![],
        });
        msgs.push(Message::Tool { call_id: c.tool_calls[0].id.clone(), name: "read_doc_pages".into(),
            content: json!({"status": "ok", "result": {"pages": [{"page": 1, "text": "Total 1,257.00 EUR"}]}}).to_string() });
        let c = run(msgs, &tools);
        assert!(c.tool_calls.is_empty());
        assert!(
            c.text.contains("ACME-2026-0003") && c.text.contains("Total 1,257.00 EUR"),
            "{}",
            c.text
        );
    }

    #[test]
    fn searches_once_when_no_offered_tool_fits_then_uses_what_it_found() {
        let find = crate::catalog::compact::find_tools_spec(
            &crate::catalog::compact::Overview::default(),
            9,
        );
        let offered = vec![demo_tools()[1].clone(), find.clone()];
        let question = "the country of each supplier";
        let c = run(vec![Message::User(question.into())], &offered);
        assert_eq!(c.tool_calls[0].name, FIND_TOOLS);
        assert_eq!(c.tool_calls[0].arguments, json!({"query": question}));
        let searched = vec![
            Message::User(question.into()),
            Message::Assistant {
                text: String::new(),
                tool_calls: c.tool_calls.clone(),
                provider_items: vec![],
            },
            Message::Tool {
                call_id: c.tool_calls[0].id.clone(),
                name: FIND_TOOLS.into(),
                content: json!({"status": "ok", "result": {"tools": [{"name": "vendor__list"}]}})
                    .to_string(),
            },
        ];
        // The found tool joined the list: it is called.
        let mut with_found = offered.clone();
        with_found.push(demo_tools()[0].clone());
        let c = run(searched.clone(), &with_found);
        assert_eq!(c.tool_calls[0].name, "vendor.list");
        // Nothing found: no second search, no guess.
        let c = run(searched, &offered);
        assert!(
            c.tool_calls.is_empty() && c.text.contains("can't answer"),
            "{}",
            c.text
        );
    }

    #[test]
    fn refuses_without_a_fitting_tool() {
        let c = run(
            vec![Message::User("what is the weather in Paris?".into())],
            &demo_tools()[..2],
        );
        assert!(c.tool_calls.is_empty() && c.text.contains("can't answer"));
    }
}
