//! Document text helpers: token estimates, trimming, repeated header/footer detection, page
//! ranges, search-snippet markers.

use std::cmp::Ordering;
use std::collections::{HashMap, HashSet};
use std::sync::OnceLock;

use regex::Regex;

/// Honest token estimate: ⌈UTF-8 bytes / 4⌉. BPE tokenizers average about four bytes per token on
/// English prose; for Cyrillic or CJK text this counts somewhat more tokens than a tokenizer would,
/// which errs on the safe side for budgets.
pub fn estimate_tokens(text: &str) -> u32 {
    u32::try_from(text.len().div_ceil(4)).unwrap_or(u32::MAX)
}

/// Cut `text` to at most `max_bytes`, on a char boundary and preferably at whitespace.
/// Returns the kept prefix and whether anything was cut.
pub fn trim_to_bytes(text: &str, max_bytes: usize) -> (&str, bool) {
    if text.len() <= max_bytes {
        return (text, false);
    }
    let mut end = max_bytes;
    while end > 0 && !text.is_char_boundary(end) {
        end -= 1;
    }
    let cut = &text[..end];
    let at_space = cut
        .rfind(char::is_whitespace)
        .filter(|&i| i >= end / 2)
        .unwrap_or(end);
    (cut[..at_space].trim_end(), true)
}

/// A line's identity for header/footer detection: digits collapsed (page numbers vary), spaces folded.
pub fn line_key(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut prev_digit = false;
    let mut prev_space = true;
    for c in line.trim().chars() {
        if c.is_ascii_digit() {
            if !prev_digit {
                out.push('#');
            }
            prev_digit = true;
            prev_space = false;
        } else if c.is_whitespace() {
            if !prev_space {
                out.push(' ');
            }
            prev_space = true;
            prev_digit = false;
        } else {
            out.push(c);
            prev_digit = false;
            prev_space = false;
        }
    }
    out.trim_end().to_string()
}

const EDGE_LINES: usize = 2;

fn edge_lines(page: &str) -> impl Iterator<Item = &str> {
    let lines: Vec<&str> = page.lines().filter(|l| !l.trim().is_empty()).collect();
    let head = EDGE_LINES.min(lines.len());
    let tail_start = lines.len().saturating_sub(EDGE_LINES).max(head);
    let edges: Vec<&str> = lines[..head]
        .iter()
        .chain(&lines[tail_start..])
        .copied()
        .collect();
    edges.into_iter()
}

/// Longest line (in bytes) that can be a running header or footer: a longer edge line is never
/// counted, so the count holds at most four short keys a page, however long its lines.
pub const MAX_BOILERPLATE_LINE: usize = 512;

/// The edge lines of pages counted one page at a time ([`detect_boilerplate`] without holding the
/// pages): add each page, then [`BoilerplateCount::found`].
#[derive(Debug, Default)]
pub struct BoilerplateCount {
    counts: HashMap<String, usize>,
    total: usize,
}

impl BoilerplateCount {
    /// Count one page's edge lines.
    pub fn add(&mut self, page: &str) {
        self.total += 1;
        let keys: HashSet<String> = edge_lines(page)
            .filter(|l| l.len() <= MAX_BOILERPLATE_LINE)
            .map(line_key)
            .filter(|k| !k.is_empty())
            .collect();
        for k in keys {
            *self.counts.entry(k).or_default() += 1;
        }
    }

    /// Lines (as [`line_key`]s) that open or close at least half of the pages counted (and at
    /// least 3), sorted.
    pub fn found(self) -> Vec<String> {
        let threshold = (self.total / 2).max(3);
        let mut found: Vec<String> = self
            .counts
            .into_iter()
            .filter(|(_, n)| *n >= threshold)
            .map(|(k, _)| k)
            .collect();
        found.sort();
        found
    }
}

/// Lines (as [`line_key`]s) that open or close at least half of the pages (and at least 3): running
/// headers and footers such as "ACME Admin Guide v4.2 — Confidential" or "Page 17 of 500". Lines
/// longer than [`MAX_BOILERPLATE_LINE`] are never one.
pub fn detect_boilerplate<'a>(pages: impl IntoIterator<Item = &'a str>) -> Vec<String> {
    let mut count = BoilerplateCount::default();
    for page in pages {
        count.add(page);
    }
    count.found()
}

/// Remove boilerplate lines found at the edges of one page.
pub fn strip_boilerplate(page: &str, boilerplate: &[String]) -> String {
    if boilerplate.is_empty() {
        return page.trim().to_string();
    }
    let lines: Vec<&str> = page.lines().collect();
    let is_bp = |l: &str| {
        let k = line_key(l);
        !k.is_empty() && boilerplate.contains(&k)
    };
    let mut start = 0;
    while start < lines.len() && (lines[start].trim().is_empty() || is_bp(lines[start])) {
        start += 1;
    }
    let mut end = lines.len();
    while end > start && (lines[end - 1].trim().is_empty() || is_bp(lines[end - 1])) {
        end -= 1;
    }
    lines[start..end].join("\n")
}

/// Highlight markers of search snippets (`ts_headline`'s `StartSel` and `StopSel`).
pub const MARK_START: char = '«';
pub const MARK_STOP: char = '»';

/// A snippet as a reader who drops the highlight markers sees it. Masking is checked on this
/// text: a secret the markers split is whole again here.
pub fn without_marks(snippet: &str) -> String {
    snippet
        .chars()
        .filter(|&c| c != MARK_START && c != MARK_STOP)
        .collect()
}

/// Highlight markers removed from inside masking placeholders: a query word such as `card`
/// highlights `[REDACTED:«card»_number]`, which reads better as `[REDACTED:card_number]` (a
/// fragment may end before the closing bracket).
pub fn unmark_placeholders(snippet: &str) -> String {
    static PLACEHOLDER: OnceLock<Regex> = OnceLock::new();
    let re = PLACEHOLDER.get_or_init(|| {
        Regex::new(r"\[[«»]*REDACTED[«»]*:[«»a-z0-9_]*\]?").expect("placeholder pattern")
    });
    re.replace_all(snippet, |c: &regex::Captures<'_>| without_marks(&c[0]))
        .into_owned()
}

/// Bytes of a search snippet's window before the first query word of its densest cluster.
pub const WINDOW_BEFORE: usize = 160;
/// Bytes of the cluster (from its first query word) and after it.
pub const WINDOW_SPAN: usize = 240;
pub const WINDOW_AFTER: usize = 160;
/// Text scanned between two interrupt checks.
const WINDOW_CHECK_BYTES: usize = 64 * 1024;
/// At most this many query words are looked for.
const WINDOW_MAX_KEYS: usize = 64;

/// The prefix a word of the text must start with to count as the query word `lexeme` (a stem
/// such as `directori` for "directory"): long stems lose their last character, which a stemmer
/// often changed (`y` to `i`).
fn window_key(lexeme: &str) -> String {
    let lower = lexeme.to_lowercase();
    let chars = lower.chars().count();
    if chars >= 5 {
        lower.chars().take(chars - 1).collect()
    } else {
        lower
    }
}

/// Does `text` begin with `key`, ignoring case?
fn starts_with_key(text: &str, key: &str) -> bool {
    let mut have = text.chars().flat_map(char::to_lowercase);
    key.chars().all(|k| have.next() == Some(k))
}

/// The part of a search page (`text`, already masked) that `ts_headline` is given: where the
/// query's words (`lexemes`, the query's stems) are densest, about [`WINDOW_BEFORE`] +
/// [`WINDOW_SPAN`] + [`WINDOW_AFTER`] bytes, cut at whitespace. The headline parses and stems
/// every word it is given, so this bounds its cost by the window, not the page. A word counts
/// when it starts with its stem (a heuristic: a window whose headline marks nothing is done
/// again on the whole page). The whole text when no word is found or the window would hold most
/// of it. `interrupt` runs every 64 KiB of text scanned.
pub fn snippet_window<F: FnMut()>(
    text: &str,
    lexemes: &[String],
    mut interrupt: F,
) -> std::ops::Range<usize> {
    let whole = 0..text.len();
    let keys: Vec<String> = lexemes
        .iter()
        .map(|l| window_key(l))
        .filter(|k| !k.is_empty())
        .take(WINDOW_MAX_KEYS)
        .collect();
    if keys.is_empty() || text.len() <= WINDOW_BEFORE + WINDOW_SPAN + WINDOW_AFTER {
        return whole;
    }
    // Query words in the text: (byte offset of the word, index of its key).
    let mut hits: Vec<(usize, usize)> = Vec::new();
    let mut in_word = false;
    let mut since_check = 0usize;
    for (i, c) in text.char_indices() {
        since_check += c.len_utf8();
        if since_check >= WINDOW_CHECK_BYTES {
            since_check = 0;
            interrupt();
        }
        let word = c.is_alphanumeric();
        if word && !in_word {
            let rest = &text[i..];
            if let Some(k) = keys.iter().position(|k| starts_with_key(rest, k)) {
                hits.push((i, k));
            }
        }
        in_word = word;
    }
    if hits.is_empty() {
        return whole;
    }
    // The cluster: the hit whose next WINDOW_SPAN bytes hold the most different query words
    // (then the most words, then the first such place).
    let mut counts = vec![0usize; keys.len()];
    let (mut distinct, mut end) = (0usize, 0usize);
    let mut best = (0usize, 0usize, 0usize); // (distinct, hits, start index)
    for start in 0..hits.len() {
        while end < hits.len() && hits[end].0 < hits[start].0 + WINDOW_SPAN {
            counts[hits[end].1] += 1;
            if counts[hits[end].1] == 1 {
                distinct += 1;
            }
            end += 1;
        }
        if (distinct, end - start) > (best.0, best.1) {
            best = (distinct, end - start, start);
        }
        counts[hits[start].1] -= 1;
        if counts[hits[start].1] == 0 {
            distinct -= 1;
        }
    }
    let anchor = hits[best.2].0;
    let from = floor_char(text, anchor.saturating_sub(WINDOW_BEFORE));
    let to = floor_char(text, (anchor + WINDOW_SPAN + WINDOW_AFTER).min(text.len()));
    // Whole words only: start after a whitespace, end before one (when there is one in reach).
    let from = if from == 0 {
        0
    } else {
        // After the whitespace character, whatever its width (U+00A0, U+3000 are wider than a byte).
        text[from..anchor]
            .char_indices()
            .find(|(_, c)| c.is_whitespace())
            .map_or(from, |(w, c)| from + w + c.len_utf8())
    };
    let to = if to == text.len() {
        to
    } else {
        text[anchor..to]
            .rfind(char::is_whitespace)
            .map_or(to, |w| anchor + w)
    };
    if to - from >= text.len() * 4 / 5 {
        whole
    } else {
        from..to
    }
}

/// The largest character boundary of `text` at or below `i`.
fn floor_char(text: &str, mut i: usize) -> usize {
    while !text.is_char_boundary(i) {
        i -= 1;
    }
    i
}

/// Why a page range was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RangeError {
    /// Not a valid range of this document.
    Invalid,
    /// Valid, but more pages than one call may read.
    TooManyPages,
}

/// The best `limit` search hits seen so far, best first: a higher score first, then a lower page
/// (`ORDER BY score DESC, page_no LIMIT limit`; scores are finite, pages distinct).
pub struct Best<T> {
    limit: usize,
    hits: Vec<(f32, i32, T)>,
}

impl<T> Best<T> {
    pub fn new(limit: usize) -> Self {
        Best {
            limit,
            hits: Vec::new(),
        }
    }

    /// Where a hit of `score` on `page` goes, or `None` when it would not be kept (asked before
    /// its item is made: a page's text is read only when it is kept).
    pub fn place(&self, score: f32, page: i32) -> Option<usize> {
        let at = self
            .hits
            .iter()
            .position(|h| score.total_cmp(&h.0).then(h.1.cmp(&page)) == Ordering::Greater)
            .unwrap_or(self.hits.len());
        (at < self.limit).then_some(at)
    }

    /// Keep the hit at `at` (from [`Best::place`]), dropping the one that falls off the end.
    pub fn insert(&mut self, at: usize, score: f32, page: i32, item: T) {
        self.hits.insert(at, (score, page, item));
        self.hits.truncate(self.limit);
    }

    pub fn into_hits(self) -> Vec<(f32, i32, T)> {
        self.hits
    }
}

/// Validate `[start, end]` (1-based, inclusive) against the document and the per-call page limit.
pub fn check_page_range(
    start: i64,
    end: i64,
    page_count: i64,
    max_pages: i64,
) -> Result<(), RangeError> {
    if start < 1 || end < start || end > page_count {
        return Err(RangeError::Invalid);
    }
    if end - start + 1 > max_pages {
        return Err(RangeError::TooManyPages);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn best_keeps_what_order_by_score_desc_page_limit_keeps() {
        let hits = [
            (0.5, 7),
            (0.9, 3),
            (0.5, 2),
            (0.1, 1),
            (0.9, 8),
            (0.0, 4),
            (0.5, 5),
        ];
        for limit in 0..=hits.len() + 1 {
            let mut best = Best::new(limit);
            for (score, page) in hits {
                if let Some(at) = best.place(score, page) {
                    best.insert(at, score, page, page * 10);
                }
            }
            let mut sorted = hits.to_vec();
            sorted.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1)));
            sorted.truncate(limit);
            let kept: Vec<(f32, i32)> = best
                .into_hits()
                .into_iter()
                .map(|(s, p, t)| {
                    assert_eq!(t, p * 10);
                    (s, p)
                })
                .collect();
            assert_eq!(kept, sorted, "limit {limit}");
        }
    }

    #[test]
    fn tokens_and_trim() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcd"), 1);
        assert_eq!(estimate_tokens("abcde"), 2);
        assert_eq!(estimate_tokens("раздел"), 3);
        let (t, cut) = trim_to_bytes("hello brave new world", 13);
        assert_eq!((t, cut), ("hello brave", true));
        let (t, cut) = trim_to_bytes("привет", 5);
        assert!(cut && t.len() <= 5 && t.is_char_boundary(t.len()));
        assert_eq!(trim_to_bytes("short", 10), ("short", false));
    }

    #[test]
    fn headers_and_footers_are_found_and_stripped() {
        let pages: Vec<String> = (1..=10)
            .map(|i| {
                let words = ["LDAP", "backup", "restore", "quota", "TLS", "audit", "proxy", "cache", "SSO", "logs"];
                let w = words[i % words.len()];
                format!("ACME Admin Guide v4.2 — Confidential\n\nConfigure {w} first.\nThen check the {w} status.\nPage {i} of 10\n")
            })
            .collect();
        let bp = detect_boilerplate(pages.iter().map(String::as_str));
        assert_eq!(
            bp,
            vec![
                "ACME Admin Guide v#.# — Confidential".to_string(),
                "Page # of #".to_string()
            ]
        );
        assert_eq!(
            strip_boilerplate(&pages[2], &bp),
            "Configure quota first.\nThen check the quota status."
        );
        // Body lines that merely repeat in the middle are kept.
        assert_eq!(
            strip_boilerplate("x\nPage 1 of 10\ny", &bp),
            "x\nPage 1 of 10\ny"
        );
    }

    #[test]
    fn no_boilerplate_in_small_or_varied_documents() {
        assert!(detect_boilerplate(["a\nb", "c\nd"]).is_empty());
        let pages: Vec<String> = (1..=8)
            .map(|i| format!("Title {i}\nunique body {i} {}", "x".repeat(i)))
            .collect();
        assert!(detect_boilerplate(pages.iter().map(String::as_str))
            .iter()
            .all(|k| k == "Title #"));
    }

    #[test]
    fn boilerplate_counted_page_by_page_ignores_long_lines() {
        let long = "Z".repeat(MAX_BOILERPLATE_LINE + 1);
        let pages: Vec<String> = (1..=6)
            .map(|i| {
                format!(
                    "Manual - Confidential\n{long}\nbody {i} {}\nPage {i} of 6",
                    "y".repeat(i)
                )
            })
            .collect();
        let mut count = BoilerplateCount::default();
        for p in &pages {
            count.add(p);
        }
        let found = count.found();
        assert_eq!(found, detect_boilerplate(pages.iter().map(String::as_str)));
        // The header and footer; the long line repeats on every page too, but is never counted.
        assert_eq!(
            found,
            vec![
                "Manual - Confidential".to_string(),
                "Page # of #".to_string()
            ]
        );
    }

    #[test]
    fn page_ranges() {
        assert_eq!(check_page_range(1, 5, 500, 5), Ok(()));
        assert_eq!(
            check_page_range(1, 6, 500, 5),
            Err(RangeError::TooManyPages)
        );
        assert_eq!(check_page_range(0, 2, 500, 5), Err(RangeError::Invalid));
        assert_eq!(check_page_range(5, 4, 500, 5), Err(RangeError::Invalid));
        assert_eq!(check_page_range(499, 501, 500, 5), Err(RangeError::Invalid));
    }

    #[test]
    fn snippet_markers() {
        assert_eq!(without_marks("«card» 4111 «1111» x"), "card 4111 1111 x");
        assert_eq!(
            unmark_placeholders("«card» [REDACTED:«card»_«number»] and [«REDACTED»:email] «x»"),
            "«card» [REDACTED:card_number] and [REDACTED:email] «x»"
        );
        assert_eq!(
            unmark_placeholders("«card» [REDACTED:«card»_number"),
            "«card» [REDACTED:card_number"
        );
        assert_eq!(unmark_placeholders("[SECRET:«x»]"), "[SECRET:«x»]");
    }

    #[test]
    fn snippet_windows() {
        let keys = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let filler = "lorem ipsum dolor sit amet ".repeat(40);
        // Short texts and texts without a query word are given whole.
        assert_eq!(snippet_window("short text", &keys(&["text"]), || ()), 0..10);
        let none = format!("{filler}{filler}");
        assert_eq!(
            snippet_window(&none, &keys(&["replic"]), || ()),
            0..none.len()
        );
        assert_eq!(snippet_window(&none, &[], || ()), 0..none.len());
        // The densest place wins over the first word; stems match their words ("directori").
        let text = format!("{filler}Replication once. {filler}The LDAP directory integration and its directory. {filler}");
        let w = snippet_window(
            &text,
            &keys(&["ldap", "directori", "integr", "replic"]),
            || (),
        );
        let window = &text[w.clone()];
        assert!(window.contains("LDAP directory integration"), "{window}");
        assert!(!window.contains("Replication"));
        assert!(window.len() <= WINDOW_BEFORE + WINDOW_SPAN + WINDOW_AFTER);
        // Cut at whitespace, on character boundaries, with multi-byte text around.
        assert!(w.start == 0 || text[..w.start].ends_with(char::is_whitespace));
        let wide = format!("{}ключ здесь {}", "ё ".repeat(400), "ж ".repeat(400));
        let w = snippet_window(&wide, &keys(&["ключ"]), || ());
        assert!(wide[w.clone()].contains("ключ здесь"));
        // Whitespace wider than a byte at either cut: still on character boundaries.
        for space in ["\u{a0}", "\u{3000}", "\u{2003}"] {
            let text = format!(
                "{}needle {}",
                format!("wörd{space}").repeat(200),
                format!("wörd{space}").repeat(200)
            );
            let w = snippet_window(&text, &keys(&["needl"]), || ());
            assert!(text.is_char_boundary(w.start) && text.is_char_boundary(w.end));
            assert!(text[w].contains("needle"));
        }
        // Upper case in the text, lower-case stems.
        let w = snippet_window(&text, &keys(&["ldap"]), || ());
        assert!(text[w].contains("LDAP"));
        // A window that would hold most of the text is the whole text.
        let small = format!("LDAP{}", " b".repeat(240));
        assert_eq!(
            snippet_window(&small, &keys(&["ldap"]), || ()),
            0..small.len()
        );
    }

    #[test]
    fn snippet_window_checks_for_interrupts() {
        let text = format!("{}needle", "x ".repeat(200_000));
        let mut checks = 0;
        let w = snippet_window(&text, &["needl".to_string()], || checks += 1);
        assert!(checks >= 5, "{checks}");
        assert!(text[w].contains("needle"));
    }
}
