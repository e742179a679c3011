//! Which visible tools the model is offered when there is room for only `top_k` of them.
//!
//! Text an upstream server controls must not decide what the model sees of the page. So the list
//! is filled in tiers, never by one score across all tools:
//!
//! 1. the page's own tools: DBA tools (SQL or built-in) bound to the entity on the page;
//! 2. the DBA's other tools (SQL or built-in) visible here;
//! 3. upstream (external) tools, in what room is left: the servers take turns (each its best
//!    remaining tool, the server with the best one first), and no server gets more than
//!    `per_server` places.
//!
//! Within a tier, tools are ordered by their score (relevance to the message, computed from text
//! the DBA accepted), then by name. An upstream tool can therefore outrank only other upstream
//! tools, and only within its server's share.
//!
//! A search ([`search`], `ctxguard.find_tools`) asks another question: which tools fit the words
//! given. There the page's own tools do not come first whatever the query (a top 5 that is always
//! the page's entity tools answers nothing): only tools that match take a place, and the DBA's
//! tools of both tiers are ordered by score. Upstream tools still come only after every matching
//! DBA tool, sharing the room left as above, so keyword stuffing in upstream text can never push
//! a matching DBA tool out.

use std::cmp::Ordering;
use std::collections::HashMap;

/// Which tier a visible tool fills.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Tier {
    /// A DBA tool bound to the entity on the page.
    Entity,
    /// Another DBA tool (SQL or built-in).
    Local,
    /// A tool of an upstream MCP server.
    Upstream,
}

/// One visible tool, as ranking sees it.
#[derive(Debug, Clone, Copy)]
pub struct Candidate<'a> {
    pub name: &'a str,
    pub tier: Tier,
    /// The upstream server (upstream tools only).
    pub server: Option<&'a str>,
    /// Relevance to the message (0 without one).
    pub score: f32,
}

/// Why a visible tool is not in the model's list.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeftOut {
    /// The list was full before its turn came (ranked below the cut).
    TopK,
    /// An upstream tool, and the page's own tools filled the list.
    PageToolsFirst,
    /// An upstream tool whose server already has `per_server` tools in the list.
    ServerCap,
}

impl LeftOut {
    /// Stable code (`explain_tools.left_out`, the `/v1/tools` answer).
    pub fn as_str(self) -> &'static str {
        match self {
            LeftOut::TopK => "top_k",
            LeftOut::PageToolsFirst => "page_tools_first",
            LeftOut::ServerCap => "server_cap",
        }
    }
}

/// Where a candidate ended up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Offered, at this position of the model's list (0-based).
    Offered(usize),
    LeftOut(LeftOut),
}

/// How the DBA's tools (the first two tiers) are ordered among themselves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Order {
    /// The model's list: by tier, then score (the page's own tools first whatever the query).
    Tiers,
    /// A search: by score, the tier breaking ties.
    Relevance,
}

fn by_rank(order: Order, a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    let upstream = |c: &Candidate<'_>| c.tier == Tier::Upstream;
    let first = match order {
        Order::Tiers => a.tier.cmp(&b.tier),
        Order::Relevance => upstream(a).cmp(&upstream(b)),
    };
    first
        .then_with(|| b.score.total_cmp(&a.score))
        .then_with(|| a.tier.cmp(&b.tier))
        .then_with(|| a.name.cmp(b.name))
}

/// Most bytes of a ranking query (`visible_tools(query)`, `explain_tools(query)`: the user's
/// message, which the gateway caps at 8,000 characters); SQLSTATE 54000 beyond, checked before
/// the query is read.
pub const MAX_RANK_QUERY_BYTES: usize = 65_536;

/// Words of a free-text query as an OR text-search query (`w1 | w2`): runs of ASCII letters and
/// digits, lower-cased, 2-32 characters long, each once, at most 16; nothing else reaches
/// `to_tsquery`, so no query syntax can. `None` when there is no such word.
pub fn or_query(text: &str) -> Option<String> {
    let mut words: Vec<String> = Vec::new();
    for w in text.split(|c: char| !c.is_ascii_alphanumeric()) {
        let w = w.to_ascii_lowercase();
        if w.len() >= 2 && w.len() <= 32 && !words.contains(&w) && words.len() < 16 {
            words.push(w);
        }
    }
    (!words.is_empty()).then(|| words.join(" | "))
}

/// A search over the visible tools (`ctxguard.find_tools`): the indices of the candidates to
/// return, best first, at most `top_k`. Only candidates that match (score above 0) take a place:
/// first the DBA's tools of both tiers by score (the page's own tools first only among equals),
/// then upstream tools in the room left, the servers taking turns and none getting more than
/// `per_server` places (as in [`rank`]).
pub fn search(candidates: &[Candidate<'_>], top_k: usize, per_server: usize) -> Vec<usize> {
    let matching: Vec<usize> = (0..candidates.len())
        .filter(|&i| candidates[i].score > 0.0)
        .collect();
    let sub: Vec<Candidate<'_>> = matching.iter().map(|&i| candidates[i]).collect();
    let mut found: Vec<(usize, usize)> = rank_by(Order::Relevance, &sub, Some(top_k), per_server)
        .into_iter()
        .zip(&matching)
        .filter_map(|(p, &i)| match p {
            Placement::Offered(n) => Some((n, i)),
            Placement::LeftOut(_) => None,
        })
        .collect();
    found.sort_unstable();
    found.into_iter().map(|(_, i)| i).collect()
}

/// Place every candidate: offered (with its position) or left out (with why). `top_k = None`
/// offers everything, in rank order. The result is parallel to `candidates`.
pub fn rank(
    candidates: &[Candidate<'_>],
    top_k: Option<usize>,
    per_server: usize,
) -> Vec<Placement> {
    rank_by(Order::Tiers, candidates, top_k, per_server)
}

fn rank_by(
    by: Order,
    candidates: &[Candidate<'_>],
    top_k: Option<usize>,
    per_server: usize,
) -> Vec<Placement> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| by_rank(by, &candidates[a], &candidates[b]));
    let mut placement = vec![Placement::LeftOut(LeftOut::TopK); candidates.len()];
    let Some(k) = top_k else {
        for (position, &i) in order.iter().enumerate() {
            placement[i] = Placement::Offered(position);
        }
        return placement;
    };

    // Tiers 1 and 2 in rank order.
    let mut offered: Vec<usize> = Vec::new();
    let (local, upstream): (Vec<usize>, Vec<usize>) = order
        .iter()
        .partition(|&&i| candidates[i].tier != Tier::Upstream);
    for &i in &local {
        if offered.len() < k {
            offered.push(i);
        }
    }
    let room_for_upstream = k - offered.len();

    // Tier 3: servers take turns, each its best remaining tool, up to `per_server` each.
    let mut queues: Vec<(&str, std::collections::VecDeque<usize>)> = Vec::new();
    let mut queue_of: HashMap<&str, usize> = HashMap::new();
    for &i in &upstream {
        let server = candidates[i].server.unwrap_or("");
        let q = *queue_of.entry(server).or_insert_with(|| {
            queues.push((server, std::collections::VecDeque::new()));
            queues.len() - 1
        });
        queues[q].1.push_back(i);
    }
    let mut taken: Vec<usize> = Vec::new();
    let mut per: HashMap<&str, usize> = HashMap::new();
    'rounds: loop {
        let mut progressed = false;
        for (server, queue) in &mut queues {
            if taken.len() >= room_for_upstream {
                break 'rounds;
            }
            let count = per.entry(server).or_default();
            if *count >= per_server {
                continue;
            }
            if let Some(i) = queue.pop_front() {
                taken.push(i);
                *count += 1;
                progressed = true;
            }
        }
        if !progressed {
            break;
        }
    }
    // The upstream tools offered, in rank order after the page's own.
    taken.sort_by(|&a, &b| by_rank(by, &candidates[a], &candidates[b]));
    offered.extend(&taken);
    for (position, &i) in offered.iter().enumerate() {
        placement[i] = Placement::Offered(position);
    }
    for (server, queue) in &queues {
        let capped = per.get(server).copied().unwrap_or(0) >= per_server;
        for &i in queue {
            placement[i] = Placement::LeftOut(if room_for_upstream == 0 {
                LeftOut::PageToolsFirst
            } else if capped {
                LeftOut::ServerCap
            } else {
                LeftOut::TopK
            });
        }
    }
    placement
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(name: &str, tier: Tier, score: f32) -> Candidate<'_> {
        Candidate {
            name,
            tier,
            server: None,
            score,
        }
    }

    fn up<'a>(name: &'a str, server: &'a str, score: f32) -> Candidate<'a> {
        Candidate {
            name,
            tier: Tier::Upstream,
            server: Some(server),
            score,
        }
    }

    fn offered(c: &[Candidate<'_>], p: &[Placement]) -> Vec<String> {
        let mut out: Vec<(usize, String)> = p
            .iter()
            .zip(c)
            .filter_map(|(p, c)| match p {
                Placement::Offered(n) => Some((*n, c.name.to_string())),
                Placement::LeftOut(_) => None,
            })
            .collect();
        out.sort();
        out.into_iter().map(|(_, n)| n).collect()
    }

    #[test]
    fn keyword_stuffed_upstream_tools_never_displace_the_pages_own() {
        // 24 upstream tools whose descriptions repeat the page's words score far above the page's
        // own three tools; the list has room for 5.
        let names: Vec<String> = (0..24).map(|i| format!("evil.tool{i:02}")).collect();
        let mut c = vec![
            local("invoice.get", Tier::Entity, 0.1),
            local("invoice.mark_paid", Tier::Entity, 0.0),
            local("read_doc_metadata", Tier::Local, 0.05),
        ];
        c.extend(names.iter().map(|n| up(n, "evil", 9.9)));
        let p = rank(&c, Some(5), 8);
        assert_eq!(
            offered(&c, &p),
            [
                "invoice.get",
                "invoice.mark_paid",
                "read_doc_metadata",
                "evil.tool00",
                "evil.tool01"
            ]
        );
        assert!(
            p[3..]
                .iter()
                .filter(|p| matches!(p, Placement::LeftOut(LeftOut::TopK)))
                .count()
                == 22
        );
        // With no room left, upstream tools are told why.
        let p = rank(&c, Some(3), 8);
        assert_eq!(
            offered(&c, &p),
            ["invoice.get", "invoice.mark_paid", "read_doc_metadata"]
        );
        assert!(p[3..]
            .iter()
            .all(|p| *p == Placement::LeftOut(LeftOut::PageToolsFirst)));
    }

    #[test]
    fn entity_tools_come_before_other_local_tools_whatever_their_score() {
        let c = [
            local("vendor.list", Tier::Local, 5.0),
            local("invoice.get", Tier::Entity, 0.0),
            local("doc_local_search", Tier::Local, 1.0),
        ];
        let p = rank(&c, Some(2), 8);
        assert_eq!(offered(&c, &p), ["invoice.get", "vendor.list"]);
        assert_eq!(p[2], Placement::LeftOut(LeftOut::TopK));
    }

    #[test]
    fn servers_share_the_room_left_and_each_is_capped() {
        let mut c = vec![local("invoice.get", Tier::Entity, 0.0)];
        let evil: Vec<String> = (0..10).map(|i| format!("evil.t{i}")).collect();
        c.extend(evil.iter().map(|n| up(n, "evil", 9.0)));
        c.push(up("scans.read_scan", "scans", 0.2));
        c.push(up("scans.list", "scans", 0.1));
        c.push(up("notes.lookup_note", "notes", 0.0));
        // Room for 6: the page's tool, then the three servers in turns (evil, scans, notes, evil, scans).
        let p = rank(&c, Some(6), 8);
        let got = offered(&c, &p);
        assert_eq!(got[0], "invoice.get");
        for name in ["scans.read_scan", "scans.list", "notes.lookup_note"] {
            assert!(got.contains(&name.to_string()), "{got:?}");
        }
        assert_eq!(got.iter().filter(|n| n.starts_with("evil.")).count(), 2);
        // Plenty of room: evil still gets at most per_server places.
        let p = rank(&c, Some(50), 3);
        let got = offered(&c, &p);
        assert_eq!(got.iter().filter(|n| n.starts_with("evil.")).count(), 3);
        assert_eq!(got.len(), 1 + 3 + 3);
        assert!(p[4..11]
            .iter()
            .all(|p| *p == Placement::LeftOut(LeftOut::ServerCap)));
    }

    #[test]
    fn without_top_k_everything_is_offered_in_tier_then_score_order() {
        let c = [
            up("evil.a", "evil", 9.0),
            local("vendor.list", Tier::Local, 0.5),
            local("invoice.get", Tier::Entity, 0.0),
            local("b.tool", Tier::Local, 0.5),
        ];
        let p = rank(&c, None, 1);
        assert_eq!(
            offered(&c, &p),
            ["invoice.get", "b.tool", "vendor.list", "evil.a"]
        );
        assert_eq!(rank(&[], Some(3), 1), vec![]);
    }

    fn found<'a>(c: &[Candidate<'a>], top_k: usize, per_server: usize) -> Vec<&'a str> {
        search(c, top_k, per_server)
            .into_iter()
            .map(|i| c[i].name)
            .collect()
    }

    #[test]
    fn a_search_never_lets_keyword_stuffed_upstream_tools_displace_a_matching_dba_tool() {
        // 30 upstream tools stuffed with the query's words score far above the one DBA tool that
        // matches a little; the DBA tool keeps its place at the top, whatever the room.
        let names: Vec<String> = (0..30).map(|i| format!("evil.tool{i:02}")).collect();
        let mut c = vec![
            local("invoice.get", Tier::Entity, 0.0),
            local("invoice.mark_paid", Tier::Entity, 0.01),
        ];
        c.extend(names.iter().map(|n| up(n, "evil", 99.0)));
        for k in 1..=10 {
            let got = found(&c, k, 8);
            assert_eq!(got[0], "invoice.mark_paid", "top_k {k}");
            assert!(!got.contains(&"invoice.get"), "no relevance, no place");
            assert_eq!(got.len(), k.min(1 + 8));
        }
        // Several servers, each stuffed: still after every matching DBA tool, each capped.
        let more: Vec<String> = (0..30).map(|i| format!("spam.tool{i:02}")).collect();
        c.extend(more.iter().map(|n| up(n, "spam", 1000.0)));
        c.push(local("vendor.list", Tier::Local, 0.02));
        let got = found(&c, 7, 3);
        assert_eq!(got[..2], ["vendor.list", "invoice.mark_paid"]);
        // (spam's best scores highest, so spam takes the first turn: spam, evil, spam, evil, spam.)
        assert_eq!(got.iter().filter(|n| n.starts_with("spam.")).count(), 3);
        assert_eq!(got.iter().filter(|n| n.starts_with("evil.")).count(), 2);
    }

    #[test]
    fn a_search_orders_the_dba_tools_by_relevance_not_by_tier() {
        let c = [
            local("invoice.get", Tier::Entity, 0.1),
            local("invoice.mark_paid", Tier::Entity, 0.0),
            local("vendor.list", Tier::Local, 0.6),
            local("doc_local_search", Tier::Local, 0.1),
            up("notes.lookup", "notes", 0.9),
        ];
        assert_eq!(
            found(&c, 5, 8),
            [
                "vendor.list",
                "invoice.get",
                "doc_local_search",
                "notes.lookup"
            ],
            "by score; the page's own tool first among equals; the upstream tool last"
        );
        assert_eq!(found(&c, 1, 8), ["vendor.list"]);
        // Nothing matches: nothing is found (not the page's tools).
        let none = [local("invoice.get", Tier::Entity, 0.0), up("s.t", "s", 0.0)];
        assert!(found(&none, 5, 8).is_empty());
        let nan = [local("invoice.get", Tier::Entity, f32::NAN)];
        assert!(found(&nan, 5, 8).is_empty());
        assert!(found(&[], 5, 8).is_empty());
    }

    #[test]
    fn or_query_keeps_plain_words_only() {
        assert_eq!(
            or_query("Mark THIS invoice as paid!").as_deref(),
            Some("mark | this | invoice | as | paid")
        );
        assert_eq!(
            or_query("legacy.export_all").as_deref(),
            Some("legacy | export | all")
        );
        // Query syntax, single letters, non-ASCII letters and over-long words do not pass.
        assert_eq!(or_query("a & !b | c:* <-> (d)"), None);
        assert_eq!(
            or_query("Rechnungsprüfung"),
            Some("rechnungspr | fung".into())
        );
        assert_eq!(or_query(&"x".repeat(33)), None);
        let many: String = (0..40).map(|i| format!("w{i:02} ")).collect();
        assert_eq!(or_query(&many).map(|q| q.split(" | ").count()), Some(16));
        assert_eq!(or_query("paid paid PAID").as_deref(), Some("paid"));
    }

    #[test]
    fn top_k_zero_offers_nothing() {
        let c = [local("invoice.get", Tier::Entity, 0.0), up("s.t", "s", 1.0)];
        let p = rank(&c, Some(0), 8);
        assert_eq!(
            p,
            [
                Placement::LeftOut(LeftOut::TopK),
                Placement::LeftOut(LeftOut::PageToolsFirst)
            ]
        );
    }
}
