//! Answer hygiene on a stream: the one way an answer is cleaned, streamed or not (a non-streamed
//! answer is fed whole, then finished). Every byte it releases has been through [`Cleaner`], and
//! what it releases never depends on how the model's text was cut into deltas: the same text gives
//! the same bytes, whether it came in one piece or one byte at a time.
//!
//! The text is cleaned in *segments* that end at a blank line followed by a line that starts in
//! column 0 outside a fenced code block or raw HTML block (there a CommonMark renderer starts
//! afresh: no link, image or code span crosses it). Each segment is cleaned on its own by
//! [`Cleaner::clean`]; a reference definition is judged where it stands (an outside one is dropped
//! wherever it is, so a reference in another segment stays plain text).
//!
//! Within a segment the cleaned text is released at *settled* points: just after white space, with
//! no `[`, link destination `(`, `<` or code span left open, and not within a line that starts
//! with `[` (a reference definition is judged whole, at its line's end). There the segment so far is cleaned
//! again, and the part of the result beyond what was released goes out. Nothing before a settled
//! point can be read differently by what follows, so the result only grows; if it ever does not
//! (text that later makes earlier text a table, a definition after its use in one segment, raw
//! HTML that grows), nothing is taken back: the rest of the segment is released as plain text
//! ([`Cleaner::plain`]: outside URLs removed, every Markdown character escaped).
//!
//! The holdback is bounded: when [`HOLD_MAX`] bytes pass without a settled point (a `[` or a
//! backtick never closed, a word without end), the rest of the segment becomes plain text, word by
//! word; a word longer than [`HOLD_MAX`] is cut there and a space put in the cut (so that no two
//! released pieces join into a URL). A segment longer than [`SEGMENT_MAX`] goes plain the same
//! way. Answers longer than their limit end with the same visible marker as before; a piece that
//! would cross the limit is dropped whole (a cut never halves a link).

use pulldown_cmark::{Event, Options, Parser, Tag};

use crate::chat::hygiene::Cleaner;

/// The longest stretch of model text held back while waiting for a settled point.
pub const HOLD_MAX: usize = 1024;
/// The longest segment cleaned as Markdown; past it the segment's rest is plain text.
pub const SEGMENT_MAX: usize = 64 * 1024;

/// What one [`StreamCleaner::finish`] gives: the last piece and whether the answer was cut.
#[derive(Debug, Clone, PartialEq)]
pub struct Finished {
    pub piece: String,
    pub truncated: bool,
}

/// The open constructs that keep a point from being settled.
#[derive(Debug, Clone)]
struct Scan {
    brackets: usize,
    /// Depth of parentheses inside a link destination (after `](`).
    dest: usize,
    angle: bool,
    /// The length of the open code span's backtick run (0: none).
    code: usize,
    /// The backtick run being read.
    run: usize,
    escaped: bool,
    after_bracket: bool,
    after_angle: bool,
    /// Inside a line that starts with `[`: perhaps a reference definition, judged whole at its
    /// line's end.
    definition: bool,
    /// Not yet past the indentation of a line.
    line_start: bool,
}

impl Default for Scan {
    fn default() -> Scan {
        Scan {
            brackets: 0,
            dest: 0,
            angle: false,
            code: 0,
            run: 0,
            escaped: false,
            after_bracket: false,
            after_angle: false,
            definition: false,
            line_start: true,
        }
    }
}

impl Scan {
    fn settled(&self) -> bool {
        self.brackets == 0
            && self.dest == 0
            && !self.angle
            && self.code == 0
            && self.run == 0
            && !self.definition
    }

    fn step(&mut self, c: char) {
        if c == '\n' {
            self.line_start = true;
            self.definition = false;
        } else if self.line_start && c != ' ' {
            self.line_start = false;
            self.definition = c == '[' && self.code == 0;
        }
        if c == '`' && !self.escaped {
            self.run += 1;
            self.after_bracket = false;
            self.after_angle = false;
            return;
        }
        if self.run > 0 {
            if self.code == 0 {
                self.code = self.run;
            } else if self.code == self.run {
                self.code = 0;
            }
            self.run = 0;
        }
        if self.after_angle {
            // `<` opens an autolink or a tag only before a letter, `/`, `!` or `?`.
            self.after_angle = false;
            if !(c.is_ascii_alphabetic() || matches!(c, '/' | '!' | '?')) {
                self.angle = false;
            }
        }
        let after_bracket = std::mem::replace(&mut self.after_bracket, false);
        if self.escaped {
            self.escaped = false;
            return;
        }
        if self.code > 0 {
            return;
        }
        match c {
            '\\' => self.escaped = true,
            '[' => self.brackets += 1,
            ']' => {
                self.brackets = self.brackets.saturating_sub(1);
                self.after_bracket = true;
            }
            '(' if after_bracket || self.dest > 0 => self.dest += 1,
            ')' if self.dest > 0 => self.dest -= 1,
            '<' => {
                self.angle = true;
                self.after_angle = true;
            }
            '>' => self.angle = false,
            _ => {}
        }
    }
}

/// Cleans one answer as it streams. Feed it the model's text with [`StreamCleaner::push`] (each
/// call returns what may be released now) and end with [`StreamCleaner::finish`].
pub struct StreamCleaner<'a> {
    cleaner: &'a Cleaner,
    max_bytes: usize,
    marker: String,
    /// The current segment's model text.
    seg: String,
    /// How far `seg` has been read (a byte offset on a character boundary).
    scanned: usize,
    scan: Scan,
    /// The segment's cleaned text released so far, and the model text it is the cleaning of.
    seg_out: String,
    evaluated: usize,
    /// The last settled point not yet evaluated.
    candidate: usize,
    /// Set when the segment's rest is plain text: the model text released as plain up to here.
    plain: Option<usize>,
    /// Bytes released, and a piece past the marker's room held until the answer's size is known.
    released: usize,
    tail: String,
    truncated: bool,
}

impl<'a> StreamCleaner<'a> {
    /// `max_bytes`: the answer's limit (`CTXGUARD_MAX_ANSWER_BYTES`).
    pub fn new(cleaner: &'a Cleaner, max_bytes: usize) -> StreamCleaner<'a> {
        StreamCleaner {
            cleaner,
            max_bytes,
            marker: format!(
                "\n\n(answer truncated: the model's answer was longer than the {max_bytes}-byte limit)"
            ),
            seg: String::new(),
            scanned: 0,
            scan: Scan::default(),
            seg_out: String::new(),
            evaluated: 0,
            candidate: 0,
            plain: None,
            released: 0,
            tail: String::new(),
            truncated: false,
        }
    }

    /// Clean a whole answer (the non-streamed path): what the pieces of a stream add up to.
    pub fn clean_all(cleaner: &Cleaner, text: &str, max_bytes: usize) -> (String, bool) {
        let mut s = StreamCleaner::new(cleaner, max_bytes);
        let mut out = s.push(text);
        let end = s.finish();
        out.push_str(&end.piece);
        (out, end.truncated)
    }

    /// Model text not yet released (held back, or not yet read).
    pub fn held(&self) -> usize {
        self.seg.len() - self.plain.unwrap_or(self.evaluated)
    }

    /// Add model text; returns the cleaned text that may be released now (often empty).
    pub fn push(&mut self, delta: &str) -> String {
        let mut out = String::new();
        if self.truncated {
            return out;
        }
        self.seg.push_str(delta);
        while self.scanned < self.seg.len() && !self.truncated {
            let c = self.seg[self.scanned..].chars().next().unwrap_or(' ');
            // A segment ends before a line in column 0 that follows a blank line.
            if !c.is_whitespace()
                && self.seg[..self.scanned].ends_with("\n\n")
                && (self.plain.is_some() || !inside_raw_block(&self.seg[..self.scanned]))
            {
                let at = self.scanned;
                self.end_segment(at, &mut out);
                continue;
            }
            self.scanned += c.len_utf8();
            let at = self.scanned;
            if let Some(from) = self.plain {
                if c.is_whitespace() {
                    let piece = self.cleaner.plain(&self.seg[from..at]);
                    self.plain = Some(at);
                    self.release(piece, &mut out);
                } else if at - from >= HOLD_MAX {
                    let piece = self.cleaner.plain(&self.seg[from..at]) + " ";
                    self.plain = Some(at);
                    self.release(piece, &mut out);
                }
                continue;
            }
            self.scan.step(c);
            if c.is_whitespace() && self.scan.settled() {
                self.candidate = at;
                let step = (self.evaluated / 16).max(1);
                if at - self.evaluated >= step {
                    self.evaluate(at, &mut out);
                }
            } else if at - self.candidate.max(self.evaluated) >= HOLD_MAX {
                if self.candidate > self.evaluated {
                    self.evaluate(self.candidate, &mut out);
                }
                self.go_plain(&mut out);
            }
        }
        out
    }

    /// The end of the model's text: the rest, cleaned, and whether the answer was cut.
    pub fn finish(mut self) -> Finished {
        let mut out = String::new();
        if !self.truncated {
            let end = self.seg.len();
            self.end_segment(end, &mut out);
            if !self.truncated {
                out.push_str(&std::mem::take(&mut self.tail));
            }
        }
        Finished {
            piece: out,
            truncated: self.truncated,
        }
    }

    /// Clean the segment up to `at` (a settled point) and release what it adds.
    fn evaluate(&mut self, at: usize, out: &mut String) {
        if at > SEGMENT_MAX {
            self.go_plain(out);
            return;
        }
        let cleaned = self.cleaner.clean(&self.seg[..at]);
        if let Some(more) = cleaned.strip_prefix(self.seg_out.as_str()) {
            let more = more.to_string();
            self.seg_out = cleaned;
            self.evaluated = at;
            self.release(more, out);
        } else {
            self.go_plain(out);
        }
    }

    /// The rest of the segment is plain text from the last evaluated point; release what is read.
    fn go_plain(&mut self, out: &mut String) {
        let from = self.evaluated;
        self.plain = Some(from);
        // Whole words of what was read, and the last (unfinished) one held.
        let read = &self.seg[from..self.scanned];
        if let Some(end) = read.rfind(char::is_whitespace) {
            let end = from + end + read[end..].chars().next().map_or(1, char::len_utf8);
            let piece = self.cleaner.plain(&self.seg[from..end]);
            self.plain = Some(end);
            self.release(piece, out);
        }
        let from = self.plain.unwrap_or(from);
        if self.scanned - from >= HOLD_MAX {
            let piece = self.cleaner.plain(&self.seg[from..self.scanned]) + " ";
            self.plain = Some(self.scanned);
            self.release(piece, out);
        }
    }

    /// Release the segment's text up to `at` and start the next segment there.
    fn end_segment(&mut self, at: usize, out: &mut String) {
        match self.plain {
            Some(from) => {
                let piece = self.cleaner.plain(&self.seg[from..at]);
                self.release(piece, out);
            }
            None if at > self.evaluated => {
                self.evaluate(at, out);
                if let Some(from) = self.plain {
                    let piece = self.cleaner.plain(&self.seg[from..at]);
                    self.release(piece, out);
                }
            }
            None => {}
        }
        self.seg.drain(..at);
        self.scanned -= at;
        self.scan = Scan::default();
        self.seg_out.clear();
        self.evaluated = 0;
        self.candidate = 0;
        self.plain = None;
    }

    /// Release `piece` within the answer's limit: past the marker's room it waits (the answer may
    /// end within the limit); past the limit the answer ends with the marker.
    fn release(&mut self, piece: String, out: &mut String) {
        if self.truncated || piece.is_empty() {
            return;
        }
        let room = self.max_bytes.saturating_sub(self.marker.len());
        if self.tail.is_empty() && self.released + piece.len() <= room {
            self.released += piece.len();
            out.push_str(&piece);
            return;
        }
        if self.released + self.tail.len() + piece.len() <= self.max_bytes {
            self.tail.push_str(&piece);
            return;
        }
        self.tail.clear();
        self.truncated = true;
        self.released += self.marker.len();
        out.push_str(&self.marker);
    }
}

/// Whether `text` ends inside a top-level fenced or indented code block or raw HTML block (which
/// run across blank lines).
fn inside_raw_block(text: &str) -> bool {
    let mut depth = 0usize;
    for (event, range) in Parser::new_ext(text, options()).into_offset_iter() {
        match event {
            Event::Start(tag) => {
                if depth == 0
                    && matches!(tag, Tag::CodeBlock(_) | Tag::HtmlBlock)
                    && range.end >= text.len()
                {
                    return true;
                }
                depth += 1;
            }
            Event::End(_) => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    false
}

fn options() -> Options {
    Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chat::hygiene::tests::{cleaner, rendered};
    use crate::chat::hygiene::LINK_REMOVED;

    const MAX: usize = 64 * 1024;

    /// Feed `text` in the given pieces; every release is checked to render safely together with
    /// what came before. Returns the whole output.
    fn feed(c: &Cleaner, pieces: &[&str], max: usize) -> (String, bool) {
        let mut s = StreamCleaner::new(c, max);
        let mut out = String::new();
        for p in pieces {
            let piece = s.push(p);
            if !piece.is_empty() {
                out.push_str(&piece);
                assert_safe_so_far(c, &out);
            }
        }
        let end = s.finish();
        out.push_str(&end.piece);
        assert_safe_so_far(c, &out);
        (out, end.truncated)
    }

    /// What has been released renders nothing a browser would fetch or link outside the
    /// allow-list (the cleaner's own promise, [`crate::chat::hygiene`]).
    fn assert_safe_so_far(c: &Cleaner, out: &str) {
        let (urls, _) = rendered(out);
        for u in &urls {
            assert!(c.allow_list().allows(u), "{u:?} leaves in {out:?}");
        }
    }

    fn chars(text: &str) -> Vec<&str> {
        text.char_indices()
            .map(|(i, ch)| &text[i..i + ch.len_utf8()])
            .collect()
    }

    /// Pieces of 1..max_len bytes (on character boundaries), from a fixed seed.
    fn random_pieces(text: &str, seed: &mut u64, max_len: usize) -> Vec<String> {
        let mut out = Vec::new();
        let mut at = 0;
        while at < text.len() {
            *seed = seed
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            let mut end = (at + 1 + (*seed >> 33) as usize % max_len).min(text.len());
            while !text.is_char_boundary(end) {
                end += 1;
            }
            out.push(text[at..end].to_string());
            at = end;
        }
        out
    }

    /// The streamed pieces of `text`, however it is cut, add up to the same bytes as `text`
    /// cleaned whole; every prefix released renders safely.
    fn assert_same_however_cut(text: &str) -> String {
        let c = cleaner();
        let (whole, truncated) = StreamCleaner::clean_all(&c, text, MAX);
        assert_safe_so_far(&c, &whole);
        assert_eq!(
            feed(&c, &chars(text), MAX),
            (whole.clone(), truncated),
            "byte by byte: {text:?}"
        );
        if text.len() <= 400 {
            for at in (1..text.len()).filter(|&i| text.is_char_boundary(i)) {
                let pieces = [&text[..at], &text[at..]];
                assert_eq!(feed(&c, &pieces, MAX).0, whole, "cut at {at}: {text:?}");
            }
        }
        let mut seed = text.len() as u64 ^ 0x9e37_79b9_7f4a_7c15;
        for _ in 0..8 {
            let pieces = random_pieces(text, &mut seed, 24);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(feed(&c, &pieces, MAX).0, whole, "{pieces:?}");
        }
        whole
    }

    #[test]
    fn plain_and_allowed_text_passes_unchanged() {
        for text in [
            "Invoice ACME-2026-0005 is **paid**.\n\nThe vendor is Northwind Traders.",
            "- one [docs](https://docs.acme.example/a)\n- two `code https://evil.example`\n\n# Head\n\ntext",
            "| a | b |\n|---|---|\n| 1 | [x](https://acme.example/) |\n\nafter",
            "```\nhttps://evil.example/in-code\n\nstill code\n```\n\nafter the fence",
            "[ref][1] and ![img][2]\n\n[1]: https://acme.example/r\n[2]: /static/i.png\n",
        ] {
            assert_eq!(assert_same_however_cut(text), text);
        }
    }

    #[test]
    fn a_hostile_link_split_across_deltas_never_leaves() {
        let text = "See [the report](https://evil.example/x?d=secret) and ![chart](https://evil.example/c.png) now. Also https://evil.example/raw and <https://evil.example/auto>.";
        let out = assert_same_however_cut(text);
        assert_eq!(
            out,
            "See the report (link removed) and (image removed: chart) now. Also (link removed) and (link removed)."
        );
        // The same as the whole-text cleaner gives.
        assert_eq!(out, cleaner().clean(text));
    }

    #[test]
    fn reference_definitions_are_judged_whole() {
        let text = "See ![x][1] and [y][2].\n\n[1]: https://evil.example/p.png?d=secret\n[2]: https://docs.acme.example/y\n[s]: \\\\\\\\evil.example/s\n";
        let out = assert_same_however_cut(text);
        assert_eq!(
            out,
            "See ![x][1] and [y][2].\n\n\n[2]: https://docs.acme.example/y\n\n"
        );
        // In one paragraph, the definition before its use: the use is judged by it (the definition
        // goes, its line's end stays).
        let text = "[1]: https://evil.example/p.png\n![x][1] and more text\n";
        assert_eq!(
            assert_same_however_cut(text),
            "\n(image removed: x) and more text\n"
        );
    }

    #[test]
    fn text_is_released_as_it_streams() {
        let c = cleaner();
        let mut s = StreamCleaner::new(&c, MAX);
        let mut out = String::new();
        let mut lengths = Vec::new();
        for word in
            "The invoice is paid and the vendor was told about it today. ".split_inclusive(' ')
        {
            out.push_str(&s.push(word));
            lengths.push(out.len());
        }
        // Each word is out once the next one starts (the word being written is held).
        assert!(
            lengths.windows(2).filter(|w| w[0] < w[1]).count() >= 8,
            "{lengths:?}"
        );
        // A link is held until it is whole, then judged.
        let before = out.len();
        out.push_str(&s.push("[x](https://evil.exa"));
        assert_eq!(out.len(), before);
        out.push_str(&s.push("mple/a) "));
        assert!(out.ends_with(&format!("x {LINK_REMOVED} ")), "{out}");
    }

    #[test]
    fn the_holdback_is_bounded() {
        let c = cleaner();
        // A bracket, a code span and a word that never end.
        for opener in ["[", "`", "<a href=\"", "https://evil.example/"] {
            let mut s = StreamCleaner::new(&c, MAX);
            let mut out = s.push(opener);
            for _ in 0..2000 {
                out.push_str(&s.push("word "));
                assert!(s.held() <= HOLD_MAX + 8, "{opener}: {} held", s.held());
            }
            assert!(out.len() > 8000, "{opener}: only {} out", out.len());
            assert_safe_so_far(&c, &out);
        }
        let long_word = format!("x{}", "y".repeat(5000));
        let mut s = StreamCleaner::new(&c, MAX);
        for ch in chars(&long_word) {
            s.push(ch);
            assert!(s.held() <= HOLD_MAX);
        }
        assert_same_however_cut(&format!("[open {}", "word ".repeat(600)));
        assert_same_however_cut(&format!("{} www.evil.example/x", "z".repeat(3000)));
    }

    #[test]
    fn long_answers_end_with_the_marker_however_cut() {
        let c = cleaner();
        let long = "All vendors are in good standing. ".repeat(3000);
        let (whole, truncated) = StreamCleaner::clean_all(&c, &long, 4096);
        assert!(
            truncated && whole.len() <= 4096 && whole.ends_with("limit)"),
            "{}",
            whole.len()
        );
        let mut seed = 7;
        let pieces = random_pieces(&long, &mut seed, 40);
        let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
        assert_eq!(feed(&c, &pieces, 4096), (whole, true));
        let hostile = "https://evil.example/a ".repeat(2000);
        let (out, truncated) = StreamCleaner::clean_all(&c, &hostile, 4096);
        assert!(truncated && out.len() <= 4096 && !out.contains("evil"));
        // Just within the limit: no marker.
        let fits = "word ".repeat(800);
        assert_eq!(
            StreamCleaner::clean_all(&c, &fits, 4096),
            (fits.clone(), false)
        );
    }

    /// Hostile pieces glued together at random (a fixed seed), cut at random: the same bytes
    /// however cut, and nothing released at any moment renders outside the allow-list.
    #[test]
    fn random_hostile_mixes_however_cut() {
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
            "https",
            "//evil.example/",
            "acme.example",
            "text ",
            "word ",
        ];
        let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
        for _ in 0..150 {
            let mut text = String::new();
            for _ in 0..(6 + (seed % 30) as usize) {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                text.push_str(PIECES[(seed >> 33) as usize % PIECES.len()]);
            }
            let c = cleaner();
            let (whole, _) = StreamCleaner::clean_all(&c, &text, MAX);
            assert_safe_so_far(&c, &whole);
            assert_eq!(feed(&c, &chars(&text), MAX).0, whole, "{text:?}");
            let pieces = random_pieces(&text, &mut seed, 16);
            let pieces: Vec<&str> = pieces.iter().map(String::as_str).collect();
            assert_eq!(feed(&c, &pieces, MAX).0, whole, "{text:?}");
        }
    }
}
