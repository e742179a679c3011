//! Fusing the lexical order with semantic similarity, then placing by tier.
//!
//! Each candidate gets `1/(K + lexical rank) + 1/(K + semantic rank)` (reciprocal rank fusion; a
//! tool without a lexical match, or without a vector, misses that term). The list is then filled by
//! `ctxguard_core::ranking::rank` in two passes: first the candidates that match the request (a
//! cosine of at least [`MATCH_COSINE`]; without vectors, a lexical match), then the rest. In each pass the DBA's
//! tools come before upstream tools (whose text the DBA did not write), and upstream servers take
//! turns with at most `per_server` places each. So an upstream description stuffed with the
//! request's words or meaning can only move its tool among upstream tools: a matching local tool
//! keeps its place. Unlike the unqueried list, the page's entity tools and its other local tools
//! are one tier here: in a search, relevance orders the DBA's own tools.

use std::collections::HashMap;

use ctxguard_core::ranking::{self, Candidate, Placement, Tier};

/// Reciprocal rank fusion's constant (the usual 60: ranks deep in a list still count a little).
pub const RRF_K: f32 = 60.0;
/// A cosine (unit vectors) at which a tool counts as matching the request without a lexical
/// match. MiniLM puts unrelated pairs of short texts near 0.0-0.2 and paraphrases above 0.4.
pub const MATCH_COSINE: f32 = 0.3;

/// One candidate as fusion sees it.
#[derive(Debug, Clone, Copy)]
pub struct Fused<'a> {
    pub name: &'a str,
    /// The upstream server of an external tool (`None`: a DBA tool).
    pub server: Option<&'a str>,
    /// Cosine of the tool's definition to the request (`None` without embeddings).
    pub cosine: Option<f32>,
}

/// The names of at most `top_k` of `candidates`, best first. `lexical_order` is the database's
/// lexical ranking (names it does not know among the candidates are ignored).
pub fn fuse(
    candidates: &[Fused<'_>],
    lexical_order: &[String],
    top_k: usize,
    per_server: usize,
) -> Vec<String> {
    let lexical: HashMap<&str, usize> = lexical_order
        .iter()
        .enumerate()
        .rev()
        .map(|(i, n)| (n.as_str(), i))
        .collect();
    // Semantic ranks (1-based) by cosine, ties by name.
    let mut by_cosine: Vec<(usize, f32)> = candidates
        .iter()
        .enumerate()
        .filter_map(|(i, c)| c.cosine.map(|s| (i, s)))
        .collect();
    by_cosine.sort_by(|a, b| {
        b.1.total_cmp(&a.1)
            .then_with(|| candidates[a.0].name.cmp(candidates[b.0].name))
    });
    let mut semantic_rank = vec![None; candidates.len()];
    for (rank, (i, _)) in by_cosine.iter().enumerate() {
        semantic_rank[*i] = Some(rank + 1);
    }
    let scored: Vec<(Candidate<'_>, bool)> = candidates
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let lex = lexical.get(c.name).map(|r| r + 1);
            let score = lex.map_or(0.0, |r| 1.0 / (RRF_K + r as f32))
                + semantic_rank[i].map_or(0.0, |r| 1.0 / (RRF_K + r as f32));
            // With vectors, meaning decides what matches (a shared common word such as "set" or
            // "new" would let a dozen local tools stand before the upstream tool asked for);
            // without, any lexical match does.
            let matching = match c.cosine {
                Some(s) => s >= MATCH_COSINE,
                None => lex.is_some(),
            };
            let tier = if c.server.is_some() {
                Tier::Upstream
            } else {
                Tier::Local
            };
            (
                Candidate {
                    name: c.name,
                    tier,
                    server: c.server,
                    score,
                },
                matching,
            )
        })
        .collect();
    let mut out = Vec::with_capacity(top_k);
    for pass in [true, false] {
        let room = top_k - out.len();
        if room == 0 {
            break;
        }
        let group: Vec<Candidate<'_>> = scored
            .iter()
            .filter(|(_, m)| *m == pass)
            .map(|(c, _)| *c)
            .collect();
        let placements = ranking::rank(&group, Some(room), per_server.max(1));
        let mut offered: Vec<(usize, &str)> = placements
            .iter()
            .zip(&group)
            .filter_map(|(p, c)| match p {
                Placement::Offered(n) => Some((*n, c.name)),
                Placement::LeftOut(_) => None,
            })
            .collect();
        offered.sort();
        out.extend(offered.into_iter().map(|(_, n)| n.to_string()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn local(name: &str, cosine: f32) -> Fused<'_> {
        Fused {
            name,
            server: None,
            cosine: Some(cosine),
        }
    }
    fn up<'a>(name: &'a str, server: &'a str, cosine: f32) -> Fused<'a> {
        Fused {
            name,
            server: Some(server),
            cosine: Some(cosine),
        }
    }

    #[test]
    fn only_candidates_come_out_whatever_the_lexical_order_names() {
        let c = [local("invoice.get", 0.1), local("vendor.list", 0.5)];
        let lexical = ["evil.tool".to_string(), "invoice.get".to_string()];
        let got = fuse(&c, &lexical, 5, 8);
        assert_eq!(got.len(), 2);
        assert!(got.iter().all(|n| n == "invoice.get" || n == "vendor.list"));
        assert!(fuse(&c, &lexical, 0, 8).is_empty());
        assert!(fuse(&[], &lexical, 5, 8).is_empty());
    }

    #[test]
    fn stuffed_upstream_tools_never_displace_a_matching_local_tool() {
        // Ten upstream tools stuffed to match best on both counts; the local tool matches weakly.
        let names: Vec<String> = (0..10).map(|i| format!("evil.t{i}")).collect();
        let mut c: Vec<Fused<'_>> = names.iter().map(|n| up(n, "evil", 0.99)).collect();
        c.push(local("invoice.mark_paid", 0.31));
        c.push(local("vendor.list", 0.05));
        let mut lexical: Vec<String> = names.clone();
        lexical.push("vendor.list".into());
        let got = fuse(&c, &lexical, 5, 8);
        assert_eq!(
            got[0], "invoice.mark_paid",
            "matching local tool: before any upstream"
        );
        assert_eq!(got.len(), 5);
        // Without vectors a lexical match is what matches: the same rule holds.
        let plain: Vec<Fused<'_>> = c.iter().map(|f| Fused { cosine: None, ..*f }).collect();
        assert_eq!(fuse(&plain, &lexical, 5, 8)[0], "vendor.list");
        // Without any match the local tool still comes before upstream tools that do not match.
        let c = [up("evil.x", "evil", 0.1), local("invoice.get", 0.0)];
        assert_eq!(fuse(&c, &[], 1, 8), ["invoice.get"]);
    }

    #[test]
    fn a_matching_upstream_tool_beats_local_tools_that_do_not_match() {
        let c = [
            local("invoice.get", 0.05),
            local("invoice.history", 0.1),
            up("chat.create_message", "chat", 0.6),
        ];
        assert_eq!(fuse(&c, &[], 1, 8), ["chat.create_message"]);
    }

    #[test]
    fn one_server_gets_at_most_per_server_places() {
        let names: Vec<String> = (0..6).map(|i| format!("a.t{i}")).collect();
        let mut c: Vec<Fused<'_>> = names.iter().map(|n| up(n, "a", 0.9)).collect();
        c.push(up("b.only", "b", 0.35));
        let got = fuse(&c, &[], 5, 2);
        assert!(got.contains(&"b.only".to_string()), "{got:?}");
        assert_eq!(got.iter().filter(|n| n.starts_with("a.")).count(), 2);
        assert_eq!(got.len(), 3);
    }

    #[test]
    fn rrf_puts_tools_matching_on_both_counts_first() {
        let c = [local("a", 0.9), local("b", 0.8), local("c", 0.7)];
        // c first lexically, a first semantically: both 1/61 + 1/63 (a tie, by name), above b's
        // 2/62 (second on both counts).
        let got = fuse(&c, &["c".into(), "b".into(), "a".into()], 3, 8);
        assert_eq!(got, ["a", "c", "b"]);
        let got = fuse(&c, &["b".into()], 3, 8);
        assert_eq!(got[0], "b");
    }
}
