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

/// Highlight markers of search snippets.
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

/// Most words of a search snippet's fragment.
pub const FRAGMENT_WORDS: usize = 24;
/// Most fragments of a search snippet.
pub const MAX_FRAGMENTS: usize = 2;
/// Between two fragments of a snippet.
pub const FRAGMENT_DELIMITER: &str = " … ";
/// Bytes of a word of a snippet that is not a query word, at most (a longer one is cut, `…`).
const SNIPPET_WORD_BYTES: usize = 48;
/// Bytes of the text between two words of a snippet, at most (a longer one is cut).
const SNIPPET_GAP_BYTES: usize = 16;
/// Text scanned between two interrupt checks.
const HEADLINE_CHECK_BYTES: usize = 64 * 1024;
/// At most this many query words are looked for.
const HEADLINE_MAX_KEYS: usize = 64;

/// The prefix a word of the text must start with to count as the query word `lexeme` (a stem
/// such as `directori` for "directory"): long stems lose their last character, which a stemmer
/// often changed (`y` to `i`).
fn stem_key(lexeme: &str) -> String {
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
    // ASCII keys (most): a byte comparison, the first byte first.
    if key.is_ascii() {
        let (t, k) = (text.as_bytes(), key.as_bytes());
        if let (Some(a), Some(b)) = (t.first(), k.first()) {
            if a.is_ascii() && !a.eq_ignore_ascii_case(b) {
                return false;
            }
        }
        if t.len() >= k.len() && t[..k.len()].is_ascii() {
            return t[..k.len()].eq_ignore_ascii_case(k);
        }
    }
    let mut have = text.chars().flat_map(char::to_lowercase);
    key.chars().all(|k| have.next() == Some(k))
}

/// The snippet of a search page (`text`, already masked) for the query whose stems are
/// `lexemes`: at most [`MAX_FRAGMENTS`] fragments of at most [`FRAGMENT_WORDS`] words, in the
/// text's order, joined by [`FRAGMENT_DELIMITER`], each query word between [`MARK_START`] and
/// [`MARK_STOP`] (what `ts_headline` with `MaxFragments=2, MaxWords=24` makes, in one pass and
/// without parsing and stemming every word of the page).
///
/// Words are runs of letters and digits. A word that is not a query word is cut at
/// [`SNIPPET_WORD_BYTES`], the text between two words at [`SNIPPET_GAP_BYTES`]: a fragment is at most
/// a few kilobytes whatever the page (a base64 blob or a script without spaces is one long word).
/// A word is a query word when it starts with a stem's
/// prefix ([`stem_key`]) and `is_query_word` (the caller's stemmer: the text search
/// configuration's lexemes of the word) says so; only such words are asked. The first fragment
/// is where the most different query words are closest (then the most query words, then the
/// first such place), centred on them; the second, outside the first, only as good a place. A
/// text without a query word gives its first words, unmarked. `interrupt` runs every 64 KiB of
/// text scanned.
pub fn headline<Q: FnMut(&str) -> bool, F: FnMut()>(
    text: &str,
    lexemes: &[String],
    mut is_query_word: Q,
    mut interrupt: F,
) -> String {
    let keys: Vec<String> = lexemes
        .iter()
        .map(|l| stem_key(l))
        .filter(|k| !k.is_empty())
        .take(HEADLINE_MAX_KEYS)
        .collect();
    // Words (byte ranges) and the query words among them: (index of the word, index of its key).
    let mut words: Vec<std::ops::Range<usize>> = Vec::new();
    let mut hits: Vec<(usize, usize)> = Vec::new();
    let mut start: Option<usize> = None;
    let mut since_check = 0usize;
    let mut word_done = |from: usize, to: usize, words: &mut Vec<_>, hits: &mut Vec<_>| {
        let word = &text[from..to];
        if let Some(k) = keys.iter().position(|k| starts_with_key(word, k)) {
            if is_query_word(word) {
                hits.push((words.len(), k));
            }
        }
        words.push(from..to);
    };
    for (i, c) in text.char_indices() {
        since_check += c.len_utf8();
        if since_check >= HEADLINE_CHECK_BYTES {
            since_check = 0;
            interrupt();
        }
        match (c.is_alphanumeric(), start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                word_done(s, i, &mut words, &mut hits);
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        word_done(s, text.len(), &mut words, &mut hits);
    }
    let n = words.len();
    let width = FRAGMENT_WORDS.min(n);
    if width == 0 {
        return String::new();
    }
    let mut fragments: Vec<std::ops::Range<usize>> = Vec::new();
    if hits.is_empty() {
        fragments.push(0..width);
    } else {
        let first = best_fragment(&hits, keys.len(), 0..n, None);
        if let Some((range, distinct)) = first {
            fragments.push(range.clone());
            for part in [0..range.start, range.end..n] {
                if fragments.len() >= MAX_FRAGMENTS {
                    break;
                }
                if let Some((second, _)) = best_fragment(&hits, keys.len(), part, Some(distinct)) {
                    fragments.push(second);
                }
            }
        }
        fragments.sort_by_key(|r| r.start);
        fragments.truncate(MAX_FRAGMENTS);
    }
    let mut out = String::new();
    let mut hit = hits.iter().map(|h| h.0).peekable();
    for (f, range) in fragments.iter().enumerate() {
        if f > 0 {
            out.push_str(FRAGMENT_DELIMITER);
        }
        let mut at = words[range.start].start;
        for w in range.clone() {
            while hit.next_if(|&h| h < w).is_some() {}
            out.push_str(cut(&text[at..words[w].start], SNIPPET_GAP_BYTES));
            let word = &text[words[w].clone()];
            if hit.next_if_eq(&w).is_some() {
                out.push(MARK_START);
                out.push_str(word);
                out.push(MARK_STOP);
            } else if word.len() > SNIPPET_WORD_BYTES {
                out.push_str(cut(word, SNIPPET_WORD_BYTES));
                out.push('…');
            } else {
                out.push_str(word);
            }
            at = words[w].end;
        }
    }
    out
}

/// The first at most `bytes` bytes of `text`, on a character boundary.
fn cut(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// The best fragment of at most [`FRAGMENT_WORDS`] words within the words `within` (a range of
/// word indices), with the query words `hits` (word index, key index; in order) and `keys`
/// different keys: the most different query words, then the most query words, then the first;
/// centred on its query words. `None` when `within` holds no query word, or (with `at_least`)
/// fewer different ones than that.
fn best_fragment(
    hits: &[(usize, usize)],
    keys: usize,
    within: std::ops::Range<usize>,
    at_least: Option<usize>,
) -> Option<(std::ops::Range<usize>, usize)> {
    // The hits are in word order: those within are one run of them.
    let from = hits.partition_point(|h| h.0 < within.start);
    let to = hits.partition_point(|h| h.0 < within.end);
    let inside = &hits[from..to];
    let width = FRAGMENT_WORDS.min(within.len());
    let mut counts = vec![0usize; keys];
    let (mut distinct, mut end) = (0usize, 0usize);
    // (distinct, hits, index of the first hit, index past the last)
    let mut best: Option<(usize, usize, usize, usize)> = None;
    for s in 0..inside.len() {
        while end < inside.len() && inside[end].0 < inside[s].0 + width {
            counts[inside[end].1] += 1;
            if counts[inside[end].1] == 1 {
                distinct += 1;
            }
            end += 1;
        }
        if best.is_none_or(|b| (distinct, end - s) > (b.0, b.1)) {
            best = Some((distinct, end - s, s, end));
        }
        counts[inside[s].1] -= 1;
        if counts[inside[s].1] == 0 {
            distinct -= 1;
        }
    }
    let (distinct, _, first, past) = best?;
    if at_least.is_some_and(|d| distinct < d) {
        return None;
    }
    let (lo, hi) = (inside[first].0, inside[past - 1].0 + 1);
    let start = lo
        .saturating_sub((width - (hi - lo)) / 2)
        .max(within.start)
        .min(within.end - width);
    Some((start..start + width, distinct))
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

    /// A stemmer for the tests: a word's lexeme is its lower case without a final "s" or "ion",
    /// and "y" as "i".
    fn stem(word: &str) -> String {
        let w = word.to_lowercase();
        let w = w.strip_suffix("ion").or(w.strip_suffix('s')).unwrap_or(&w);
        w.strip_suffix('y')
            .map_or(w.to_string(), |r| format!("{r}i"))
    }

    fn marked(text: &str, query: &[&str]) -> (String, usize) {
        let lexemes: Vec<String> = query.iter().map(|q| stem(q)).collect();
        let mut asked = 0;
        let h = headline(
            text,
            &lexemes,
            |w| {
                asked += 1;
                lexemes.contains(&stem(w))
            },
            || (),
        );
        (h, asked)
    }

    #[test]
    fn headlines_mark_query_words_in_fragments() {
        let filler = "lorem ipsum dolor sit amet ".repeat(40);
        // The densest place wins over the first word; stems match their words ("directori").
        let text = format!(
            "{filler}Replication once. {filler}The LDAP directory integration, and its directory. {filler}"
        );
        let (h, asked) = marked(&text, &["ldap", "directory", "integration", "replication"]);
        assert!(
            h.contains("The «LDAP» «directory» «integration», and its «directory». lorem"),
            "{h}"
        );
        assert!(!h.contains("Replication"), "{h}");
        assert_eq!(h.split_whitespace().count(), FRAGMENT_WORDS, "{h}");
        // Centred: as many words before the query words as after them (give or take one).
        let before = h[..h.find('«').unwrap()].split_whitespace().count();
        let after = h[h.rfind('»').unwrap()..].split_whitespace().count() - 1;
        assert!(before.abs_diff(after) <= 1, "{before} {after}: {h}");
        // Only words starting with a stem's prefix are asked (here the five query words).
        assert_eq!(asked, 5);
        // A prefix is not a match: the stemmer decides ("directorate" is not "directori").
        let (h, _) = marked("the directorate and the directory", &["directory"]);
        assert_eq!(h, "the directorate and the «directory»");
    }

    #[test]
    fn headlines_second_fragment_only_as_good() {
        let filler = "lorem ipsum dolor sit amet ".repeat(20);
        // Two places with both words: two fragments, in the text's order, with the delimiter.
        let text = format!("{filler}backup scheduling here. {filler}scheduling a backup. {filler}");
        let (h, _) = marked(&text, &["backup", "scheduling"]);
        let parts: Vec<&str> = h.split(FRAGMENT_DELIMITER).collect();
        assert_eq!(parts.len(), 2, "{h}");
        assert!(parts[0].contains("«backup» «scheduling» here"), "{h}");
        assert!(parts[1].contains("«scheduling» a «backup»"), "{h}");
        // The second place has one of the two words: one fragment only.
        let text = format!("{filler}backup scheduling here. {filler}a backup. {filler}");
        let (h, _) = marked(&text, &["backup", "scheduling"]);
        assert!(!h.contains(FRAGMENT_DELIMITER), "{h}");
        // No query word: the text's first words, unmarked; empty text, empty snippet.
        let (h, asked) = marked(&filler, &["backup"]);
        assert_eq!(h.split_whitespace().count(), FRAGMENT_WORDS);
        assert!(filler.starts_with(&h) && !h.contains('«'));
        assert_eq!(asked, 0);
        assert_eq!(marked("", &["backup"]).0, "");
        assert_eq!(marked("  ,, ", &["backup"]).0, "");
        // Shorter than a fragment: the whole text, its punctuation kept between words.
        assert_eq!(
            marked("Backups, and (backup)!", &["backup"]).0,
            "«Backups», and («backup»"
        );
    }

    #[test]
    fn headlines_of_any_script_and_masked_text() {
        let (h, _) = marked("ё ж ключ здесь ключ.", &["ключ"]);
        assert_eq!(h, "ё ж «ключ» здесь «ключ»");
        // Upper case in the text, lower-case stems; placeholders are words like any other.
        let (h, _) = marked("The LDAP card [REDACTED:card_number] x", &["ldap", "card"]);
        assert_eq!(h, "The «LDAP» «card» [REDACTED:«card»_number] x");
        assert_eq!(
            unmark_placeholders(&h),
            "The «LDAP» «card» [REDACTED:card_number] x"
        );
        // Whitespace wider than a byte: on character boundaries.
        for space in ["\u{a0}", "\u{3000}", "\u{2003}"] {
            let text = format!(
                "{}needle{space}{}",
                format!("wörd{space}").repeat(60),
                "x ".repeat(60)
            );
            let (h, _) = marked(&text, &["needle"]);
            assert!(h.contains("«needle»"), "{h}");
        }
    }

    #[test]
    fn keys_match_as_lower_case_does() {
        let slow = |text: &str, key: &str| {
            let mut have = text.chars().flat_map(char::to_lowercase);
            key.chars().all(|k| have.next() == Some(k))
        };
        for (text, key) in [
            ("Directory", "directo"),
            ("DIRECTORY", "directo"),
            ("direct", "directo"),
            ("\u{212a}elvin", "kelvi"),
            ("ke\u{212a}vin", "kek"),
            ("\u{130}stanbul", "i\u{307}stanbul"),
            ("Ключ", "ключ"),
            ("x", "ключ"),
            ("", "a"),
            ("LDAP", "ldap"),
            ("lda", "ldap"),
        ] {
            assert_eq!(starts_with_key(text, key), slow(text, key), "{text} {key}");
        }
    }

    #[test]
    fn snippets_are_bounded_whatever_the_words() {
        // A page of one long word (a blob, a script without spaces), and long gaps between words.
        let blob = format!("needle {} ends", "Ab9".repeat(100_000));
        let (h, _) = marked(&blob, &["needle"]);
        assert!(h.starts_with("«needle» Ab9Ab9"), "{h}");
        assert!(h.len() < 100, "{}", h.len());
        let wide = format!("{}ключ{}", "ж".repeat(100), "—".repeat(300)) + "ключ";
        let (h, _) = marked(&wide, &["ключ"]);
        assert!(h.len() < 200 && h.contains('…'), "{h}");
        let gaps = format!("a{}b{}c needle", " .".repeat(5000), "!".repeat(5000));
        let (h, _) = marked(&gaps, &["needle"]);
        assert!(h.len() < 80 && h.ends_with("«needle»"), "{h}");
        // At most two fragments of 24 words, each word and gap cut: a few kilobytes at most.
        let worst = format!("{} ", "x".repeat(5000)).repeat(100)
            + "needle "
            + &format!("{} ", "y".repeat(5000)).repeat(100);
        let (h, _) = marked(&worst, &["needle"]);
        assert!(
            h.len() <= FRAGMENT_WORDS * (SNIPPET_WORD_BYTES + 3 + SNIPPET_GAP_BYTES),
            "{}",
            h.len()
        );
    }

    #[test]
    fn headlines_check_for_interrupts() {
        let text = format!("{}needle", "x ".repeat(200_000));
        let mut checks = 0;
        let h = headline(
            &text,
            &["needl".to_string()],
            |w| w == "needle",
            || checks += 1,
        );
        assert!(checks >= 5, "{checks}");
        assert!(h.ends_with("«needle»"), "{h}");
    }
}
