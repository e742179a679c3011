//! The reachability benchmark's ranking step (bench/reachability.sh runs it): for each request,
//! whether its tool is offered at once (today's top-k cut), and whether tool search finds it in
//! its top 5, lexical only and with the semantic ranker; and, as the gateway's model loop and MCP
//! server answer with the default configuration (`CTXGUARD_TOOL_BUDGET=30`), whether it is in the
//! compact list or among what `find_tools` returns (`compact::offer`, `compact::candidates`,
//! `Ranker::find_for_query`: the gateway's own code).
//!
//! The requests are split in two halves by their tool's kind (a hash of the tool name less its
//! record kind for the DBA's per-kind tools, `invoice.history` and `vendor.history` being one kind;
//! of the whole name for app-wide and upstream tools): half A tuned the ranker's thresholds
//! (gateway/src/catalog/disclosure/fusion.rs), half B was held out. Both are reported.
//!
//! `reachability CATALOG.json REQUESTS.jsonl LEXICAL.tsv [MODEL_DIR]`: the catalog as
//! bench/reachability_catalog.py writes it, the requests (with `paraphrase` marked), and each
//! (request, visible tool) pair's lexical score as the database computes it (`ts_rank` over
//! `ctxguard.tools.search`, as `visible_tools(query, top_k)` ranks). Prints a Markdown table.

use std::collections::HashMap;
use std::time::Instant;

use ctxguard_core::ranking::{self, Candidate, Placement, Tier};
use ctxguard_gateway::catalog::compact::{self, FindArgs, Namespace, Overview};
use ctxguard_gateway::catalog::disclosure::{Embeddings, Ranker};
use ctxguard_gateway::catalog::ToolSpec;
use ctxguard_gateway::config::budget::Budget;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// The gateway's default `CTXGUARD_MAX_TOOLS` (the list offered at once).
const TOP_K: usize = 24;
/// What tool search answers.
const FIND_K: usize = 5;
/// The database's default `ctxguard.max_offered_tools_per_server`.
const PER_SERVER: usize = 8;

/// The request's half: 0 (A, tuning) or 1 (B, held out), by a hash of its tool's kind.
fn half(tool: &str) -> usize {
    let kind = match tool.split_once('.') {
        Some(("app" | "chat" | "drive", _)) => tool,
        Some((_, rest)) => rest,
        None => tool,
    };
    usize::from(Sha256::digest(kind.as_bytes())[0] & 1)
}

fn read(path: &str) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.len() < 3 {
        eprintln!("usage: reachability CATALOG.json REQUESTS.jsonl LEXICAL.tsv [MODEL_DIR]");
        std::process::exit(2);
    }
    let catalog: Value = serde_json::from_str(&read(&args[0])).expect("catalog JSON");
    let requests: Vec<Value> = read(&args[1])
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).expect("request JSON"))
        .collect();
    let mut lexical: HashMap<(usize, String), f32> = HashMap::new();
    for line in read(&args[2]).lines() {
        let mut f = line.split('\t');
        let (Some(i), Some(t), Some(s)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        lexical.insert(
            (i.parse().expect("index"), t.to_string()),
            s.parse().expect("score"),
        );
    }
    let tools: HashMap<String, &Value> = catalog["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .map(|t| (t["name"].as_str().expect("name").to_string(), t))
        .collect();
    let spec = |name: &str| -> ToolSpec {
        let t = tools[name];
        let props: serde_json::Map<String, Value> = t["params"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|p| (p.to_string(), json!({"type": "string"})))
            .collect();
        ToolSpec {
            name: name.to_string(),
            description: t["description"].as_str().unwrap_or_default().to_string(),
            input_schema: json!({"type": "object", "properties": props}),
            read_only: true,
            danger: "low".into(),
            requires_approval: false,
            server: t["server"].as_str().map(str::to_string),
            title: None,
            namespace: None,
            deferred: false,
        }
    };
    let lexical_only = Ranker::new(Embeddings::None, PER_SERVER);
    let fused = args.get(3).map(|dir| {
        let t = Instant::now();
        let e = ctxguard_embed::Embedder::load(dir.as_ref()).expect("model dir");
        eprintln!("model loaded in {:?}", t.elapsed());
        Ranker::new(Embeddings::Local(std::sync::Arc::new(e)), PER_SERVER)
    });

    // Groups of requests, and for each [cut, lexical, ranker, cut|lexical, cut|ranker].
    let groups = [
        "all requests",
        "half A (tuning)",
        "half B (held out)",
        "paraphrases",
        "the page's entity tools",
        "table and domain tools",
        "app-wide tools",
        "upstream tools",
    ];
    let mut hits = vec![[0usize; 6]; groups.len()];
    let mut totals = vec![0usize; groups.len()];
    let mut query_time = std::time::Duration::ZERO;
    let started = Instant::now();
    for (i, r) in requests.iter().enumerate() {
        let page = &catalog["pages"][r["page_type"].as_str().expect("page_type")];
        let entity = page["entity"].as_str();
        let target = r["tool"].as_str().expect("tool");
        let names: Vec<&str> = page["tools"]
            .as_array()
            .expect("page tools")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let score = |n: &str| lexical.get(&(i, n.to_string())).copied().unwrap_or(0.0);
        // Today: visible_tools(message, 24), tiers as gates.rs assigns them.
        let candidates: Vec<Candidate<'_>> = names
            .iter()
            .map(|&n| {
                let t = tools[n];
                let tier = if t["server"].is_string() {
                    Tier::Upstream
                } else if entity.is_some() && t["entity_type"].as_str() == entity {
                    Tier::Entity
                } else {
                    Tier::Local
                };
                Candidate {
                    name: n,
                    tier,
                    server: t["server"].as_str(),
                    score: score(n),
                }
            })
            .collect();
        let placed = ranking::rank(&candidates, Some(TOP_K), PER_SERVER);
        let in_cut = placed
            .iter()
            .zip(&candidates)
            .any(|(p, c)| c.name == target && matches!(p, Placement::Offered(_)));
        // Tool search: the lexical order (what the database's find_tools ranks by), then the ranker.
        let mut lexical_order: Vec<(&str, f32)> = names
            .iter()
            .map(|&n| (n, score(n)))
            .filter(|(_, s)| *s > 0.0)
            .collect();
        lexical_order.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(b.0)));
        let lexical_order: Vec<String> = lexical_order.iter().map(|(n, _)| n.to_string()).collect();
        let specs: Vec<ToolSpec> = names.iter().map(|n| spec(n)).collect();
        let text = r["text"].as_str().expect("text");
        let lex = lexical_only.rank_blocking(text, &specs, &lexical_order, FIND_K);
        let in_lex = lex.iter().any(|n| n == target);
        let in_fused = fused.as_ref().map(|f| {
            let t = Instant::now();
            let got = f.rank_blocking(text, &specs, &lexical_order, FIND_K);
            query_time += t.elapsed();
            got.iter().any(|n| n == target)
        });
        let fused_hit = in_fused.unwrap_or(false);
        // The gateway: over the budget the compact list (its direct tools) and find_tools' answer;
        // within it, the ranked list cut at CTXGUARD_MAX_TOOLS.
        let in_gateway = fused.as_ref().map(|f| {
            let namespace = |t: &ToolSpec| {
                t.server
                    .clone()
                    .unwrap_or_else(|| t.name.split('.').next().unwrap_or_default().to_string())
            };
            let mut ranked: Vec<(usize, ToolSpec)> = placed
                .iter()
                .zip(&candidates)
                .map(|(p, c)| {
                    let mut t = spec(c.name);
                    t.namespace = Some(namespace(&t));
                    let at = match p {
                        Placement::Offered(at) => *at,
                        _ => usize::MAX,
                    };
                    (at, t)
                })
                .collect();
            ranked.sort_by_key(|(at, _)| *at);
            let ranked: Vec<ToolSpec> = ranked.into_iter().map(|(_, t)| t).collect();
            let mut namespaces: Vec<Namespace> = Vec::new();
            for t in &ranked {
                let ns = t.namespace.clone().unwrap_or_default();
                match namespaces.iter_mut().find(|n| n.name == ns) {
                    Some(n) => {
                        n.tools += 1;
                        n.bytes += compact::spec_bytes(t);
                    }
                    None => namespaces.push(Namespace {
                        name: ns,
                        title: None,
                        description: None,
                        tools: 1,
                        server: t.server.clone(),
                        bytes: compact::spec_bytes(t),
                    }),
                }
            }
            namespaces.sort_by(|a, b| a.name.cmp(&b.name));
            let offer = compact::offer(Budget::Tools(30), ranked.clone(), &Overview { namespaces });
            let direct: Vec<&str> = if offer.compact {
                offer.tools.iter().map(|t| t.name.as_str()).collect()
            } else {
                offer
                    .tools
                    .iter()
                    .take(TOP_K)
                    .map(|t| t.name.as_str())
                    .collect()
            };
            if direct.contains(&target) {
                return true;
            }
            let args = FindArgs {
                query: text.to_string(),
                namespace: None,
            };
            let pool = compact::candidates(ranked, &lexical_order, &args);
            let t = Instant::now();
            let got = if std::env::var_os("REACH_UNFILTERED").is_some() {
                f.rank_blocking(text, &pool, &lexical_order, FIND_K)
            } else {
                f.find_blocking(text, &pool, &lexical_order, FIND_K)
            };
            query_time += t.elapsed();
            got.iter().any(|n| n == target)
        });
        let gateway_hit = in_gateway.unwrap_or(false);
        let h = half(target);
        if !(in_cut || fused_hit) {
            eprintln!(
                "missed ({}): {} [{}] -> {target}",
                ["A", "B"][h],
                text,
                r["page_type"]
            );
        }
        let got = [
            in_cut,
            in_lex,
            fused_hit,
            in_cut || in_lex,
            in_cut || fused_hit,
            gateway_hit,
        ];
        let t = tools[target];
        let upstream = t["server"].is_string();
        let app_wide = target.starts_with("app.");
        let entity_tool = !upstream && entity.is_some() && t["entity_type"].as_str() == entity;
        let member = [
            true,
            h == 0,
            h == 1,
            r["paraphrase"].as_bool().unwrap_or(false),
            entity_tool,
            !upstream && !app_wide && !entity_tool,
            app_wide,
            upstream,
        ];
        for (g, &m) in member.iter().enumerate() {
            if m {
                totals[g] += 1;
                for (k, &hit) in got.iter().enumerate() {
                    hits[g][k] += usize::from(hit);
                }
            }
        }
    }
    let pct = |h: usize, n: usize| {
        if n == 0 {
            "-".to_string()
        } else {
            format!("{:.1} % ({h}/{n})", 100.0 * h as f64 / n as f64)
        }
    };
    let have_model = fused.is_some();
    let columns = [0, 1, 2, 3];
    println!("| ranker | {} |", columns.map(|g| groups[g]).join(" | "));
    println!("|---|---|---|---|---|");
    let rows = [
        (
            "today's cut: offered at once (visible_tools(message, 24))",
            0,
            true,
        ),
        ("tool search, lexical only: top 5", 1, true),
        ("tool search, semantic ranker: top 5", 2, have_model),
        ("offered at once or lexical top 5", 3, true),
        ("offered at once or semantic ranker top 5", 4, have_model),
        (
            "**the gateway (default budget 30): in the compact list or in find_tools' answer**",
            5,
            have_model,
        ),
    ];
    for (label, k, shown) in rows {
        if shown {
            let cells: Vec<String> = columns
                .iter()
                .map(|&g| pct(hits[g][k], totals[g]))
                .collect();
            println!("| {label} | {} |", cells.join(" | "));
        }
    }
    println!();
    println!("| the tool asked for | offered at once | ... or lexical top 5 | ... or semantic ranker top 5 | the gateway |");
    println!("|---|---|---|---|---|");
    for g in 4..groups.len() {
        let model = |k: usize| {
            if have_model {
                pct(hits[g][k], totals[g])
            } else {
                "-".into()
            }
        };
        println!(
            "| {} | {} | {} | {} | {} |",
            groups[g],
            pct(hits[g][0], totals[g]),
            pct(hits[g][3], totals[g]),
            model(4),
            model(5)
        );
    }
    if have_model {
        eprintln!(
            "semantic ranking: {:?} in all ({:?} per request, tool vectors cached after first use); run {:?}",
            query_time,
            query_time / requests.len().max(1) as u32,
            started.elapsed()
        );
    }
}
