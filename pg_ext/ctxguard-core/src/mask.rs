//! Masking of secrets and PII in tool results.
//!
//! Rules are regular expressions (the `regex` crate: linear time, no backtracking blow-ups) with an
//! optional validator (`luhn` for card numbers, `iban` for IBANs) that must accept a match before it
//! is masked. Matching runs on a normalised view of the text in which fullwidth ASCII forms
//! (`ＡＫＩＡ…`, `４１１１…`, `＠`) and the ideographic space become plain ASCII, so obfuscated
//! variants are caught; replacements are applied to the original text.

use std::collections::BTreeMap;

use regex::Regex;
use serde_json::Value;

/// How a rule is declared (rows of `ctxguard.mask_rules`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    pub name: String,
    pub pattern: String,
    pub validator: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("mask rule {name}: {reason}")]
pub struct RuleError {
    pub name: String,
    pub reason: String,
}

struct Rule {
    name: String,
    re: Regex,
    validator: Option<fn(&str) -> bool>,
}

/// A compiled rule set. Build once per backend (and whenever the rules change).
pub struct Masker {
    rules: Vec<Rule>,
}

/// Matches masked per rule name.
pub type MaskCounts = BTreeMap<String, u32>;

/// The built-in rules, in application order (tokens before the looser number patterns).
pub fn default_rules() -> Vec<RuleSpec> {
    let r = |name: &str, pattern: &str, validator: Option<&str>| RuleSpec {
        name: name.into(),
        pattern: pattern.into(),
        validator: validator.map(Into::into),
    };
    vec![
        r(
            "jwt",
            r"\beyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
            None,
        ),
        r(
            "bearer_token",
            r"(?i)\bbearer[ :]+[A-Za-z0-9._~+/-]{16,}=*",
            None,
        ),
        r(
            "openai_key",
            r"\bsk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{16,}",
            None,
        ),
        r(
            "aws_access_key",
            r"\b(?:AKIA|ASIA)[ -]?(?:[A-Z0-9][ -]?){15}[A-Z0-9]\b",
            None,
        ),
        r(
            "email",
            r"(?i)\b[a-z0-9._%+-]+ ?(?:@|\(at\)|\[at\]) ?[a-z0-9-]+(?: ?(?:\.|\(dot\)|\[dot\]) ?[a-z0-9-]+)*? ?(?:\.|\(dot\)|\[dot\]) ?[a-z]{2,}\b",
            None,
        ),
        r(
            "iban",
            r"(?i)\b[a-z]{2}[0-9]{2}(?:[ -]?[a-z0-9]{4}){2,7}(?:[ -]?[a-z0-9]{1,4})?\b",
            Some("iban"),
        ),
        r(
            "card_number",
            r"\b[0-9](?:[ -]?[0-9]){12,18}\b",
            Some("luhn"),
        ),
        r(
            "phone",
            r"(?:\+|\b00)[1-9][0-9]{0,2}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}\b|\(?\b[0-9]{3}\)?[ .-][0-9]{3}[ .-][0-9]{4}\b",
            None,
        ),
    ]
}

fn digits(s: &str) -> Vec<u32> {
    s.chars().filter_map(|c| c.to_digit(10)).collect()
}

/// Luhn checksum over the digits of `s`.
pub fn luhn(s: &str) -> bool {
    let d = digits(s);
    if d.len() < 13 || d.len() > 19 {
        return false;
    }
    let sum: u32 = d
        .iter()
        .rev()
        .enumerate()
        .map(|(i, &x)| {
            if i % 2 == 1 {
                if x * 2 > 9 {
                    x * 2 - 9
                } else {
                    x * 2
                }
            } else {
                x
            }
        })
        .sum();
    sum.is_multiple_of(10)
}

/// ISO 13616 mod-97 check of an IBAN (separators ignored).
pub fn iban(s: &str) -> bool {
    let compact: Vec<char> = s
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .map(|c| c.to_ascii_uppercase())
        .collect();
    if compact.len() < 15 || compact.len() > 34 {
        return false;
    }
    let rearranged = compact[4..].iter().chain(compact[..4].iter());
    let mut rem: u32 = 0;
    for c in rearranged {
        let v = if c.is_ascii_digit() {
            c.to_digit(10).unwrap_or(0)
        } else {
            *c as u32 - 'A' as u32 + 10
        };
        rem = if v >= 10 {
            (rem * 100 + v) % 97
        } else {
            (rem * 10 + v) % 97
        };
    }
    rem == 1
}

/// Map fullwidth ASCII forms (U+FF01..U+FF5E) and U+3000 to ASCII. Returns the normalised text and,
/// for each byte offset of it, the byte offset in the original (plus one entry for the end); `None`
/// when the text has no such forms (then offsets are the identity and nothing is allocated).
fn normalise(s: &str) -> Option<(String, Vec<usize>)> {
    if !s
        .chars()
        .any(|c| matches!(c as u32, 0xFF01..=0xFF5E | 0x3000))
    {
        return None;
    }
    let mut out = String::with_capacity(s.len());
    let mut map = Vec::with_capacity(s.len() + 1);
    for (i, c) in s.char_indices() {
        let n = match c as u32 {
            0xFF01..=0xFF5E => char::from_u32(c as u32 - 0xFF01 + 0x21).unwrap_or(c),
            0x3000 => ' ',
            _ => c,
        };
        for _ in 0..n.len_utf8() {
            map.push(i);
        }
        out.push(n);
    }
    map.push(s.len());
    Some((out, map))
}

impl Masker {
    pub fn new(specs: &[RuleSpec]) -> Result<Masker, RuleError> {
        let mut rules = Vec::with_capacity(specs.len());
        for s in specs {
            let err = |reason: String| RuleError {
                name: s.name.clone(),
                reason,
            };
            let re = regex::RegexBuilder::new(&s.pattern)
                .size_limit(1 << 20)
                .build()
                .map_err(|e| err(format!("invalid pattern ({e})")))?;
            let validator: Option<fn(&str) -> bool> = match s.validator.as_deref() {
                None => None,
                Some("luhn") => Some(luhn),
                Some("iban") => Some(iban),
                Some(_) => return Err(err("validator must be luhn, iban or NULL".into())),
            };
            rules.push(Rule {
                name: s.name.clone(),
                re,
                validator,
            });
        }
        Ok(Masker { rules })
    }

    /// Mask one string; adds to `counts`. Returns `None` when nothing matched (no allocation).
    ///
    /// The text is normalised once; rules run in order and a later rule never matches inside a span
    /// an earlier rule already masked; the output is built in one pass.
    pub fn mask_str(&self, text: &str, counts: &mut MaskCounts) -> Option<String> {
        let normalised = normalise(text);
        let (view, map): (&str, Option<&[usize]>) = match &normalised {
            Some((n, m)) => (n.as_str(), Some(m.as_slice())),
            None => (text, None),
        };
        let to_orig = |i: usize| map.map_or(i, |m| m[i]);
        // (start, end, rule index) in original byte offsets, non-overlapping.
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        for (idx, rule) in self.rules.iter().enumerate() {
            for m in rule.re.find_iter(view) {
                let (start, end) = (to_orig(m.start()), to_orig(m.end()));
                if spans.iter().any(|&(s, e, _)| start < e && s < end) {
                    continue;
                }
                if rule.validator.is_some_and(|v| !v(m.as_str())) {
                    continue;
                }
                spans.push((start, end, idx));
            }
        }
        if spans.is_empty() {
            return None;
        }
        spans.sort_unstable();
        let mut out = String::with_capacity(text.len());
        let mut last = 0;
        for (start, end, idx) in spans {
            let name = &self.rules[idx].name;
            out.push_str(&text[last..start]);
            out.push_str("[REDACTED:");
            out.push_str(name);
            out.push(']');
            last = end;
            *counts.entry(name.clone()).or_default() += 1;
        }
        out.push_str(&text[last..]);
        Some(out)
    }

    /// Mask every string (not keys) inside a JSON value, in place.
    pub fn mask_json(&self, v: &mut Value, counts: &mut MaskCounts) {
        match v {
            Value::String(s) => {
                if let Some(m) = self.mask_str(s, counts) {
                    *s = m;
                }
            }
            Value::Array(a) => a.iter_mut().for_each(|x| self.mask_json(x, counts)),
            Value::Object(o) => o.values_mut().for_each(|x| self.mask_json(x, counts)),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn masker() -> Masker {
        Masker::new(&default_rules()).unwrap()
    }

    fn mask(s: &str) -> (String, MaskCounts) {
        let mut c = MaskCounts::new();
        let out = masker()
            .mask_str(s, &mut c)
            .unwrap_or_else(|| s.to_string());
        (out, c)
    }

    #[test]
    fn validators() {
        assert!(luhn("4111 1111 1111 1111"));
        assert!(!luhn("4111 1111 1111 1112"));
        assert!(iban("DE89 3704 0044 0532 0130 00"));
        assert!(iban("GB82WEST12345698765432"));
        assert!(!iban("DE89 3704 0044 0532 0130 01"));
    }

    #[test]
    fn masks_each_kind() {
        let cases = [
            ("mail ivan.petrov@example.com now", "email"),
            ("mail ivan.petrov (at) example (dot) com now", "email"),
            ("call +49 30 1234 5678 today", "phone"),
            ("call (415) 555-0132 today", "phone"),
            ("card 4111 1111 1111 1111 exp", "card_number"),
            ("card 4111-1111-1111-1111 exp", "card_number"),
            ("iban DE89 3704 0044 0532 0130 00 ok", "iban"),
            ("key sk-proj-abcdefghijklmnopqrstuvwx ok", "openai_key"),
            ("aws AKIAIOSFODNN7EXAMPLE ok", "aws_access_key"),
            ("aws AKIA IOSF ODNN 7EXA MPLE ok", "aws_access_key"),
            ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U ok", "jwt"),
            ("Authorization: Bearer abcdefghijklmnop1234567890", "bearer_token"),
            ("card ４１１１ １１１１ １１１１ １１１１ exp", "card_number"),
            ("mail ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ now", "email"),
            ("aws ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ ok", "aws_access_key"),
        ];
        for (text, kind) in cases {
            let (out, counts) = mask(text);
            assert_eq!(counts.get(kind), Some(&1), "{text} -> {out} {counts:?}");
            assert!(out.contains(&format!("[REDACTED:{kind}]")), "{out}");
            assert!(out.starts_with(&text[..4]), "prefix kept: {out}");
        }
    }

    #[test]
    fn leaves_ordinary_text_alone() {
        for text in [
            "Invoice ACME-2026-0003 totals 1257.00 EUR, due 2026-10-04.",
            "Section 4.2.1 on page 17 of 500",
            "order 4111 1111 1111 1112 is not a card (Luhn fails)",
            "Настройка LDAP: раздел 6, страницы 6-9.",
        ] {
            let (out, counts) = mask(text);
            assert!(counts.is_empty(), "{text} -> {out} {counts:?}");
        }
    }

    #[test]
    fn json_strings_are_masked_and_counted() {
        let mut v = serde_json::json!({"a": ["x@y.org", {"b": "4111111111111111"}], "n": 4111111111111111u64});
        let mut c = MaskCounts::new();
        masker().mask_json(&mut v, &mut c);
        assert_eq!(v["a"][0], "[REDACTED:email]");
        assert_eq!(v["a"][1]["b"], "[REDACTED:card_number]");
        assert_eq!(c.values().sum::<u32>(), 2);
    }

    #[test]
    fn bad_rules_are_refused() {
        let bad = RuleSpec {
            name: "x".into(),
            pattern: "(".into(),
            validator: None,
        };
        assert!(Masker::new(&[bad]).is_err());
        let bad = RuleSpec {
            name: "x".into(),
            pattern: "a".into(),
            validator: Some("md5".into()),
        };
        assert!(Masker::new(&[bad]).is_err());
    }
}
