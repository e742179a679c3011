//! Placing the candidates of a search: meaning first, the lexical order as tie-break, in passes
//! that keep the page's matching tools ahead of upstream tools.
//!
//! With vectors, each candidate's score is the cosine of its definition to the request (the
//! database's lexical order only breaks ties, then the name). The answer is filled in three passes:
//!
//! 1. the DBA's tools that match the request (cosine at least [`MATCH_COSINE`]), best first;
//! 2. the DBA's other tools and upstream tools that come near (cosine at least
//!    [`UPSTREAM_COSINE`]), one list by score;
//! 3. the remaining upstream tools.
//!
//! Upstream servers get at most `per_server` places in all. Only the DBA's own tools are in pass 1,
//! and whether one matches depends on its cosine alone (an absolute threshold, never relative to
//! other candidates): so an upstream description stuffed with the request's words or meaning
//! cannot displace a matching local tool, nor change which local tools match or their order. It
//! can only outrank local tools that do not match.
//!
//! Without vectors a lexical match is what matches: pass 1 holds the DBA's lexically matching
//! tools, pass 2 the other DBA tools and the lexically matching upstream tools (the matching ones
//! first), pass 3 the rest.
//!
//! Why not reciprocal rank fusion of the two orders (the first version): over the reachability
//! benchmark's tuning half, a shared common word ("set", "new", "this") gave a wrong tool the top
//! lexical rank, which the fusion carried into the top 5; cosine first reached more (BENCHMARKS.md,
//! reachability).

use std::cmp::{Ordering, Reverse};
use std::collections::HashMap;

/// A cosine (unit vectors) at which a DBA tool matches the request. MiniLM puts unrelated pairs
/// of short texts near 0.0-0.2 and paraphrases above 0.4.
pub const MATCH_COSINE: f32 = 0.3;
/// A cosine at which an upstream tool may stand among the DBA's tools that do not match (upstream
/// descriptions are often terse, "Create a chat message.", and rarely reach [`MATCH_COSINE`]).
pub const UPSTREAM_COSINE: f32 = 0.2;
/// The cosine below which a search (`find_tools`) does not return a tool that shares no word with
/// the request: far enough from it that it would only lengthen the model's list. Set on the
/// reachability benchmark's tuning half (BENCHMARKS.md, reachability).
pub const FIND_COSINE: f32 = 0.1;

/// One candidate as fusion sees it.
#[derive(Debug, Clone, Copy)]
pub struct Fused<'a> {
    pub name: &'a str,
    /// The upstream server of an external tool (`None`: a DBA tool).
    pub server: Option<&'a str>,
    /// Cosine of the tool's definition to the request (`None` without embeddings).
    pub cosine: Option<f32>,
}

/// Which pass a candidate is placed in (see the module's documentation).
fn pass(c: &Fused<'_>, lexical_match: bool) -> u8 {
    let local = c.server.is_none();
    match (c.cosine, local) {
        (Some(s), true) => u8::from(s < MATCH_COSINE),
        (Some(s), false) => 1 + u8::from(s < UPSTREAM_COSINE),
        (None, true) => u8::from(!lexical_match),
        (None, false) => 1 + u8::from(!lexical_match),
    }
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
    let mut order: Vec<(u8, &Fused<'_>, Option<usize>)> = candidates
        .iter()
        .map(|c| {
            let lex = lexical.get(c.name).copied();
            (pass(c, lex.is_some()), c, lex)
        })
        .collect();
    order.sort_by(|a, b| {
        a.0.cmp(&b.0)
            .then_with(|| match (a.1.cosine, b.1.cosine) {
                (Some(x), Some(y)) => y.total_cmp(&x),
                _ => Ordering::Equal,
            })
            // Lexical rank (a match before none), then the name.
            .then_with(|| a.2.map(Reverse).cmp(&b.2.map(Reverse)).reverse())
            .then_with(|| a.1.name.cmp(b.1.name))
    });
    let per_server = per_server.max(1);
    let mut taken: HashMap<&str, usize> = HashMap::new();
    let mut out = Vec::with_capacity(top_k.min(candidates.len()));
    for (_, c, _) in order {
        if out.len() >= top_k {
            break;
        }
        if let Some(server) = c.server {
            let n = taken.entry(server).or_default();
            if *n >= per_server {
                continue;
            }
            *n += 1;
        }
        out.push(c.name.to_string());
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
        assert_eq!(got, ["vendor.list", "invoice.get"]);
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
        // An upstream tool that does not come near stays behind every local tool.
        let c = [up("evil.x", "evil", 0.19), local("invoice.get", 0.0)];
        assert_eq!(fuse(&c, &[], 1, 8), ["invoice.get"]);
        let plain = [
            Fused {
                cosine: None,
                ..c[0]
            },
            Fused {
                cosine: None,
                ..c[1]
            },
        ];
        assert_eq!(fuse(&plain, &[], 1, 8), ["invoice.get"]);
    }

    /// A small deterministic generator (no dependency for one test).
    fn lcg(state: &mut u64) -> f32 {
        *state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((*state >> 33) as f32) / ((1u64 << 31) as f32)
    }

    #[test]
    fn upstream_candidates_change_neither_which_local_tools_match_nor_their_order() {
        let locals: Vec<String> = (0..12).map(|i| format!("page.t{i}")).collect();
        let ups: Vec<String> = (0..30).map(|i| format!("up.t{i}")).collect();
        let mut seed = 7u64;
        for round in 0..200 {
            let mut c: Vec<Fused<'_>> = locals
                .iter()
                .map(|n| local(n, lcg(&mut seed) * 0.8 - 0.1))
                .collect();
            let alone: Vec<Fused<'_>> = c.clone();
            c.extend(ups.iter().map(|n| {
                let server = if lcg(&mut seed) < 0.5 { "a" } else { "b" };
                up(n, server, lcg(&mut seed) * 1.1 - 0.1)
            }));
            // Lexically, upstream tools first (stuffed), then some local tools.
            let mut lexical: Vec<String> = ups.clone();
            lexical.extend(locals.iter().filter(|_| lcg(&mut seed) < 0.5).cloned());
            let top_k = 1 + round % 12;
            let with = fuse(&c, &lexical, top_k, 8);
            let without = fuse(&alone, &lexical, top_k, 8);
            let matching: Vec<&String> = without
                .iter()
                .filter(|n| {
                    alone
                        .iter()
                        .any(|f| f.name == *n && f.cosine >= Some(MATCH_COSINE))
                })
                .collect();
            assert!(
                with.iter()
                    .take(matching.len())
                    .eq(matching.iter().copied()),
                "round {round}: matching local tools {matching:?} first, got {with:?}"
            );
            let local_order: Vec<&String> =
                with.iter().filter(|n| n.starts_with("page.")).collect();
            assert!(
                without.iter().zip(&local_order).all(|(a, b)| a == *b),
                "round {round}: local order {without:?} vs {local_order:?}"
            );
            assert!(with.iter().all(|n| c.iter().any(|f| f.name == n)));
        }
    }

    #[test]
    fn an_upstream_tool_that_comes_near_beats_local_tools_that_do_not_match() {
        let c = [
            local("invoice.get", 0.05),
            local("invoice.history", 0.25),
            up("chat.create_poll", "chat", 0.26),
            up("chat.create_message", "chat", 0.21),
        ];
        assert_eq!(
            fuse(&c, &[], 3, 8),
            ["chat.create_poll", "invoice.history", "chat.create_message"]
        );
        // A matching local tool still comes first.
        let c = [
            local("app.calendar_today", 0.31),
            up("chat.poll", "chat", 0.9),
        ];
        assert_eq!(fuse(&c, &[], 2, 8), ["app.calendar_today", "chat.poll"]);
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
    fn meaning_orders_and_the_lexical_order_breaks_ties() {
        let c = [local("a", 0.9), local("b", 0.8), local("c", 0.8)];
        // c first lexically: it wins the tie with b, but not against a's better cosine.
        let got = fuse(&c, &["c".into(), "b".into(), "a".into()], 3, 8);
        assert_eq!(got, ["a", "c", "b"]);
        // A lexical match beats none at the same cosine; names break what is left.
        assert_eq!(fuse(&c, &["b".into()], 3, 8), ["a", "b", "c"]);
        assert_eq!(fuse(&c, &[], 3, 8), ["a", "b", "c"]);
    }
}
