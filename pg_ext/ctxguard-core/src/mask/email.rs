//! A hand-written search for the built-in e-mail rule ([`PATTERN`]) with exactly the matches of
//! the regex: `find_at(hay, at)` returns what `Regex::new(PATTERN).find_at(hay, at)` returns, for
//! every haystack and every character boundary `at` (a differential test checks it). Used only for
//! a rule whose pattern is byte-identical to [`PATTERN`].
//!
//! The regex is `\b L+ ␣? AT ␣? D+ (?: ␣? DOT ␣? D+)*? ␣? DOT ␣? A{2,} \b`, case-insensitive, with
//! ASCII word boundaries; `␣` is a space, AT one of `@ (at) [at]`, DOT one of `. (dot) [dot]`, and
//! the classes L = `[a-z0-9._%+-]`, D = `[a-z0-9-]`, A = `[a-z]` with Unicode case folding: each
//! holds `A-Z` and two non-ASCII letters, `ſ` (U+017F, folds to `s`) and the Kelvin sign (U+212A,
//! folds to `k`), which are not ASCII word characters.
//!
//! Why a search by hand gives the same leftmost-first match: none of the classes holds a space,
//! `@`, `(` or `[`, so each piece is forced by the text. An `L+` must take the whole run of L
//! characters up to the `␣? AT` that follows it; `D+` a whole run of D characters (what may follow
//! starts with a space or a DOT); each `␣?` takes a space when there is one. Only two choices are
//! left: the lazy loop (the fewest labels after which `␣? DOT ␣? A{2,} \b` matches: tried first at
//! each label, then one more label), and `A{2,}` (greedy: the longest run of A characters, then
//! shorter, that ends at a word boundary). So for an AT, every start in the run of L characters
//! before it gives the same end (or none); the match starts at the leftmost such position at or
//! after `at` where `\b` holds, and AT's are met in the order of their matches' starts (an L run
//! cannot hold an AT's first character nor its closing bracket).

/// The built-in e-mail rule's pattern (the rule of [`super::default_rules`]).
pub(super) const PATTERN: &str = r"(?i)(?-u:\b)[a-z0-9._%+-]+ ?(?:@|\(at\)|\[at\]) ?[a-z0-9-]+(?: ?(?:\.|\(dot\)|\[dot\]) ?[a-z0-9-]+)*? ?(?:\.|\(dot\)|\[dot\]) ?[a-z]{2,}(?-u:\b)";

/// Class bits of an ASCII byte.
const L: u8 = 1;
const D: u8 = 2;
const A: u8 = 4;
const WORD: u8 = 8;

/// Class bits of every byte (none for the bytes of non-ASCII characters: the two non-ASCII class
/// members are looked for where a run of ASCII members stops).
static CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut b = 0;
    while b < 128 {
        let c = b as u8;
        let letter = c.is_ascii_alphabetic();
        let digit = c.is_ascii_digit();
        let mut bits = 0;
        if letter || digit || c == b'.' || c == b'_' || c == b'%' || c == b'+' || c == b'-' {
            bits |= L;
        }
        if letter || digit || c == b'-' {
            bits |= D;
        }
        if letter {
            bits |= A;
        }
        if letter || digit || c == b'_' {
            bits |= WORD;
        }
        t[b] = bits;
        b += 1;
    }
    t
};

/// Length of the non-ASCII class member (`ſ` C5 BF, the Kelvin sign E2 84 AA) that starts at `i`, else 0.
#[inline]
fn folded_at(b: &[u8], i: usize) -> usize {
    match b.get(i..) {
        Some([0xC5, 0xBF, ..]) => 2,
        Some([0xE2, 0x84, 0xAA, ..]) => 3,
        _ => 0,
    }
}

/// Length of the non-ASCII class member that ends at `i`, else 0.
#[inline]
fn folded_before(b: &[u8], i: usize) -> usize {
    if i >= 2 && b[i - 2] == 0xC5 && b[i - 1] == 0xBF {
        2
    } else if i >= 3 && b[i - 3] == 0xE2 && b[i - 2] == 0x84 && b[i - 1] == 0xAA {
        3
    } else {
        0
    }
}

/// Length of the character at `i` if it is in class `bits` (every class holds `ſ` and the Kelvin sign), else 0.
#[inline]
fn member_at(b: &[u8], i: usize, bits: u8) -> usize {
    match b.get(i) {
        Some(&c) if c < 128 => usize::from(CLASS[c as usize] & bits != 0),
        Some(_) => folded_at(b, i),
        None => 0,
    }
}

/// Length of the character that ends at `i` if it is in class `bits`, else 0.
#[inline]
fn member_before(b: &[u8], i: usize, bits: u8) -> usize {
    match i.checked_sub(1).map(|j| b[j]) {
        Some(c) if c < 128 => usize::from(CLASS[c as usize] & bits != 0),
        Some(_) => folded_before(b, i),
        None => 0,
    }
}

#[inline]
fn word(b: &[u8], i: usize) -> bool {
    b.get(i)
        .is_some_and(|&c| c < 128 && CLASS[c as usize] & WORD != 0)
}

/// An ASCII word boundary at `i` (the text's ends count as non-word).
#[inline]
fn boundary(b: &[u8], i: usize) -> bool {
    (i > 0 && word(b, i - 1)) != word(b, i)
}

/// `x`, then the two letters of `word` in either case, then `y`, at `i`.
#[inline]
fn bracketed(b: &[u8], i: usize, word: &[u8]) -> bool {
    let n = word.len();
    b.get(i + 1..i + 1 + n)
        .is_some_and(|w| w.eq_ignore_ascii_case(word))
        && matches!(
            (b[i], b.get(i + 1 + n)),
            (b'(', Some(b')')) | (b'[', Some(b']'))
        )
}

/// Length of the AT at `i` (`@`, `(at)`, `[at]`, any case), else 0.
#[inline]
fn at_sign(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'@') => 1,
        Some(b'(' | b'[') if bracketed(b, i, b"at") => 4,
        _ => 0,
    }
}

/// Length of the DOT at `i` (`.`, `(dot)`, `[dot]`, any case), else 0.
#[inline]
fn dot(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(b'.') => 1,
        Some(b'(' | b'[') if bracketed(b, i, b"dot") => 5,
        _ => 0,
    }
}

/// `i` past one space, if there is one there.
#[inline]
fn space(b: &[u8], i: usize) -> usize {
    i + usize::from(b.get(i) == Some(&b' '))
}

/// The end of the run of class `bits` that starts at `i`.
#[inline]
fn run(b: &[u8], mut i: usize, bits: u8) -> usize {
    loop {
        while let Some(&c) = b.get(i) {
            if CLASS[c as usize] & bits == 0 {
                break;
            }
            i += 1;
        }
        match folded_at(b, i) {
            0 => return i,
            k => i += k,
        }
    }
}

/// `␣? DOT ␣?` at `i`: the position after it.
#[inline]
fn separator(b: &[u8], i: usize) -> Option<usize> {
    let i = space(b, i);
    let k = dot(b, i);
    (k > 0).then(|| space(b, i + k))
}

/// `␣? DOT ␣? A{2,} \b` at `i`: the end of the longest such match.
fn tail(b: &[u8], i: usize) -> Option<usize> {
    let start = separator(b, i)?;
    let mut end = run(b, start, A);
    // While start..end holds two characters or more (more bytes than its first character).
    while end > start && end - start > member_at(b, start, A) {
        if boundary(b, end) {
            return Some(end);
        }
        end -= member_before(b, end, A);
    }
    None
}

/// The end of the match whose AT (of length `at_len`) starts at `i`, if the rest of the pattern
/// matches there.
fn domain(b: &[u8], i: usize) -> Option<usize> {
    let mut j = space(b, i);
    let end = run(b, j, D);
    if end == j {
        return None;
    }
    j = end;
    loop {
        if let Some(e) = tail(b, j) {
            return Some(e);
        }
        let k = separator(b, j)?;
        let end = run(b, k, D);
        if end == k {
            return None;
        }
        j = end;
    }
}

/// The leftmost-first match of [`PATTERN`] in `hay` that starts at or after `at` (a character
/// boundary), as `(start, end)`: the result of the regex's `find_at(hay, at)`.
pub(super) fn find_at(hay: &str, at: usize) -> Option<(usize, usize)> {
    let b = hay.as_bytes();
    let mut from = at;
    while let Some(off) = memchr::memchr3(b'@', b'(', b'[', &b[from..]) {
        let c = from + off;
        from = c + 1;
        let at_len = at_sign(b, c);
        if at_len == 0 {
            continue;
        }
        // The run of L characters before the AT (and its optional space), from `at` on.
        let r1 = if c > at && b[c - 1] == b' ' { c - 1 } else { c };
        let mut lo = r1;
        loop {
            while lo > at && CLASS[b[lo - 1] as usize] & L != 0 {
                lo -= 1;
            }
            match folded_before(b, lo) {
                k if k > 0 && lo - k >= at => lo -= k,
                _ => break,
            }
        }
        if lo == r1 {
            continue;
        }
        // Its leftmost position at a word boundary.
        let mut start = lo;
        while start < r1 && !boundary(b, start) {
            match member_at(b, start, L) {
                0 => start = r1, // cannot happen: the run holds L characters only
                k => start += k,
            }
        }
        if start >= r1 {
            continue;
        }
        if let Some(end) = domain(b, c + at_len) {
            return Some((start, end));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::test_rng as rng;

    /// `find_at` against the regex at every character boundary of `text`.
    fn check(re: &regex::Regex, text: &str) {
        for at in (0..=text.len()).filter(|&i| text.is_char_boundary(i)) {
            let want = re.find_at(text, at).map(|m| (m.start(), m.end()));
            assert_eq!(find_at(text, at), want, "at {at} in {text:?}");
        }
    }

    #[test]
    fn classes_are_those_of_the_pattern() {
        // The classes as the regex compiles them (Unicode case folding adds ſ and the Kelvin sign): every
        // character up to U+FFFF is in a class by hand iff the regex's class holds it.
        for (bits, class) in [
            (L, r"(?i)\A[a-z0-9._%+-]\z"),
            (D, r"(?i)\A[a-z0-9-]\z"),
            (A, r"(?i)\A[a-z]\z"),
        ] {
            let re = regex::Regex::new(class).unwrap();
            for c in (0..=0xFFFFu32).filter_map(char::from_u32) {
                let s = c.to_string();
                let by_hand = member_at(s.as_bytes(), 0, bits) == s.len();
                assert_eq!(by_hand, re.is_match(&s), "{c:?} in {class}");
                assert_eq!(
                    member_before(s.as_bytes(), s.len(), bits) == s.len(),
                    by_hand
                );
            }
        }
    }

    #[test]
    fn examples_match_like_the_regex() {
        let re = regex::Regex::new(PATTERN).unwrap();
        for text in [
            "",
            "@",
            "a@b.cd",
            "user1@mail1.example.com",
            "user1@mail1.example.com\nuser2@mail2.example.org",
            "ivan.petrov (at) example (dot) com",
            "ivan.petrov [AT] example [Dot] com and x(at)y(dot)zz",
            "a @ b . cc",
            "a  @b.cc",
            "a@  b.cc",
            "a@b.c.d.ee.f",
            "a@b.cc.x@d.ee",
            "a@b.cd@e.fg",
            "x.@y.zz",
            "-.-@y.zz",
            ".a@y.zz",
            "é@y.zz ée@y.zz яa@y.zz",
            "ſ@y.zz aſ@y.zz a@ſ.zz a@y.ſſ a@y.zſ a@y.zzſ a@y.zſx a@y.zzſ1",
            "\u{212A}@y.zz a\u{212A}@y.zz a@y.\u{212A}\u{212A} a@y.z\u{212A}1 a@y.co1 a@y.z\u{212A}",
            "a@b.c1.dd a@b.1c.dd a@b.-.dd a@b_c.dd",
            "mailto:john_doe+tag%x@sub-domain.example.co.uk>",
            "a@b(dot)cc a@b(dot) cc a@b (dot)cc a@b(dott)cc a@b(do)cc",
            "(at)b.cc a(at b.cc a[at)b.cc a(at)(at)b.cc",
            "aaaa@@b.cc a@b..cc a@b. .cc a@.b.cc",
        ] {
            check(&re, text);
        }
    }

    #[test]
    fn random_texts_match_like_the_regex() {
        // Differential: texts drawn from the pieces the pattern is made of (and what stops it),
        // every character boundary a starting point.
        let re = regex::Regex::new(PATTERN).unwrap();
        let pieces = [
            "a",
            "b",
            "z",
            "K",
            "S",
            "k",
            "s",
            "ſ",
            "\u{212A}",
            "0",
            "7",
            ".",
            "_",
            "%",
            "+",
            "-",
            " ",
            "  ",
            "@",
            "(at)",
            "[at]",
            "(AT)",
            "[aT]",
            "(at",
            "at)",
            "(dot)",
            "[dot]",
            "(DoT)",
            "dot",
            "(",
            ")",
            "[",
            "]",
            "\n",
            ",",
            "é",
            "я",
            "日",
            "ａ",
            "co",
            "com",
            "example",
            "ivan.petrov",
            "user1",
            "@mail.example.com",
            "x@y.zz",
            "ab12",
            "\u{3000}",
        ];
        let mut next = rng(0x9E37_79B9_7F4A_7C15);
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..1 + next(24) {
                text.push_str(pieces[next(pieces.len())]);
            }
            check(&re, &text);
        }
    }

    #[test]
    fn random_addresses_match_like_the_regex() {
        // Texts of address-like runs: local part, AT, labels, separators, in random variants.
        let re = regex::Regex::new(PATTERN).unwrap();
        let local = [
            "ivan", "a.b", "x_y%z+w", "-", "ſk", "\u{212A}", "é", "user12",
        ];
        let at = ["@", " @", "@ ", " @ ", "(at)", " [AT] ", "@@", "(at"];
        let label = [
            "ex",
            "e",
            "1",
            "a-b",
            "co",
            "uk",
            "ſſ",
            "z\u{212A}",
            "c1",
            "",
            "_x",
        ];
        let sep = [".", " .", ". ", "(dot)", " [dot] ", "..", ". .", "(d0t)"];
        let end = ["", " ", "\n", ",", "x", "1", "ſ", "-", ".", "я", "@"];
        let mut next = rng(0x2545_F491_4F6C_DD1D);
        for _ in 0..20_000 {
            let mut text = String::new();
            for _ in 0..1 + next(3) {
                text.push_str(local[next(local.len())]);
                text.push_str(at[next(at.len())]);
                text.push_str(label[next(label.len())]);
                for _ in 0..next(4) {
                    text.push_str(sep[next(sep.len())]);
                    text.push_str(label[next(label.len())]);
                }
                text.push_str(end[next(end.len())]);
            }
            check(&re, &text);
        }
    }
}
