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

fn by_rank(a: &Candidate<'_>, b: &Candidate<'_>) -> Ordering {
    a.tier
        .cmp(&b.tier)
        .then_with(|| b.score.total_cmp(&a.score))
        .then_with(|| a.name.cmp(b.name))
}

/// Place every candidate: offered (with its position) or left out (with why). `top_k = None`
/// offers everything, in rank order. The result is parallel to `candidates`.
pub fn rank(
    candidates: &[Candidate<'_>],
    top_k: Option<usize>,
    per_server: usize,
) -> Vec<Placement> {
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| by_rank(&candidates[a], &candidates[b]));
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
    taken.sort_by(|&a, &b| by_rank(&candidates[a], &candidates[b]));
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
