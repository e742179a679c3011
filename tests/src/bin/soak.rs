//! `soak`: the load generator of `bench/soak.sh`. For a bounded time, `--workers` clients each
//! loop over a mix of requests spread over the given gateways (loopback only): 50 % tool calls
//! (`POST /internal/mcp/execute`, `invoice.get`), 25 % chat turns (`POST /v1/chat`, offline
//! provider), 25 % MCP (`tools/list` or `tools/call` on a session opened through one gateway and
//! used through any). Tokens come from `SOAK_TOKENS` (comma-separated, one per tenant: acme,
//! globex). Prints one JSON object: requests, throughput, p50/p99 per kind (ms), errors by kind.
//!
//! Usage: `soak --gateways 127.0.0.1:A,127.0.0.1:B --seconds 120 --workers 16`

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

#[derive(Default)]
struct Tally {
    lat: HashMap<&'static str, Vec<f64>>,
    errors: HashMap<String, u64>,
}

fn sse_answer(body: &str) -> Option<Value> {
    serde_json::from_str::<Value>(body).ok().or_else(|| {
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("id").is_some())
    })
}

async fn mcp(
    http: &reqwest::Client,
    gw: &str,
    tok: &str,
    sid: Option<&str>,
    msg: Value,
) -> Result<(Option<String>, Option<Value>), String> {
    let mut r = http
        .post(format!("http://{gw}/mcp"))
        .bearer_auth(tok)
        .header("accept", "application/json, text/event-stream")
        .json(&msg);
    if let Some(s) = sid {
        r = r
            .header("mcp-session-id", s)
            .header("mcp-protocol-version", "2025-06-18");
    }
    let resp = r.send().await.map_err(|_| "connect".to_string())?;
    let status = resp.status().as_u16();
    let sid = resp
        .headers()
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body = resp.text().await.map_err(|_| "read".to_string())?;
    if !(200..300).contains(&status) {
        return Err(format!("http {status}"));
    }
    Ok((sid, sse_answer(&body)))
}

async fn worker(w: usize, gateways: Vec<String>, tokens: Vec<String>, until: Instant) -> Tally {
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap();
    let mut t = Tally::default();
    let tenant = w % tokens.len();
    let tok = &tokens[tenant];
    let prefix = if tenant == 0 { "acme" } else { "glx" };
    let page = json!({"pageType": "invoice_detail", "entity": {"type": "invoice", "id": format!("{prefix}_inv3")}});
    // The MCP session: opened through one gateway, its page set by the header.
    let mut session: Option<String> = None;
    // The tool calls' generation, reused (renewed by the gateway when it lapses).
    let mut generation: Option<String> = None;
    let mut i: usize = 0;
    while Instant::now() < until {
        let gw = &gateways[(w + i) % gateways.len()];
        let started = Instant::now();
        let (kind, outcome): (&'static str, Result<(), String>) = match i % 4 {
            0 | 2 => {
                let r = http
                    .post(format!("http://{gw}/internal/mcp/execute"))
                    .bearer_auth(tok)
                    .json(
                        &json!({"tool_name": "invoice.get", "arguments": {}, "pageContext": page,
                                  "generation_id": generation}),
                    )
                    .send()
                    .await;
                let o = match r {
                    Ok(resp) => {
                        let status = resp.status().as_u16();
                        let body: Value = resp.json().await.unwrap_or(Value::Null);
                        generation = body["generation_id"].as_str().map(str::to_string);
                        if status == 200
                            && body["status"] == "ok"
                            && body["result"]["id"] == format!("{prefix}_inv3")
                        {
                            Ok(())
                        } else {
                            Err(format!(
                                "{status} {}",
                                body["error"]["code"].as_str().unwrap_or("")
                            ))
                        }
                    }
                    Err(_) => Err("connect".into()),
                };
                ("tool", o)
            }
            1 => {
                let r = http
                    .post(format!("http://{gw}/v1/chat"))
                    .bearer_auth(tok)
                    .json(&json!({"message": "what is this invoice?", "pageContext": page}))
                    .send()
                    .await;
                let o = match r {
                    Ok(resp) if resp.status().as_u16() == 200 => Ok(()),
                    Ok(resp) => Err(format!("{}", resp.status().as_u16())),
                    Err(_) => Err("connect".into()),
                };
                ("chat", o)
            }
            _ => {
                let o = async {
                    let sid = match &session {
                        Some(s) => s.clone(),
                        None => {
                            let (sid, _) = mcp(&http, gw, tok, None, json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                                "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "soak", "version": "1"}}})).await?;
                            let sid = sid.ok_or("no session")?;
                            mcp(&http, gw, tok, Some(&sid), json!({"jsonrpc": "2.0", "method": "notifications/initialized"})).await?;
                            session = Some(sid.clone());
                            sid
                        }
                    };
                    let msg = if (i / 4).is_multiple_of(2) {
                        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/list"})
                    } else {
                        json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call", "params": {"name": "invoice__get", "arguments": {}}})
                    };
                    // The page rides on every request (the user's page, shared by all gateways).
                    let resp = http
                        .post(format!("http://{gw}/mcp"))
                        .bearer_auth(tok)
                        .header("accept", "application/json, text/event-stream")
                        .header("mcp-session-id", &sid)
                        .header("mcp-protocol-version", "2025-06-18")
                        .header("x-ctxguard-page", page.to_string())
                        .json(&msg)
                        .send()
                        .await
                        .map_err(|_| "connect".to_string())?;
                    let status = resp.status().as_u16();
                    let body = resp.text().await.map_err(|_| "read".to_string())?;
                    if status == 404 {
                        session = None;
                    }
                    match sse_answer(&body) {
                        Some(v) if status == 200 && v.get("result").is_some() && v["result"]["isError"] != true => Ok(()),
                        _ => Err(format!("mcp {status}")),
                    }
                }
                .await;
                ("mcp", o)
            }
        };
        let ms = started.elapsed().as_secs_f64() * 1000.0;
        match outcome {
            Ok(()) => t.lat.entry(kind).or_default().push(ms),
            Err(e) => *t.errors.entry(format!("{kind}: {e}")).or_default() += 1,
        }
        i += 1;
    }
    t
}

fn pct(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    (v[i] * 100.0).round() / 100.0
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let gateways: Vec<String> = arg("--gateways", "127.0.0.1:8088")
        .split(',')
        .map(str::to_string)
        .collect();
    for g in &gateways {
        assert!(
            g.starts_with("127.") || g.starts_with("localhost"),
            "loopback only: {g}"
        );
    }
    let seconds: u64 = arg("--seconds", "60").parse().unwrap();
    let workers: usize = arg("--workers", "16").parse().unwrap();
    let tokens: Vec<String> = std::env::var("SOAK_TOKENS")
        .expect("SOAK_TOKENS")
        .split(',')
        .map(str::to_string)
        .collect();
    let started = Instant::now();
    let until = started + Duration::from_secs(seconds);
    let tallies = futures::future::join_all(
        (0..workers).map(|w| tokio::spawn(worker(w, gateways.clone(), tokens.clone(), until))),
    )
    .await;
    let elapsed = started.elapsed().as_secs_f64();
    let mut all = Tally::default();
    for t in tallies.into_iter().map(Result::unwrap) {
        for (k, v) in t.lat {
            all.lat.entry(k).or_default().extend(v);
        }
        for (k, n) in t.errors {
            *all.errors.entry(k).or_default() += n;
        }
    }
    let mut kinds = serde_json::Map::new();
    let mut total = 0usize;
    let mut every: Vec<f64> = Vec::new();
    for (k, v) in all.lat.iter_mut() {
        total += v.len();
        every.extend(v.iter());
        kinds.insert(
            (*k).to_string(),
            json!({"ok": v.len(), "per_s": (v.len() as f64 / elapsed * 10.0).round() / 10.0,
                   "p50_ms": pct(v, 0.5), "p99_ms": pct(v, 0.99)}),
        );
    }
    let errors: u64 = all.errors.values().sum();
    println!(
        "{}",
        json!({"seconds": (elapsed * 10.0).round() / 10.0, "workers": workers, "ok": total, "errors": errors,
               "per_s": (total as f64 / elapsed * 10.0).round() / 10.0,
               "p50_ms": pct(&mut every, 0.5), "p99_ms": pct(&mut every, 0.99),
               "kinds": kinds, "error_kinds": all.errors})
    );
}
