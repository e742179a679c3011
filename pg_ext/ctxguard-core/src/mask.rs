//! Masking of secrets and PII in tool results.
//!
//! Rules are regular expressions (the `regex` crate: no backtracking blow-ups) with an optional
//! validator (`luhn` for card numbers, `iban` for IBANs) that must accept a match before it is
//! masked. Matching runs on a normalised view of the text in which fullwidth ASCII forms
//! (`ＡＫＩＡ…`, `４１１１…`, `＠`) and the ideographic space become plain ASCII, so obfuscated
//! variants are caught; replacements are applied to the original text.
//!
//! **Cost.** Linear in the input: the text is normalised once (a byte search finds the forms to
//! map; most text has none). The built-in e-mail rule is searched by hand (a byte search for its
//! `@`, then byte classes: exactly its regex's matches, see `email.rs`). The other rules are
//! searched all at once, window by window (up to [`SEGMENT_BYTES`], cut where none can match), by
//! a multi-pattern regex that stops at the first match of any: a window without one is passed
//! over in that one search; at a match, the rules that match from there to the next cut (an
//! overlapping search says which) are searched there, and the search of all resumes at that cut.
//! A rule's search runs from left to right and resumes where its previous match ended. A match is
//! checked against the spans of earlier rules with a cursor (both are sorted), and the output is
//! built in one pass. The built-in rules use ASCII word boundaries (`(?-u:\b)`), which the regex crate's
//! DFA handles on any text; a Unicode `\b` makes the regex crate fall back to a slower engine on
//! non-ASCII text.
//!
//! **Bounds.** Every call takes a [`Scan`]: at most `limit` bytes of text per scan (a larger input
//! is refused with [`TooLarge`], never returned unmasked), and an interrupt callback run every
//! [`CHECK_BYTES`] bytes of work (each match counts [`MATCH_COST`] bytes), which the extension
//! implements with PostgreSQL's `CHECK_FOR_INTERRUPTS`. So that no single search runs long without
//! a check, a rule searches long texts in segments of about [`SEGMENT_BYTES`], cut at a character
//! the rule can never match (e.g. a line break or a comma for the built-in rules); a match can
//! never span such a character, so the result is exactly that of one search over the whole text.
//! A rule that can match every ASCII punctuation character, or that asserts the end of the text
//! (`$`, `\z`), is searched in one pass: its cost is bounded by the scan's size limit.

use std::collections::BTreeMap;

use regex::Regex;
use regex_automata::{meta, Input, MatchKind, PatternID, PatternSet};
use regex_syntax::hir::{Class, Hir, HirKind, Look};
use serde_json::{Map, Number, Value};

mod email;

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

/// The input of one [`Scan`] exceeds its size limit: nothing is returned (the caller refuses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("the text to mask exceeds the limit of {limit} bytes")]
pub struct TooLarge {
    pub limit: usize,
}

/// Bytes of work between two interrupt checks.
pub const CHECK_BYTES: usize = 64 * 1024;
/// Work one match counts for (so a check also runs every `CHECK_BYTES / MATCH_COST` matches).
pub const MATCH_COST: usize = 64;
/// Target length of the segments a long text is searched in.
pub const SEGMENT_BYTES: usize = 64 * 1024;
/// Target length of the chunks a text without a common cut for [`SEGMENT_BYTES`] / 2 is
/// searched in with all the rules at once (a longer one: each rule alone, in segments).
pub const CHUNK_BYTES: usize = 256;

/// The bounds of one masking job (one tool result, one `mask_text` call): a size limit over all
/// the text it masks, and an interrupt check run as the work goes.
pub struct Scan<F: FnMut()> {
    limit: usize,
    taken: usize,
    work: usize,
    interrupt: F,
}

impl<F: FnMut()> Scan<F> {
    /// At most `limit` bytes of text in all; `interrupt` runs every [`CHECK_BYTES`] of work (it may
    /// unwind, e.g. with a PostgreSQL cancel; the masker holds no state that outlives the call).
    pub fn new(limit: usize, interrupt: F) -> Scan<F> {
        Scan {
            limit,
            taken: 0,
            work: 0,
            interrupt,
        }
    }

    /// Bytes of text taken so far.
    pub fn taken(&self) -> usize {
        self.taken
    }

    /// Whether `bytes` more text could be taken (what [`Masker::mask_str`] of a text that long
    /// would refuse first), without taking it.
    pub fn fits(&self, bytes: usize) -> Result<(), TooLarge> {
        if self.taken.saturating_add(bytes) > self.limit {
            return Err(TooLarge { limit: self.limit });
        }
        Ok(())
    }

    fn take(&mut self, bytes: usize) -> Result<(), TooLarge> {
        self.taken = self.taken.saturating_add(bytes);
        if self.taken > self.limit {
            return Err(TooLarge { limit: self.limit });
        }
        Ok(())
    }

    fn work(&mut self, bytes: usize) {
        self.work = self.work.saturating_add(bytes);
        if self.work >= CHECK_BYTES {
            self.work = 0;
            (self.interrupt)();
        }
    }
}

impl Scan<fn()> {
    /// No size limit, no interrupt checks (tests, rule validation).
    pub fn unlimited() -> Scan<fn()> {
        Scan::new(usize::MAX, || {})
    }
}

/// A search by hand: `find_at(hay, at)` of a rule's regex, as `(start, end)`.
type FindAt = fn(&str, usize) -> Option<(usize, usize)>;

struct Rule {
    name: String,
    re: Regex,
    validator: Option<fn(&str) -> bool>,
    /// ASCII bytes this rule can never match and at which a segment may end; `None`: one pass.
    separators: Option<Box<[bool; 128]>>,
    /// A search by hand with exactly the matches of `re` (`find_at`'s), for a rule whose pattern
    /// is byte-identical to a built-in one that has such a search (the e-mail rule). Such a rule
    /// is searched over the whole text (in segments), not in the chunks of `any`.
    fast: Option<FindAt>,
}

/// A compiled rule set. Build once per backend (and whenever the rules change).
pub struct Masker {
    rules: Vec<Rule>,
    /// The rules without a search by hand (indices into `rules`, in order): the patterns of
    /// `any`, and the rules searched chunk by chunk.
    chunked: Vec<usize>,
    /// The patterns of `chunked` at once (`MatchKind::All`, as a `RegexSet`): in a chunk where
    /// `first` finds a match, which rules match.
    any: Option<meta::Regex>,
    /// The same patterns, leftmost-first: where the first match of any of them is. A window of
    /// at most [`SEGMENT_BYTES`] that none of them matches (most text; the keys and numbers of a
    /// JSON result; a result whose text was masked before) is passed over in one search. Built
    /// iff `any` is.
    first: Option<meta::Regex>,
    /// ASCII bytes at which every rule of `chunked` may be cut (the intersection of their
    /// separators): windows and chunks end there. `None`: one window.
    common: Option<Box<[bool; 128]>>,
}

/// Matches masked per rule name.
pub type MaskCounts = BTreeMap<String, u32>;

/// The built-in rules, in application order (tokens before the looser number patterns).
///
/// Word boundaries are ASCII (`(?-u:\b)`): a non-ASCII letter next to a secret counts as a
/// boundary, so `карта4111…` is masked too, and the fast engine runs on any text.
pub fn default_rules() -> Vec<RuleSpec> {
    let r = |name: &str, pattern: &str, validator: Option<&str>| RuleSpec {
        name: name.into(),
        pattern: pattern.into(),
        validator: validator.map(Into::into),
    };
    vec![
        r(
            "jwt",
            r"(?-u:\b)eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}",
            None,
        ),
        r(
            "bearer_token",
            r"(?i)(?-u:\b)bearer[ :]+[A-Za-z0-9._~+/-]{16,}=*",
            None,
        ),
        r(
            "openai_key",
            r"(?-u:\b)sk-(?:proj-|live-|test-|ant-)?[A-Za-z0-9_-]{16,}",
            None,
        ),
        r(
            "aws_access_key",
            r"(?-u:\b)(?:AKIA|ASIA)[ -]?(?:[A-Z0-9][ -]?){15}[A-Z0-9](?-u:\b)",
            None,
        ),
        r("email", email::PATTERN, None),
        r(
            "iban",
            r"(?i)(?-u:\b)[a-z]{2}[0-9]{2}(?:[ -]?[a-z0-9]{4}){2,7}(?:[ -]?[a-z0-9]{1,4})?(?-u:\b)",
            Some("iban"),
        ),
        r(
            "card_number",
            r"(?-u:\b)[0-9](?:[ -]?[0-9]){12,18}(?-u:\b)",
            Some("luhn"),
        ),
        r(
            "phone",
            r"(?:\+|(?-u:\b)00)[1-9][0-9]{0,2}(?:[ .-]?\(?[0-9]{1,4}\)?){2,5}(?-u:\b)|\(?(?-u:\b)[0-9]{3}\)?[ .-][0-9]{3}[ .-][0-9]{4}(?-u:\b)",
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

/// The normalised view of a text: fullwidth ASCII forms (U+FF01..U+FF5E) and U+3000 mapped to
/// ASCII. `None` when the text has no such forms (then offsets are the identity).
struct Normalised {
    text: String,
    /// `(view offset, original offset)` just after each mapped character, in order: between two
    /// entries, offsets differ by a constant.
    shifts: Vec<(usize, usize)>,
}

fn normalise(s: &str) -> Option<Normalised> {
    // In UTF-8, U+FF01..U+FF5E are EF BC 81..EF BD 9E and U+3000 is E3 80 80; EF and E3 are only
    // ever lead bytes, so a byte search finds every candidate (most text has none: one memchr pass).
    let bytes = s.as_bytes();
    let mapped = |i: usize| -> Option<u8> {
        match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (0xEF, Some(&b1 @ (0xBC | 0xBD)), Some(&b2)) => {
                let cp = 0xF000 | (u32::from(b1 & 0x3F) << 6) | u32::from(b2 & 0x3F);
                (0xFF01..=0xFF5E)
                    .contains(&cp)
                    .then(|| (cp - 0xFF01 + 0x21) as u8)
            }
            (0xE3, Some(0x80), Some(0x80)) => Some(b' '),
            _ => None,
        }
    };
    let mut found = memchr::memchr2_iter(0xEF, 0xE3, bytes)
        .filter_map(|i| mapped(i).map(|b| (i, b)))
        .peekable();
    found.peek()?;
    let mut text = String::with_capacity(s.len());
    let mut shifts = Vec::new();
    let mut last = 0;
    for (i, b) in found {
        text.push_str(&s[last..i]);
        text.push(char::from(b));
        last = i + 3;
        shifts.push((text.len(), last));
    }
    text.push_str(&s[last..]);
    Some(Normalised { text, shifts })
}

/// The masks [`Masker::find_masks`] found in one text: spans of the original text (start, end,
/// rule index), sorted and disjoint.
pub struct Masks<'m> {
    masker: &'m Masker,
    spans: Vec<(usize, usize, usize)>,
}

impl<'m> Masks<'m> {
    /// The masked text's length in bytes.
    pub fn masked_len(&self, text: &str) -> usize {
        self.pieces(text).map(str::len).sum()
    }

    /// The masked text, in pieces: the text between the masks and each mask's
    /// `[REDACTED:<rule>]`. `text` is the text the masks were found in.
    pub fn pieces<'a>(&'a self, text: &'a str) -> impl Iterator<Item = &'a str> + 'a {
        let mut last = 0;
        self.spans
            .iter()
            .flat_map(move |&(start, end, idx)| {
                debug_assert!(last <= start && start < end, "masks sorted and disjoint");
                let before = &text[last..start];
                last = end;
                [before, "[REDACTED:", &self.masker.rules[idx].name, "]"]
            })
            .chain(std::iter::once_with(move || {
                &text[self.spans.last().map_or(0, |s| s.1)..]
            }))
    }
}

/// Maps increasing view offsets to original offsets (a cursor over the shifts).
struct ToOriginal<'a> {
    shifts: &'a [(usize, usize)],
    next: usize,
}

impl ToOriginal<'_> {
    fn map(&mut self, view: usize) -> usize {
        while self.next < self.shifts.len() && self.shifts[self.next].0 <= view {
            self.next += 1;
        }
        match self.next.checked_sub(1).map(|i| self.shifts[i]) {
            Some((v, o)) => o + (view - v),
            None => view,
        }
    }
}

/// The ASCII bytes a pattern can match (any character of a literal or class), or `None` when the
/// pattern asserts the end of the text or a line (then it is searched in one pass).
fn matchable_ascii(hir: &Hir, out: &mut [bool; 128]) -> bool {
    match hir.kind() {
        HirKind::Empty => true,
        HirKind::Literal(lit) => {
            for &b in lit.0.iter() {
                if b < 128 {
                    out[b as usize] = true;
                }
            }
            true
        }
        HirKind::Class(Class::Unicode(c)) => {
            for r in c.iter() {
                for cp in (r.start() as u32)..=(r.end() as u32).min(127) {
                    out[cp as usize] = true;
                }
            }
            true
        }
        HirKind::Class(Class::Bytes(c)) => {
            for r in c.iter() {
                for b in r.start()..=r.end().min(127) {
                    out[b as usize] = true;
                }
            }
            true
        }
        HirKind::Look(look) => !matches!(look, Look::End | Look::EndLF | Look::EndCRLF),
        HirKind::Repetition(rep) => matchable_ascii(&rep.sub, out),
        HirKind::Capture(cap) => matchable_ascii(&cap.sub, out),
        HirKind::Concat(subs) | HirKind::Alternation(subs) => {
            subs.iter().all(|h| matchable_ascii(h, out))
        }
    }
}

/// Where a long text may be cut for this pattern: ASCII bytes it can never match that are not
/// word characters (so word-boundary assertions at a cut see what they would see in the whole
/// text). `None` when there are none, or when the pattern asserts an end.
fn separators(pattern: &str) -> Option<Box<[bool; 128]>> {
    let hir = regex_syntax::ParserBuilder::new()
        .build()
        .parse(pattern)
        .ok()?;
    let mut matchable = [false; 128];
    if !matchable_ascii(&hir, &mut matchable) {
        return None;
    }
    let mut sep = [false; 128];
    for (b, s) in sep.iter_mut().enumerate() {
        let word = (b as u8).is_ascii_alphanumeric() || b == b'_' as usize;
        *s = !matchable[b] && !word;
    }
    sep.contains(&true).then(|| Box::new(sep))
}

/// The forms of a number that digit rules should see: its text; or, for a number written with
/// an exponent (`4.111111111111111e15`), its mantissa and, when that has at most 64 digits, its
/// plain decimal form (the exponent itself is never matched: `1e+400` is not a phone number).
fn number_forms(n: &Number) -> Vec<String> {
    let text = n.to_string();
    let Some(e_at) = text.find(['e', 'E']) else {
        return vec![text];
    };
    let (mantissa, exp) = (&text[..e_at], &text[e_at + 1..]);
    let mut forms = vec![mantissa.to_string()];
    let Ok(exp) = exp.parse::<i64>() else {
        return forms;
    };
    let (sign, unsigned) = match mantissa.strip_prefix('-') {
        Some(m) => ("-", m),
        None => ("", mantissa),
    };
    let (int, frac) = unsigned.split_once('.').unwrap_or((unsigned, ""));
    let all = format!("{int}{frac}");
    let lead = all.len() - all.trim_start_matches('0').len();
    let digits = &all[lead..];
    // Position of the decimal point within `digits`.
    let point = int.len() as i64 - lead as i64 + exp;
    if digits.is_empty() || point.unsigned_abs() > 64 || digits.len() > 64 {
        return forms;
    }
    forms.push(if point >= digits.len() as i64 {
        format!(
            "{sign}{digits}{}",
            "0".repeat(point as usize - digits.len())
        )
    } else if point <= 0 {
        format!("{sign}0.{}{digits}", "0".repeat((-point) as usize))
    } else {
        let (a, b) = digits.split_at(point as usize);
        format!("{sign}{a}.{b}")
    });
    forms
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
            // Only the built-in pattern itself: a custom rule, however close, runs its regex.
            let fast = (s.pattern == email::PATTERN).then_some(email::find_at as FindAt);
            rules.push(Rule {
                name: s.name.clone(),
                re,
                validator,
                separators: separators(&s.pattern),
                fast,
            });
        }
        let chunked: Vec<usize> = (0..rules.len())
            .filter(|&i| rules[i].fast.is_none())
            .collect();
        let patterns: Vec<&str> = chunked.iter().map(|&i| specs[i].pattern.as_str()).collect();
        let set = |kind| {
            meta::Regex::builder()
                .configure(
                    meta::Regex::config()
                        .match_kind(kind)
                        .nfa_size_limit(Some(8 << 20)),
                )
                .build_many(&patterns)
                .ok()
        };
        let (any, first) = match (set(MatchKind::All), set(MatchKind::LeftmostFirst)) {
            (Some(any), Some(first)) => (Some(any), Some(first)),
            _ => (None, None),
        };
        let common = chunked
            .iter()
            .try_fold(Box::new([true; 128]), |mut acc, &i| {
                let sep = rules[i].separators.as_ref()?;
                for (a, s) in acc.iter_mut().zip(sep.iter()) {
                    *a &= *s;
                }
                Some(acc)
            });
        let common = common.filter(|c| !chunked.is_empty() && c.contains(&true));
        Ok(Masker {
            rules,
            chunked,
            any,
            first,
            common,
        })
    }

    /// The spans (view offsets) of one rule's accepted matches that start in `from..to`, in
    /// order, appended to `out`. `to` is the end of the view or a byte no match can hold (a cut).
    /// Empty matches are ignored.
    fn find<F: FnMut()>(
        &self,
        rule: &Rule,
        view: &str,
        (from, to): (usize, usize),
        scan: &mut Scan<F>,
        out: &mut Vec<(usize, usize)>,
    ) {
        let bytes = view.as_bytes();
        let n = to;
        let mut pos = from;
        while pos < n {
            // The segment ends at the first separator at least SEGMENT_BYTES ahead (no match can
            // contain it), or at the end of the range.
            let seg_end = match &rule.separators {
                Some(sep) if n - pos > SEGMENT_BYTES => {
                    let from = pos + SEGMENT_BYTES;
                    let cut = bytes[from..n]
                        .iter()
                        .position(|&b| b < 128 && sep[b as usize])
                        .map_or(n, |i| from + i);
                    scan.work(cut - from);
                    cut
                }
                _ => n,
            };
            // The haystack keeps everything before `at`, so look-behind sees the real context.
            let hay = &view[..seg_end];
            let mut at = pos;
            while at < seg_end {
                let found = match rule.fast {
                    Some(find_at) => find_at(hay, at),
                    None => rule.re.find_at(hay, at).map(|m| (m.start(), m.end())),
                };
                let Some((start, end)) = found else {
                    scan.work(seg_end - at);
                    break;
                };
                scan.work(end - at + MATCH_COST);
                if start == end {
                    at = end + view[end..].chars().next().map_or(1, char::len_utf8);
                    continue;
                }
                if rule.validator.is_none_or(|v| v(&hay[start..end])) {
                    out.push((start, end));
                }
                at = end;
            }
            pos = seg_end;
        }
    }

    /// Every rule of `chunked` over `from..to` (in segments).
    fn find_all<F: FnMut()>(
        &self,
        view: &str,
        range: (usize, usize),
        scan: &mut Scan<F>,
        found: &mut [Vec<(usize, usize)>],
    ) {
        for &idx in &self.chunked {
            self.find(&self.rules[idx], view, range, scan, &mut found[idx]);
        }
    }

    /// The end of the chunk that starts at `pos`: the first common cut at least [`CHUNK_BYTES`]
    /// ahead, or the end of the text (also without common cuts, or for a text of one chunk).
    fn chunk_end<F: FnMut()>(&self, bytes: &[u8], pos: usize, scan: &mut Scan<F>) -> usize {
        let n = bytes.len();
        match &self.common {
            Some(cut) if n - pos > CHUNK_BYTES => {
                let from = pos + CHUNK_BYTES;
                let end = bytes[from..]
                    .iter()
                    .position(|&b| b < 128 && cut[b as usize])
                    .map_or(n, |i| from + i);
                scan.work(end - from);
                end
            }
            _ => n,
        }
    }

    /// The first common cut at or after `from`, or the end of the text (also without common cuts).
    fn cut_from<F: FnMut()>(&self, bytes: &[u8], from: usize, scan: &mut Scan<F>) -> usize {
        let n = bytes.len();
        match &self.common {
            Some(cut) if from < n => {
                let end = bytes[from..]
                    .iter()
                    .position(|&b| b < 128 && cut[b as usize])
                    .map_or(n, |i| from + i);
                scan.work(end - from);
                end
            }
            _ => n,
        }
    }

    /// Mask one string; adds to `counts`. `Ok(None)` when nothing matched (no allocation).
    ///
    /// Rules run in order; a later rule's match that overlaps a span an earlier rule masked is
    /// dropped; the output is built in one pass, in one allocation of its final size.
    pub fn mask_str<F: FnMut()>(
        &self,
        text: &str,
        counts: &mut MaskCounts,
        scan: &mut Scan<F>,
    ) -> Result<Option<String>, TooLarge> {
        Ok(self.find_masks(text, counts, scan)?.map(|masks| {
            let mut out = String::with_capacity(masks.masked_len(text));
            masks.pieces(text).for_each(|p| out.push_str(p));
            out
        }))
    }

    /// Where `text`'s masks go, as [`Masker::mask_str`] masks it (adds to `counts`); `Ok(None)`
    /// when nothing matched. The masked text is [`Masks::pieces`]: a caller may write it where it
    /// is needed (a `jsonb` datum) without a copy in between.
    pub fn find_masks<'m, F: FnMut()>(
        &'m self,
        text: &str,
        counts: &mut MaskCounts,
        scan: &mut Scan<F>,
    ) -> Result<Option<Masks<'m>>, TooLarge> {
        scan.take(text.len())?;
        scan.work(text.len() / 8);
        let normalised = normalise(text);
        let view = normalised.as_ref().map_or(text, |n| n.text.as_str());
        // Each rule's matches, in order, window by window and chunk by chunk: the rules `any`
        // finds in a chunk are searched there (a match cannot cross a common cut, no rule matches
        // between the chunks, and each search sees the text before it, so the matches are those of
        // one search over the whole text). Without common cuts the text is one window. A window
        // longer than SEGMENT_BYTES is searched by every rule (in segments), never by all rules at
        // once: that search would run without interrupt checks.
        let mut found: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.rules.len()];
        // A rule with a search by hand: over the whole text, in segments (its matches are those
        // of its regex; the order in which rules are searched does not matter, spans are merged
        // in rule order below).
        for (idx, rule) in self.rules.iter().enumerate() {
            if rule.fast.is_some() {
                self.find(rule, view, (0, view.len()), scan, &mut found[idx]);
            }
        }
        let mut hits = PatternSet::new(self.chunked.len().max(1));
        let bytes = view.as_bytes();
        let n = view.len();
        let mut pos = 0;
        while pos < n && !self.chunked.is_empty() {
            // A window of about SEGMENT_BYTES / 2 or more, up to a common cut; if that is longer
            // than SEGMENT_BYTES, the chunk (of about CHUNK_BYTES) that starts here.
            let mut end = self.cut_from(bytes, pos + SEGMENT_BYTES / 2, scan);
            if end - pos > SEGMENT_BYTES {
                end = self.chunk_end(bytes, pos, scan);
            }
            let (Some(any), Some(first)) = (&self.any, &self.first) else {
                self.find_all(view, (pos, end), scan, &mut found);
                pos = end;
                continue;
            };
            if end - pos > SEGMENT_BYTES {
                self.find_all(view, (pos, end), scan, &mut found);
                pos = end;
                continue;
            }
            // Where the first match of any rule is (a search that stops there: most windows
            // have none); no rule matches before its start.
            let Some(m) = first.find(Input::new(&view[..end]).range(pos..end)) else {
                scan.work(end - pos);
                pos = end;
                continue;
            };
            scan.work(m.end() - pos);
            // The chunk from its start to the first common cut at or after its end (past its
            // start at least: an empty match at a cut), searched by the rules that match there
            // (which: the overlapping search of all rules). No rule matches in pos..from, so each
            // rule's search from `from` finds what its search over the whole text finds.
            let from = m.start();
            let to = self.cut_from(bytes, m.end().max(from + 1), scan).min(end);
            let chunk = Input::new(&view[..to]).range(from..to);
            hits.clear();
            any.which_overlapping_matches(&chunk, &mut hits);
            scan.work(to - from);
            for (pid, &idx) in self.chunked.iter().enumerate() {
                if !hits.contains(PatternID::new_unchecked(pid)) {
                    continue;
                }
                let rule = &self.rules[idx];
                if pid == m.pattern().as_usize() && m.start() < m.end() {
                    // The rule the search found: its first match here is that match (the
                    // leftmost start, and the end its own search prefers), its search resumes
                    // after it.
                    scan.work(MATCH_COST);
                    if rule.validator.is_none_or(|v| v(&view[m.start()..m.end()])) {
                        found[idx].push((m.start(), m.end()));
                    }
                    self.find(rule, view, (m.end(), to), scan, &mut found[idx]);
                } else {
                    self.find(rule, view, (from, to), scan, &mut found[idx]);
                }
            }
            pos = to;
        }
        // Accepted spans (view offsets, rule index): sorted and disjoint.
        let mut spans: Vec<(usize, usize, usize)> = Vec::new();
        for (idx, fresh) in found.iter().enumerate() {
            if fresh.is_empty() {
                continue;
            }
            let mut merged = Vec::with_capacity(spans.len() + fresh.len());
            let mut i = 0;
            for &(s, e) in fresh {
                while i < spans.len() && spans[i].1 <= s {
                    merged.push(spans[i]);
                    i += 1;
                }
                // spans[i], if any, ends after s: the match overlaps it iff it starts before e.
                if i < spans.len() && spans[i].0 < e {
                    continue;
                }
                merged.push((s, e, idx));
            }
            merged.extend_from_slice(&spans[i..]);
            spans = merged;
        }
        if spans.is_empty() {
            return Ok(None);
        }
        let mut to_orig = ToOriginal {
            shifts: normalised.as_ref().map_or(&[], |n| n.shifts.as_slice()),
            next: 0,
        };
        let mut per_rule = vec![0u32; self.rules.len()];
        for span in &mut spans {
            (span.0, span.1) = (to_orig.map(span.0), to_orig.map(span.1));
            per_rule[span.2] += 1;
        }
        for (rule, n) in self.rules.iter().zip(per_rule) {
            if n > 0 {
                *counts.entry(rule.name.clone()).or_default() += n;
            }
        }
        Ok(Some(Masks {
            masker: self,
            spans,
        }))
    }

    /// A number whose digits a rule matches (a card number as a JSON number): its masked text,
    /// which replaces the number as a string.
    fn mask_number<F: FnMut()>(
        &self,
        n: &Number,
        counts: &mut MaskCounts,
        scan: &mut Scan<F>,
    ) -> Result<Option<String>, TooLarge> {
        for form in number_forms(n) {
            if let Some(m) = self.mask_str(&form, counts, scan)? {
                return Ok(Some(m));
            }
        }
        Ok(None)
    }

    /// Mask every string inside a JSON value, object keys included, and every number whose
    /// digits a rule matches (replaced by its masked text as a string), in place.
    ///
    /// Two keys that mask to the same text are both kept: the later one gets a `#2`, `#3`, …
    /// suffix. On [`TooLarge`] the value is partly masked and must not be returned.
    pub fn mask_json<F: FnMut()>(
        &self,
        v: &mut Value,
        counts: &mut MaskCounts,
        scan: &mut Scan<F>,
    ) -> Result<(), TooLarge> {
        match v {
            Value::String(s) => {
                if let Some(m) = self.mask_str(s, counts, scan)? {
                    *s = m;
                }
            }
            Value::Number(n) => {
                if let Some(m) = self.mask_number(n, counts, scan)? {
                    *v = Value::String(m);
                }
            }
            Value::Array(a) => {
                for x in a.iter_mut() {
                    self.mask_json(x, counts, scan)?;
                }
            }
            Value::Object(o) => {
                for x in o.values_mut() {
                    self.mask_json(x, counts, scan)?;
                }
                let mut renamed: Vec<Option<String>> = Vec::with_capacity(o.len());
                for k in o.keys() {
                    renamed.push(self.mask_str(k, counts, scan)?);
                }
                if renamed.iter().any(Option::is_some) {
                    let old = std::mem::take(o);
                    for ((k, x), r) in old.into_iter().zip(renamed) {
                        let key = unique_key(o, r.unwrap_or(k));
                        o.insert(key, x);
                    }
                }
            }
            Value::Null | Value::Bool(_) => {}
        }
        Ok(())
    }
}

/// `key`, or `key#2`, `key#3`, … if `o` already holds it.
fn unique_key(o: &Map<String, Value>, key: String) -> String {
    if !o.contains_key(&key) {
        return key;
    }
    (2..)
        .map(|i| format!("{key}#{i}"))
        .find(|k| !o.contains_key(k))
        .unwrap_or(key)
}

/// xorshift64*: a fixed sequence of numbers below `n` from `seed`, no dependency (the tests'
/// generated texts).
#[cfg(test)]
fn test_rng(seed: u64) -> impl FnMut(usize) -> usize {
    let mut state = seed;
    move |n| {
        state ^= state >> 12;
        state ^= state << 25;
        state ^= state >> 27;
        (state.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 33) as usize % n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn masker() -> Masker {
        Masker::new(&default_rules()).unwrap()
    }

    fn mask_with(m: &Masker, s: &str) -> (String, MaskCounts) {
        let mut c = MaskCounts::new();
        let out = m
            .mask_str(s, &mut c, &mut Scan::unlimited())
            .unwrap()
            .unwrap_or_else(|| s.to_string());
        (out, c)
    }

    #[test]
    fn masks_pieces_are_the_masked_text() {
        // What mask_text writes into its jsonb datum: the pieces, of the measured length, are the
        // masked text; fullwidth text (masks found in the normalised view) and masks at both ends.
        let m = masker();
        for s in [
            "ivan.petrov@example.com",
            "mail ivan.petrov@example.com, card 4111 1111 1111 1111 and AKIAIOSFODNN7EXAMPLE",
            "Obfuscated ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ　and Настройка +49 30 1234 5678",
            "nothing here",
        ] {
            let (want, want_counts) = mask_with(&m, s);
            let mut counts = MaskCounts::new();
            match m
                .find_masks(s, &mut counts, &mut Scan::unlimited())
                .unwrap()
            {
                Some(masks) => {
                    let got: String = masks.pieces(s).collect();
                    assert_eq!(got, want);
                    assert_eq!(masks.masked_len(s), want.len());
                }
                None => assert_eq!(s, want),
            }
            assert_eq!(counts, want_counts);
        }
    }

    /// The masker without prefilter, chunks nor searches by hand: each rule's regex over the whole
    /// text (what the masker must give).
    fn plain(specs: &[RuleSpec]) -> Masker {
        let mut rules = Masker::new(specs).unwrap().rules;
        for r in &mut rules {
            r.fast = None;
        }
        Masker {
            chunked: (0..rules.len()).collect(),
            rules,
            any: None,
            first: None,
            common: None,
        }
    }

    fn mask(s: &str) -> (String, MaskCounts) {
        mask_with(&masker(), s)
    }

    fn mask_value(mut v: Value) -> (Value, MaskCounts) {
        let mut c = MaskCounts::new();
        masker()
            .mask_json(&mut v, &mut c, &mut Scan::unlimited())
            .unwrap();
        (v, c)
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
            // Next to Cyrillic letters (a Unicode \b would see no boundary here).
            ("карта4111 1111 1111 1111", "card_number"),
            ("почта:ivan@example.com", "email"),
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
    fn fullwidth_offsets_map_back_to_the_original() {
        let text =
            "ａ１ x ４１１１ １１１１ １１１１ １１１１ y ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ z　end";
        let (out, counts) = mask(text);
        assert_eq!(
            out,
            "ａ１ x [REDACTED:card_number] y [REDACTED:email] z　end"
        );
        assert_eq!(counts.values().sum::<u32>(), 2);
    }

    #[test]
    fn later_rules_do_not_mask_inside_earlier_spans() {
        // The card number inside the IBAN-shaped text is not masked twice; a later overlapping
        // phone match is dropped.
        let (out, counts) = mask("pay DE89 3704 0044 0532 0130 00 and card 4111 1111 1111 1111");
        assert_eq!(out, "pay [REDACTED:iban] and card [REDACTED:card_number]");
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn json_strings_keys_and_numbers_are_masked_and_counted() {
        let (v, c) = mask_value(json!({
            "a": ["x@y.org", {"b": "4111111111111111"}],
            "n": 4111111111111111u64,
            "ivan.petrov@example.com": {"card 4111 1111 1111 1111": true},
            "ok": 42,
            "price": 1257.5
        }));
        assert_eq!(v["a"][0], "[REDACTED:email]");
        assert_eq!(v["a"][1]["b"], "[REDACTED:card_number]");
        assert_eq!(v["n"], "[REDACTED:card_number]");
        assert_eq!(
            v["[REDACTED:email]"],
            json!({"card [REDACTED:card_number]": true})
        );
        assert_eq!(v["ok"], 42);
        assert_eq!(v["price"], json!(1257.5));
        assert_eq!(c.get("email"), Some(&2));
        assert_eq!(c.get("card_number"), Some(&3));
        let text = v.to_string();
        assert!(!text.contains("4111") && !text.contains("ivan"), "{text}");
    }

    #[test]
    fn numbers_in_other_notations_are_masked() {
        for raw in [
            "4111111111111111",
            "-4111111111111111",
            "4111111111111111.0",
            "4.111111111111111e15",
            "4111111111111111E0",
            "0.4111111111111111e16",
            "41111111111111110e-1",
            "4111111111111111e400",
        ] {
            let v: Value = serde_json::from_str(&format!("{{\"n\": {raw}}}")).unwrap();
            let (v, _) = mask_value(v);
            assert!(
                v["n"]
                    .as_str()
                    .is_some_and(|s| s.contains("[REDACTED:card_number]")),
                "{raw} -> {v}"
            );
        }
        for raw in [
            "1e400",
            "1e+400",
            "1E-400",
            "12345678901234567.89",
            "0.10",
            "-0.0000001",
            "3",
        ] {
            let v: Value = serde_json::from_str(&format!("{{\"n\": {raw}}}")).unwrap();
            let (masked, c) = mask_value(v.clone());
            assert_eq!(masked, v, "{raw}");
            assert!(c.is_empty());
        }
    }

    #[test]
    fn colliding_keys_are_all_kept() {
        let (v, _) = mask_value(json!({"a@b.org": 1, "c@d.org": 2, "[REDACTED:email]": 3}));
        let o = v.as_object().unwrap();
        assert_eq!(o.len(), 3, "{v}");
        let mut values: Vec<i64> = o.values().map(|x| x.as_i64().unwrap()).collect();
        values.sort();
        assert_eq!(values, [1, 2, 3]);
        assert!(o.keys().all(|k| k.starts_with("[REDACTED:email]")), "{v}");
    }

    #[test]
    fn long_texts_are_masked_like_short_ones() {
        // Secrets on both sides of many segment cuts (lines and commas are cut points).
        let mut text = String::new();
        let mut want = String::new();
        for i in 0..20_000 {
            let filler = "x".repeat(i % 37);
            text.push_str(&format!(
                "{filler} user{i}@example.com, card 4111 1111 1111 1111\n"
            ));
            want.push_str(&format!(
                "{filler} [REDACTED:email], card [REDACTED:card_number]\n"
            ));
        }
        let (out, counts) = mask(&text);
        assert_eq!(counts.get("email"), Some(&20_000));
        assert_eq!(counts.get("card_number"), Some(&20_000));
        assert!(
            out == want,
            "segmented masking differs from the expected text"
        );
        // One long line without any cut point for the email rule (spaces and dots only).
        let line: String = (0..20_000).map(|i| format!("u{i}@example.com ")).collect();
        let (out, counts) = mask(&line);
        assert_eq!(counts.get("email"), Some(&20_000));
        assert!(!out.contains('@'));
    }

    #[test]
    fn chunked_prefilter_masks_like_every_rule_over_the_whole_text() {
        // The masker searches a rule only in the chunks where all rules at once find it; the same
        // rules searched one by one over the whole text (no prefilter, no chunks) must give the
        // same text and counts. Lines of three scripts, secrets of every rule on both sides of
        // chunk cuts, fullwidth forms, matches a validator rejects, and long lines without cuts.
        let m = masker();
        let plain = plain(&default_rules());
        let secrets = [
            "ivan.petrov@example.com",
            "4111 1111 1111 1111",
            "4111 1111 1111 1112",
            "DE89 3704 0044 0532 0130 00",
            "DE89 3704 0044 0532 0130 01",
            "+49 30 1234 5678",
            "(415) 555-0132",
            "sk-proj-abcdefghijklmnopqrstuvwx",
            "AKIAIOSFODNN7EXAMPLE",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "Bearer abcdefghijklmnop1234567890",
            "ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ",
            "４１１１ １１１１ １１１１ １１１１",
        ];
        let mut text = String::new();
        for i in 0..6_000usize {
            match i % 5 {
                0 => text.push_str(
                    "Настройка узла srv-12: установите quota_mb в 77 и перезапустите службу.",
                ),
                1 => text.push_str(
                    "ノード srv-3 の設定: quota_mb を 3 にしてから　orion-api を再起動します。",
                ),
                2 => text.push_str(
                    "Invoice ACME-2026-0003 totals 1257.00 EUR, due 2026-10-04; page 17.",
                ),
                3 => text.push_str(&"word ".repeat(i % 97)),
                _ => {}
            }
            if i % 3 == 0 {
                text.push_str(secrets[i % secrets.len()]);
            }
            text.push_str(if i % 7 == 0 { " " } else { "\n" });
        }
        let (a, ca) = mask_with(&m, &text);
        let (b, cb) = mask_with(&plain, &text);
        assert_eq!(ca, cb);
        assert!(a == b, "chunked masking differs from the plain search");
        assert!(ca.len() >= 8, "{ca:?}");
    }

    #[test]
    fn prefilter_masks_like_every_rule_over_random_text() {
        // Differential: random texts of prose in three scripts, fullwidth forms, secrets of every
        // rule (some a validator rejects, some glued to letters or to each other) and cut points,
        // in runs of random length so that matches fall on both sides of chunk edges and chunks
        // hold no match, one rule or several. The masker (the first-match search per chunk, then
        // which rules match, then those rules) must give the text and counts of the rules
        // searched one by one over the whole text.
        let m = masker();
        let plain = plain(&default_rules());
        let pieces = [
            "ivan.petrov@example.com",
            "a.b (at) c (dot) org",
            "4111 1111 1111 1111",
            "4111-1111-1111-1112",
            "DE89 3704 0044 0532 0130 00",
            "GB82WEST12345698765432",
            "+49 30 1234 5678",
            "(415) 555-0132",
            "0049 89 123456",
            "sk-proj-abcdefghijklmnopqrstuvwx",
            "AKIA IOSF ODNN 7EXA MPLE",
            "ASIAIOSFODNN7EXAMPLE",
            "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
            "Bearer abcdefghijklmnop1234567890==",
            "ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ",
            "４１１１ １１１１ １１１１ １１１１",
            "ＡＫＩＡＩＯＳＦＯＤＮＮ７ＥＸＡＭＰＬＥ",
            "Настройка узла srv-12: quota_mb 77",
            "ノード srv-3 の設定　orion-api",
            "Invoice ACME-2026-0003 totals 1257.00 EUR, due 2026-10-04",
            "word",
            "карта",
            "x",
            "7",
            " ",
            ", ",
            "\n",
            "\n\n",
            "@",
            ".",
            "-",
        ];
        let mut next = test_rng(0x9E37_79B9_7F4A_7C15);
        let mut total = MaskCounts::new();
        for _ in 0..300 {
            let mut text = String::new();
            let len = 1 + next(3_000);
            while text.len() < len {
                text.push_str(pieces[next(pieces.len())]);
                if next(3) == 0 {
                    text.push_str(&"y".repeat(next(300)));
                }
            }
            let (a, ca) = mask_with(&m, &text);
            let (b, cb) = mask_with(&plain, &text);
            assert_eq!(ca, cb, "counts differ on a text of {} bytes", text.len());
            assert!(
                a == b,
                "masked text differs on a text of {} bytes",
                text.len()
            );
            for (k, v) in ca {
                *total.entry(k).or_default() += v;
            }
        }
        // Every rule was exercised.
        assert_eq!(total.len(), 8, "{total:?}");
    }

    #[test]
    fn only_the_built_in_email_pattern_is_searched_by_hand() {
        let rule = |name: &str, pattern: &str| RuleSpec {
            name: name.into(),
            pattern: pattern.into(),
            validator: None,
        };
        let m = Masker::new(&default_rules()).unwrap();
        let fast: Vec<&str> = m
            .rules
            .iter()
            .filter(|r| r.fast.is_some())
            .map(|r| r.name.as_str())
            .collect();
        assert_eq!(fast, ["email"]);
        assert_eq!(m.chunked.len(), m.rules.len() - 1);
        // The same pattern under another name is the same search; a pattern one byte apart (a
        // DBA's variant) runs its own regex, and masks what that regex matches.
        let m = Masker::new(&[rule("mail", email::PATTERN)]).unwrap();
        assert!(m.rules[0].fast.is_some() && m.chunked.is_empty());
        assert_eq!(mask_with(&m, "to a@b.org now").0, "to [REDACTED:mail] now");
        let variant = email::PATTERN.replace("[a-z]{2,}", "[a-z]{3,}");
        let m = Masker::new(&[rule("mail", &variant)]).unwrap();
        assert!(m.rules[0].fast.is_none() && m.chunked == [0]);
        assert_eq!(
            mask_with(&m, "to a@b.org, c@d.io").0,
            "to [REDACTED:mail], c@d.io"
        );
    }

    #[test]
    fn email_lists_are_masked_like_every_rule_over_the_whole_text() {
        // Differential, on the texts where the e-mail search does most of the work: address
        // lists (one per line, on one line, glued, with spaced and bracketed forms, ſ and K,
        // fullwidth forms) mixed with secrets of the other rules and prose in three scripts. The
        // masker (the e-mail rule searched by hand over the whole text, the others chunk by
        // chunk) must give the text and counts of every rule's regex over the whole text, also
        // for a custom rule set that holds the built-in e-mail rule among others.
        let pieces = [
            "user1@mail1.example.com",
            "ivan.petrov (at) example (dot) com",
            "a [AT] b [dot] cc",
            "x(at)y(dot)zz",
            "aſ@k\u{212A}.example.ſſ",
            "a\u{212A}@b.c\u{212A}",
            "ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ",
            "ivan＠example．com",
            "a@b.c1.dd",
            "@",
            "(at)",
            ".",
            "4111 1111 1111 1111",
            "DE89 3704 0044 0532 0130 00",
            "+49 30 1234 5678",
            "Bearer abcdefghijklmnop1234567890",
            "Настройка узла srv-12: quota_mb 77",
            "ノード srv-3 の設定　orion-api",
            "word",
            " ",
            ", ",
            "\n",
            "é",
        ];
        let mut custom = vec![RuleSpec {
            name: "ticket".into(),
            pattern: r"(?-u:\b)ACME-[0-9]{4}-[0-9]+".into(),
            validator: None,
        }];
        custom.extend(default_rules().into_iter().skip(4).take(2));
        let sets = [default_rules(), custom];
        let mut next = test_rng(0x0123_4567_89AB_CDEF);
        for specs in &sets {
            let m = Masker::new(specs).unwrap();
            let plain = plain(specs);
            let mut emails = 0;
            for round in 0..200 {
                let mut text = String::new();
                // Some texts longer than a segment, so that the search by hand runs in several.
                let len = if round % 50 == 0 {
                    3 * SEGMENT_BYTES
                } else {
                    1 + next(4_000)
                };
                while text.len() < len {
                    text.push_str(pieces[next(pieces.len())]);
                    if next(4) == 0 {
                        text.push_str(if next(2) == 0 { "\n" } else { " " });
                    }
                }
                let (a, ca) = mask_with(&m, &text);
                let (b, cb) = mask_with(&plain, &text);
                assert_eq!(ca, cb, "counts differ on a text of {} bytes", text.len());
                assert!(
                    a == b,
                    "masked text differs on a text of {} bytes",
                    text.len()
                );
                emails += ca.get("email").copied().unwrap_or(0);
            }
            assert!(emails > 10_000, "{emails}");
        }
    }

    #[test]
    fn rules_matching_at_the_same_place_are_masked_like_each_rule_alone() {
        // Differential: custom rules that match at the same starts with other ends (lazy and
        // greedy, alternations, a validator), over random texts of a small alphabet: the window
        // search's match is taken as its rule's first match, the others are searched.
        let rule = |name: &str, pattern: &str, validator: Option<&str>| RuleSpec {
            name: name.into(),
            pattern: pattern.into(),
            validator: validator.map(Into::into),
        };
        let sets = [
            vec![rule("a", r"[0-9]{3}", None), rule("b", r"[0-9 ]+", None)],
            vec![
                rule("a", r"[0-9]+?5", None),
                rule("b", r"[0-9]{2}|[0-9]{4}", None),
            ],
            vec![
                rule("card", r"[0-9](?:[ -]?[0-9]){12,18}", Some("luhn")),
                rule("digits", r"(?:1|11|111)(?:[ -]?1)*", None),
                rule("x", r"x(?:yz|y)|xyzz", None),
            ],
        ];
        let alphabet = [
            "1",
            "5",
            "0",
            " ",
            "-",
            ",",
            "\n",
            "x",
            "y",
            "z",
            "4111 1111 1111 1111",
        ];
        let mut next = test_rng(0x5DEE_CE66_D1CE_4E5B);
        for specs in &sets {
            let (m, plain) = (Masker::new(specs).unwrap(), plain(specs));
            for _ in 0..2_000 {
                let text: String = (0..next(120))
                    .map(|_| alphabet[next(alphabet.len())])
                    .collect();
                let (a, ca) = mask_with(&m, &text);
                let (b, cb) = mask_with(&plain, &text);
                assert_eq!((a, ca), (b, cb), "{text:?}");
            }
        }
    }

    #[test]
    fn separators_respect_what_a_rule_can_match() {
        let sep = |p: &str| {
            separators(p).map(|s| {
                (0..128u8)
                    .filter(|&b| s[b as usize])
                    .map(char::from)
                    .collect::<String>()
            })
        };
        let card = sep(&default_rules()[6].pattern).unwrap();
        assert!(card.contains('\n') && card.contains(',') && card.contains('@'));
        assert!(!card.contains(' ') && !card.contains('-') && !card.contains('a'));
        let email = sep(&default_rules()[4].pattern).unwrap();
        assert!(email.contains('\n') && !email.contains('@') && !email.contains('.'));
        // Every printable ASCII character matchable: one pass. So too an end assertion.
        assert_eq!(sep(r"(?s).+"), None);
        assert_eq!(sep(r"[^a]+"), None);
        assert_eq!(sep(r"secret$"), None);
        assert_eq!(sep(r"(?m)secret$"), None);
        assert!(sep(r"\bsecret\b").is_some());
    }

    #[test]
    fn each_segment_search_sees_the_real_context() {
        // Segments start at a cut point, but each search sees the text before it: `\A` only
        // matches at the start of the whole text, and `\b` sees the neighbouring characters.
        let rule = |name: &str, pattern: &str| RuleSpec {
            name: name.into(),
            pattern: pattern.into(),
            validator: None,
        };
        let m = Masker::new(&[
            rule("first", r"\Acode-[0-9]{4}"),
            rule("code", r"\bcode-[0-9]{4}\b"),
        ])
        .unwrap();
        let mut text = "code-0000 ".to_string();
        text.push_str(&"y".repeat(SEGMENT_BYTES));
        text.push_str(",code-1234,xcode-5678,code-9012x,code-3456");
        let (out, counts) = mask_with(&m, &text);
        assert!(out.starts_with("[REDACTED:first] y"), "{}", &out[..30]);
        assert!(
            out.ends_with(",[REDACTED:code],xcode-5678,code-9012x,[REDACTED:code]"),
            "{}",
            &out[out.len() - 60..]
        );
        assert_eq!(counts.get("first"), Some(&1));
        assert_eq!(counts.get("code"), Some(&2));
    }

    #[test]
    fn empty_matches_mask_nothing() {
        let m = Masker::new(&[RuleSpec {
            name: "x".into(),
            pattern: "a*".into(),
            validator: None,
        }])
        .unwrap();
        assert_eq!(mask_with(&m, "bbb aaa b").0, "bbb [REDACTED:x] b");
    }

    #[test]
    fn size_limit_refuses_instead_of_returning_unmasked_text() {
        let m = masker();
        let mut scan = Scan::new(100, || {});
        let mut c = MaskCounts::new();
        assert!(m.mask_str(&"a".repeat(60), &mut c, &mut scan).is_ok());
        // `fits` says what the next text's masking would say, taking nothing.
        assert_eq!(scan.fits(40), Ok(()));
        assert_eq!(scan.fits(41), Err(TooLarge { limit: 100 }));
        assert_eq!(scan.taken(), 60);
        // The limit is over the whole scan, not per string.
        assert_eq!(
            m.mask_str(&"b".repeat(60), &mut c, &mut scan),
            Err(TooLarge { limit: 100 })
        );
        let mut v = json!({"k": "x".repeat(200)});
        let mut scan = Scan::new(100, || {});
        assert_eq!(
            m.mask_json(&mut v, &mut c, &mut scan),
            Err(TooLarge { limit: 100 })
        );
    }

    #[test]
    fn interrupts_are_checked_as_the_work_goes() {
        let m = masker();
        let text: String = (0..50_000).map(|i| format!("u{i}@example.com ")).collect();
        // Each rule's regex over the whole text (in segments): a pass per rule, and the matches.
        // The masker: one pass of the prefilter of the other rules (no chunk matches), and one of
        // the e-mail search, and the matches.
        for (m, passes) in [(plain(&default_rules()), m.rules.len()), (masker(), 2)] {
            let mut checks = 0usize;
            let mut scan = Scan::new(usize::MAX, || checks += 1);
            m.mask_str(&text, &mut MaskCounts::new(), &mut scan)
                .unwrap();
            let work = text.len() * passes + 50_000 * MATCH_COST;
            assert!(
                checks * CHECK_BYTES * 2 >= work,
                "{checks} checks for {work} bytes of work"
            );
        }
        // The check may unwind (a cancel): the masker is left usable.
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut scan = Scan::new(usize::MAX, || panic!("cancel"));
            m.mask_str(&text, &mut MaskCounts::new(), &mut scan)
        }));
        assert!(caught.is_err());
        assert_eq!(mask_with(&m, "a@b.org").0, "[REDACTED:email]");
    }

    #[test]
    fn many_matches_are_all_masked() {
        // 1 MB of e-mail addresses (~60,000 matches): every one is found and replaced. How fast
        // is measured by bench/mask_bench.sh (MB/s against a baseline), never by a timed test.
        let m = masker();
        let text: String = (0..60_000).map(|i| format!("u{i}@example.com\n")).collect();
        let (out, counts) = mask_with(&m, &text);
        assert_eq!(counts.get("email"), Some(&60_000));
        assert!(!out.contains("@example.com"));
        assert_eq!(out.matches("[REDACTED:email]").count(), 60_000);
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
