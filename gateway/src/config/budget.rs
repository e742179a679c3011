//! `CTXGUARD_TOOL_BUDGET`'s value: when a page's visible tools go compact (`catalog::compact`).

use std::fmt;
use std::str::FromStr;

/// `CTXGUARD_TOOL_BUDGET`: the most tools, or (`4000t`) the most estimated tokens of tool
/// definitions, a page may show before the compact list replaces the full one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    Tools(usize),
    Tokens(usize),
}

impl Default for Budget {
    /// 30 tools: a page with more goes compact.
    fn default() -> Budget {
        Budget::Tools(30)
    }
}

impl FromStr for Budget {
    type Err = String;

    fn from_str(s: &str) -> Result<Budget, String> {
        let s = s.trim();
        let (digits, tokens) = match s.strip_suffix('t') {
            Some(d) => (d, true),
            None => (s, false),
        };
        let n: usize = digits
            .parse()
            .map_err(|_| format!("{s:?}: a number of tools (30) or of tokens (4000t)"))?;
        if tokens {
            if !(100..=1_000_000).contains(&n) {
                return Err("a token budget must be 100t..1000000t".into());
            }
            Ok(Budget::Tokens(n))
        } else {
            if !(1..=10_000).contains(&n) {
                return Err("a tool budget must be 1..10000".into());
            }
            Ok(Budget::Tools(n))
        }
    }
}

impl fmt::Display for Budget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Budget::Tools(n) => write!(f, "{n}"),
            Budget::Tokens(n) => write!(f, "{n}t"),
        }
    }
}
