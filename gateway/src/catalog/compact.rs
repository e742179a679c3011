//! Progressive disclosure for our model loop and MCP clients (issue 31): when the tools Gate A
//! shows on a page exceed the tool budget (`CTXGUARD_TOOL_BUDGET`), the model (or MCP client) is
//! given a compact list instead of every definition:
//!
//! 1. the page's own tools, directly: the best-ranked prefix of the database's tiered order
//!    (`ctxguard_core::ranking`: tools bound to the page's entity first, then the DBA's other tools
//!    by relevance to the message), never an upstream tool: at most half the budget, and beyond
//!    the first tool at most a tenth of the full list's estimated tokens;
//! 2. `find_tools` (`{query, namespace?}`), whose description lists the page's namespaces
//!    (`ctxguard.visible_namespaces`: each with its tool count and description): one entry for all
//!    namespaces, so the list's size grows with the namespaces, not with the tools.
//!
//! `find_tools` is answered under the caller's context from the page's Gate-A-visible tools and
//! `ctxguard.find_tools`' lexical order ([`candidates`]), ordered by the tool search ranker of
//! `disclosure/` ([`found`]): only tools the database returned as visible are ever found. Nothing here decides
//! what may run: a call to any tool, offered or not, goes to Gate B.
//!
//! Everything in this file is pure (no database, no network): the database's answers come in, the
//! lists go out.

use serde_json::{json, Value};

use crate::catalog::{wire_name, ToolSpec};
use crate::config::budget::Budget;

/// The gateway's own search tool, in the compact list (its wire name too).
pub const FIND_TOOLS: &str = "find_tools";
/// Tools one `find_tools` call returns at most.
pub const FIND_TOP_K: i32 = 5;
/// Candidates asked of the database when the search is narrowed to a namespace (then filtered
/// here): `ctxguard.find_tools`' largest `top_k`.
pub const FIND_NAMESPACE_CANDIDATES: i32 = 100;
/// Longest `find_tools` query the gateway sends (the database takes 4096 bytes).
pub const MAX_QUERY_BYTES: usize = 512;
/// A namespace's description in `find_tools`' description is cut to this many characters.
pub const NAMESPACE_DESCRIPTION_CHARS: usize = 100;
/// Namespaces listed by name in `find_tools`' description; the rest are counted.
pub const LISTED_NAMESPACES: usize = 40;
/// The token estimate: bytes of a definition per token (tool definitions are JSON and English;
/// o200k_base gives 3.5-4.5 on the bench catalog, see BENCHMARKS.md).
pub const BYTES_PER_TOKEN: usize = 4;
/// A definition's bytes beyond its name, description and schema (the keys and wrapper a provider
/// adds around them), for the estimate.
pub const FRAMING_BYTES: usize = 48;

/// One namespace of the page (`ctxguard.visible_namespaces`), with the bytes of its visible tools'
/// definitions (name, description, schema as the database renders them).
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    pub name: String,
    pub title: Option<String>,
    pub description: Option<String>,
    pub tools: usize,
    pub server: Option<String>,
    pub bytes: usize,
}

/// The page's namespaces, in name order: what the budget is judged on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Overview {
    pub namespaces: Vec<Namespace>,
}

/// Estimated tokens of `tools` definitions of `bytes` bytes in all.
pub fn estimate_tokens(bytes: usize, tools: usize) -> usize {
    (bytes + FRAMING_BYTES * tools).div_ceil(BYTES_PER_TOKEN)
}

/// Bytes of one definition as [`estimate_tokens`] counts them.
pub fn spec_bytes(t: &ToolSpec) -> usize {
    t.name.len()
        + t.description.len()
        + serde_json::to_string(&t.input_schema).map_or(0, |s| s.len())
}

impl Overview {
    /// Visible tools on the page.
    pub fn tools(&self) -> usize {
        self.namespaces.iter().map(|n| n.tools).sum()
    }

    /// Estimated tokens of every visible tool's definition (the full list).
    pub fn tokens(&self) -> usize {
        estimate_tokens(self.namespaces.iter().map(|n| n.bytes).sum(), self.tools())
    }
}

impl Budget {
    /// Whether the page's visible tools are over the budget (then the list is compact).
    pub fn exceeded_by(&self, overview: &Overview) -> bool {
        match *self {
            Budget::Tools(n) => overview.tools() > n,
            Budget::Tokens(t) => overview.tokens() > t,
        }
    }

    /// What the compact list offers directly at most: tools or estimated tokens (half the budget:
    /// set on the reachability benchmark's tuning half, where a fifth left a tenth of the requests
    /// for the page entity's own tools unreached), and estimated tokens beyond its first tool (a
    /// tenth of the full list's, which keeps the list small on large pages).
    fn direct_caps(&self, overview: &Overview) -> (usize, usize, usize) {
        let tenth = overview.tokens() / 10;
        match *self {
            Budget::Tools(n) => ((n / 2).max(1), usize::MAX, tenth),
            Budget::Tokens(t) => (usize::MAX, t / 2, tenth),
        }
    }
}

/// What a model or MCP client is given for a page.
#[derive(Debug, Clone, Default)]
pub struct Offer {
    /// Over the budget: `tools` is the compact list.
    pub compact: bool,
    /// The tools offered: the full (ranked, cut) list, or the page's own tools and `find_tools`.
    pub tools: Vec<ToolSpec>,
    /// Compact only: the other tools read for the page, marked `deferred` (for providers with
    /// native tool search; never given to any other).
    pub deferred: Vec<ToolSpec>,
}

impl Offer {
    /// Whether `name` (catalog name) is offered directly.
    pub fn offers(&self, name: &str) -> bool {
        self.tools.iter().any(|t| t.name == name)
    }
}

/// The list for a page: `ranked` (Gate A's tools as the database ordered them for the message:
/// entity-bound first, then the DBA's other tools, then upstream ones) as it is when the page is
/// within `budget`, else the compact list. Deterministic: the same input gives the same list.
pub fn offer(budget: Budget, ranked: Vec<ToolSpec>, overview: &Overview) -> Offer {
    if !budget.exceeded_by(overview) {
        return Offer {
            compact: false,
            tools: ranked,
            deferred: Vec::new(),
        };
    }
    let (max_tools, max_tokens, beyond_first) = budget.direct_caps(overview);
    let mut direct = Vec::new();
    let mut deferred = Vec::new();
    let mut used = 0;
    let mut open = true;
    for mut t in ranked {
        // The best-ranked prefix of the DBA's tools (upstream ones are found, never offered here;
        // a catalog tool named like the search tool is shadowed by it).
        if open && t.server.is_none() && t.name != FIND_TOOLS {
            let cost = estimate_tokens(spec_bytes(&t), 1);
            if direct.len() < max_tools
                && used + cost <= max_tokens
                && (direct.is_empty() || used + cost <= beyond_first)
            {
                used += cost;
                direct.push(t);
                continue;
            }
            open = false;
        }
        t.deferred = true;
        deferred.push(t);
    }
    let hidden = overview.tools().saturating_sub(direct.len());
    direct.push(find_tools_spec(overview, hidden));
    Offer {
        compact: true,
        tools: direct,
        deferred,
    }
}

/// The longest prefix of `s` of at most `max` characters, with `…` when cut.
fn cut_chars(s: &str, max: usize) -> String {
    let s = s.trim();
    match s.char_indices().nth(max) {
        None => s.to_string(),
        Some((end, _)) => format!("{}…", s[..end].trim_end()),
    }
}

/// `find_tools` as offered: its description names the page's namespaces with their tool counts
/// and descriptions (the DBA's text: `register_namespace`, or an upstream server's description in
/// the registry).
pub fn find_tools_spec(overview: &Overview, hidden: usize) -> ToolSpec {
    let listed: Vec<String> = overview
        .namespaces
        .iter()
        .take(LISTED_NAMESPACES)
        .map(|n| {
            let about = n
                .description
                .as_deref()
                .or(n.title.as_deref())
                .map(|d| format!(": {}", cut_chars(d, NAMESPACE_DESCRIPTION_CHARS)))
                .unwrap_or_default();
            format!("{} ({}){about}", n.name, n.tools)
        })
        .collect();
    let more = overview.namespaces.len().saturating_sub(LISTED_NAMESPACES);
    let mut namespaces = listed.join("; ");
    if more > 0 {
        namespaces.push_str(&format!("; and {more} more namespaces"));
    }
    ToolSpec {
        name: FIND_TOOLS.into(),
        description: format!(
            "Find more of this page's tools ({hidden} are not listed). Give `query`: words of what \
             you need, and optionally `namespace` to search only there (a server's tools come \
             after the page's own). The tools found can be called from your next step on. \
             Namespaces (tools): {namespaces}."
        ),
        input_schema: json!({
            "type": "object",
            "properties": {
                "query": {"type": "string", "maxLength": MAX_QUERY_BYTES},
                "namespace": {"type": "string"}
            },
            "required": ["query"],
            "additionalProperties": false
        }),
        read_only: true,
        danger: "safe".into(),
        requires_approval: false,
        server: None,
        title: Some("Find tools".into()),
        namespace: None,
        deferred: false,
    }
}

/// A `find_tools` call's arguments, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FindArgs {
    pub query: String,
    pub namespace: Option<String>,
}

/// Check a `find_tools` call's arguments (before any database work): an object with a non-empty
/// `query` of at most [`MAX_QUERY_BYTES`] and optionally a `namespace` (one name segment).
pub fn find_args(args: &Value) -> Result<FindArgs, &'static str> {
    let o = args
        .as_object()
        .ok_or("find_tools takes an object {query, namespace?}")?;
    if o.keys().any(|k| k != "query" && k != "namespace") {
        return Err("find_tools takes only query and namespace");
    }
    let query = o
        .get("query")
        .and_then(Value::as_str)
        .map(str::trim)
        .filter(|q| !q.is_empty())
        .ok_or("find_tools needs a query: words of what you need")?;
    if query.len() > MAX_QUERY_BYTES {
        return Err("the query is longer than 512 bytes");
    }
    let namespace = match o.get("namespace") {
        None | Some(Value::Null) => None,
        Some(Value::String(n)) if n.is_empty() => None,
        Some(Value::String(n))
            if n.len() <= 64
                && n.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-'
                }) =>
        {
            Some(n.clone())
        }
        Some(_) => return Err("namespace must be one of the namespaces listed"),
    };
    Ok(FindArgs {
        query: query.to_string(),
        namespace,
    })
}

/// Candidates a search ranks at most: the lexical matches first, then the page's other visible
/// tools in `visible_tools`' order (bounds the embedding work of one search on a large page).
pub const MAX_RANKED_CANDIDATES: usize = 1000;

/// The tools a search may return: the page's Gate-A-visible tools (`visible`), narrowed to the
/// asked namespace, the lexical matches first, at most [`MAX_RANKED_CANDIDATES`]. A name of
/// `lexical` that is not among `visible` is dropped (only Gate A's tools are ever returned).
pub fn candidates(visible: Vec<ToolSpec>, lexical: &[String], args: &FindArgs) -> Vec<ToolSpec> {
    let mut visible: Vec<ToolSpec> = visible
        .into_iter()
        .filter(|t| {
            t.name != FIND_TOOLS
                && args
                    .namespace
                    .as_deref()
                    .is_none_or(|n| t.namespace.as_deref() == Some(n))
        })
        .collect();
    let rank: std::collections::HashMap<&str, usize> = lexical
        .iter()
        .enumerate()
        .rev()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    // Stable: the lexical matches in their order, then the rest in the page's order.
    visible.sort_by_key(|t| rank.get(t.name.as_str()).copied().unwrap_or(usize::MAX));
    visible.truncate(MAX_RANKED_CANDIDATES);
    visible
}

/// The tools found, best first, at most `top_k`: with embeddings, the ranker's order of the
/// candidates near the query or matching it lexically (meaning first, the lexical order as
/// tie-break: `disclosure::fusion`); without, the lexical matches alone. Only ever tools of
/// `candidates`.
pub async fn found(
    ranker: &crate::catalog::disclosure::Ranker,
    query: &str,
    candidates: Vec<ToolSpec>,
    lexical: &[String],
    top_k: usize,
) -> Vec<ToolSpec> {
    if !ranker.is_semantic() {
        return candidates
            .into_iter()
            .filter(|t| lexical.contains(&t.name))
            .take(top_k)
            .collect();
    }
    let names = ranker
        .find_for_query(query, &candidates, lexical, top_k)
        .await;
    let mut by_name: std::collections::HashMap<String, ToolSpec> = candidates
        .into_iter()
        .map(|t| (t.name.clone(), t))
        .collect();
    names.iter().filter_map(|n| by_name.remove(n)).collect()
}

/// What the model is told a search found: the tools' names as it calls them, their descriptions
/// and namespaces (their definitions join its tool list at the next step).
pub fn found_envelope(found: &[ToolSpec]) -> Value {
    let tools: Vec<Value> = found
        .iter()
        .map(|t| json!({"name": wire_name(&t.name), "description": t.description, "namespace": t.namespace}))
        .collect();
    let note = if tools.is_empty() {
        "No tool on this page matches: try other words, or another namespace."
    } else {
        "These tools are now in your tool list: call them by name."
    };
    json!({"status": "ok", "result": {"tools": tools, "note": note}})
}

/// A refused `find_tools` call (its arguments), as the model or client is told.
pub fn refused_envelope(message: &str) -> Value {
    json!({"status": "error", "error": {"code": "INVALID_ARGUMENT", "message": message}})
}

/// Where a visible tool stands for a page (`POST /v1/tools`' `budget`): `offered` (in the list
/// given), `find_tools` (compact: reachable through the search), `left_out` (within the budget,
/// but not among the `CTXGUARD_MAX_TOOLS` offered).
pub fn standing(offer: &Offer, name: &str) -> &'static str {
    if offer.offers(name) {
        "offered"
    } else if offer.compact {
        "find_tools"
    } else {
        "left_out"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, server: Option<&str>, description_bytes: usize) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: "d".repeat(description_bytes),
            input_schema: json!({"type": "object"}),
            read_only: true,
            danger: "safe".into(),
            requires_approval: false,
            server: server.map(Into::into),
            title: None,
            namespace: Some(
                server
                    .map(str::to_string)
                    .unwrap_or_else(|| name.split('.').next().unwrap().to_string()),
            ),
            deferred: false,
        }
    }

    /// `n` tools in namespace `ns`, each of about 400 bytes (~110 tokens).
    fn overview(spread: &[(&str, usize)]) -> Overview {
        Overview {
            namespaces: spread
                .iter()
                .map(|(ns, n)| Namespace {
                    name: ns.to_string(),
                    title: None,
                    description: Some(format!("Everything about {ns}.")),
                    tools: *n,
                    server: None,
                    bytes: 400 * n,
                })
                .collect(),
        }
    }

    fn ranked(spread: &[(&str, usize)], upstream: usize) -> Vec<ToolSpec> {
        let mut v: Vec<ToolSpec> = spread
            .iter()
            .flat_map(|(ns, n)| (0..*n).map(move |i| tool(&format!("{ns}.t{i:03}"), None, 380)))
            .collect();
        v.extend((0..upstream).map(|i| tool(&format!("up.t{i}"), Some("up"), 380)));
        v
    }

    #[test]
    fn budgets_parse_as_tools_or_tokens() {
        assert_eq!("30".parse::<Budget>(), Ok(Budget::Tools(30)));
        assert_eq!(" 4000t ".parse::<Budget>(), Ok(Budget::Tokens(4000)));
        for bad in ["", "t", "0", "-3", "30x", "50t", "10001", "1e3"] {
            assert!(bad.parse::<Budget>().is_err(), "{bad}");
        }
        assert_eq!(Budget::Tokens(4000).to_string(), "4000t");
        assert_eq!(Budget::default(), Budget::Tools(30));
    }

    #[test]
    fn within_the_budget_the_list_is_todays() {
        let spread = [("invoice", 20), ("vendor", 10)];
        let list = ranked(&spread, 0);
        let o = offer(Budget::Tools(30), list.clone(), &overview(&spread));
        assert!(!o.compact && o.deferred.is_empty());
        assert_eq!(
            o.tools.iter().map(|t| &t.name).collect::<Vec<_>>(),
            list.iter().map(|t| &t.name).collect::<Vec<_>>()
        );
    }

    #[test]
    fn one_tool_over_the_budget_goes_compact() {
        let spread = [("invoice", 21), ("vendor", 10)];
        let o = offer(Budget::Tools(30), ranked(&spread, 0), &overview(&spread));
        assert!(o.compact);
        assert_eq!(o.tools.last().unwrap().name, FIND_TOOLS);
        assert!(o.deferred.iter().all(|t| t.deferred));
        assert!(o.tools.iter().all(|t| !t.deferred));
    }

    #[test]
    fn token_budgets_compare_estimated_tokens() {
        let spread = [("invoice", 10)];
        // 10 tools of 400 bytes: (4000 + 480) / 4 = 1120 tokens.
        assert_eq!(overview(&spread).tokens(), 1120);
        assert!(!Budget::Tokens(1120).exceeded_by(&overview(&spread)));
        assert!(Budget::Tokens(1119).exceeded_by(&overview(&spread)));
        let o = offer(Budget::Tokens(1000), ranked(&spread, 0), &overview(&spread));
        assert!(o.compact);
        // Half the budget (500), and beyond the first a tenth of the full list (112): one
        // ~107-token tool.
        assert_eq!(o.tools.len(), 2, "{:?}", o.tools);
    }

    #[test]
    fn the_compact_list_is_the_ranked_prefix_of_dba_tools_and_never_upstream() {
        let spread = [("invoice", 40), ("vendor", 40)];
        let mut list = ranked(&spread, 0);
        // An upstream tool ranked first (it cannot be, by the tiers; still never offered here) and
        // a catalog tool named like the search tool.
        list.insert(0, tool("up.first", Some("up"), 10));
        list.insert(2, tool(FIND_TOOLS, None, 10));
        let o = offer(Budget::Tools(30), list, &overview(&spread));
        let names: Vec<&str> = o.tools.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "invoice.t000",
                "invoice.t001",
                "invoice.t002",
                "invoice.t003",
                "invoice.t004",
                "invoice.t005",
                "invoice.t006",
                FIND_TOOLS
            ]
        );
        assert!(o.deferred.iter().any(|t| t.name == "up.first"));
        assert_eq!(o.tools.iter().filter(|t| t.name == FIND_TOOLS).count(), 1);
    }

    #[test]
    fn the_compact_list_is_at_most_15_percent_of_the_full_one_on_large_pages() {
        for (n_ns, per_ns) in [(1, 31), (3, 11), (2, 20), (6, 50), (12, 100)] {
            let names: Vec<String> = (0..n_ns).map(|i| format!("ns{i}")).collect();
            let spread: Vec<(&str, usize)> = names.iter().map(|n| (n.as_str(), per_ns)).collect();
            let o = offer(Budget::Tools(30), ranked(&spread, 0), &overview(&spread));
            let compact: usize = o
                .tools
                .iter()
                .map(|t| estimate_tokens(spec_bytes(t), 1))
                .sum();
            let full = overview(&spread).tokens();
            assert!(
                compact * 100 <= full * 15,
                "{n_ns}x{per_ns}: {compact} of {full}"
            );
        }
    }

    #[test]
    fn the_compact_list_is_deterministic() {
        let spread = [("crm", 50), ("hr", 50), ("invoice", 5)];
        let a = offer(Budget::Tools(30), ranked(&spread, 30), &overview(&spread));
        let b = offer(Budget::Tools(30), ranked(&spread, 30), &overview(&spread));
        let json = |o: &Offer| {
            o.tools
                .iter()
                .map(|t| {
                    (
                        t.name.clone(),
                        t.description.clone(),
                        t.input_schema.clone(),
                    )
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(json(&a), json(&b));
    }

    #[test]
    fn find_tools_lists_every_namespace_with_its_count_and_a_cut_description() {
        let mut ov = overview(&[("crm", 150), ("hr", 3)]);
        ov.namespaces[0].description = Some("x".repeat(300));
        let spec = find_tools_spec(&ov, 150);
        assert!(spec.description.contains("(150 are not listed)"));
        assert!(spec.description.contains("crm (150): xxxx"));
        assert!(spec.description.contains("hr (3): Everything about hr."));
        assert!(!spec.description.contains(&"x".repeat(101)));
        let many = Overview {
            namespaces: (0..45)
                .map(|i| Namespace {
                    name: format!("n{i:02}"),
                    title: None,
                    description: None,
                    tools: 1,
                    server: None,
                    bytes: 10,
                })
                .collect(),
        };
        let spec = find_tools_spec(&many, 45);
        assert!(spec.description.contains("n39 (1); and 5 more namespaces"));
        assert!(!spec.description.contains("n40"));
    }

    #[test]
    fn find_arguments_are_checked_before_any_database_work() {
        assert_eq!(
            find_args(&json!({"query": " notes of this customer ", "namespace": "crm"})),
            Ok(FindArgs {
                query: "notes of this customer".into(),
                namespace: Some("crm".into())
            })
        );
        assert_eq!(
            find_args(&json!({"query": "x", "namespace": ""}))
                .unwrap()
                .namespace,
            None
        );
        for bad in [
            json!("query"),
            json!({}),
            json!({"query": "  "}),
            json!({"query": 3}),
            json!({"query": "x".repeat(513)}),
            json!({"query": "x", "namespace": "Crm; DROP"}),
            json!({"query": "x", "namespace": 7}),
            json!({"query": "x", "top_k": 100}),
        ] {
            assert!(find_args(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_search_ranks_only_the_visible_tools_of_the_asked_namespace() {
        let visible = vec![
            tool("crm.a", None, 1),
            tool("hr.b", None, 1),
            tool("crm.c", None, 1),
            tool("crm.d", None, 1),
        ];
        // The lexical order puts crm.c first; a name Gate A did not return is dropped.
        let lexical: Vec<String> = ["crm.c", "other.secret", "hr.b"].map(String::from).to_vec();
        let args = FindArgs {
            query: "x".into(),
            namespace: Some("crm".into()),
        };
        let names = |v: Vec<ToolSpec>| v.into_iter().map(|t| t.name).collect::<Vec<_>>();
        assert_eq!(
            names(candidates(visible.clone(), &lexical, &args)),
            ["crm.c", "crm.a", "crm.d"]
        );
        let all = FindArgs {
            query: "x".into(),
            namespace: None,
        };
        let everything = candidates(visible, &lexical, &all);
        assert_eq!(
            names(everything.clone()),
            ["crm.c", "hr.b", "crm.a", "crm.d"]
        );
        // Without embeddings, what is found is the lexical matches alone, in their order.
        let ranker = crate::catalog::disclosure::Ranker::new(
            crate::catalog::disclosure::Embeddings::None,
            8,
        );
        let got = futures::executor::block_on(found(&ranker, "x", everything, &lexical, 5));
        assert_eq!(names(got), ["crm.c", "hr.b"]);
        let envelope = found_envelope(&[tool("crm.a", None, 1)]);
        assert_eq!(envelope["result"]["tools"][0]["name"], "crm__a");
        assert_eq!(envelope["result"]["tools"][0]["namespace"], "crm");
    }
}
