//! `ts_rank_cd(tsvector, tsquery)` (cover density, the default weights, no normalisation) read
//! straight from PostgreSQL's in-memory `tsvector` and `tsquery` layouts, for queries whose words
//! are joined by `&`, `|` and `!`: the same `float4` as PostgreSQL's `calc_rank_cd`
//! (`src/backend/utils/adt/tsrank.c`), step for step, without the 32 KiB it zeroes per query item
//! for every page it ranks (`QueryRepresentationOperand`, sized for the positions a phrase
//! operator needs). Phrase operators (`<->`) are not handled here: [`Query::parse`] says
//! [`Unsupported`] and the caller ranks with PostgreSQL.
//!
//! Layouts (`tsearch/ts_type.h`, `tsearch/ts_utils.h`), native byte order, from the 4-byte
//! varlena header:
//! - `tsvector`: `int32` length, `int32` entry count, the entries (`uint32`: `haspos:1, len:11,
//!   pos:20`, the lexeme's offset in the string area), then the string area; an entry with
//!   positions has them after its lexeme at the next even offset: `uint16` count, then that many
//!   `uint16` (`weight:2, pos:14`).
//! - `tsquery`: `int32` length, `int32` item count, 12-byte items in prefix order (an operand:
//!   `int8` type 1, `uint8` weight mask, `bool` prefix, `int32` crc, `uint32` `length:12,
//!   distance:20`; an operator: `int8` type 2, `int8` operator, `int16` distance, `uint32` offset
//!   of its left argument, its right argument following it), then the operands' text.

use std::cmp::Ordering;

/// A query [`rank_cd`] does not rank.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Unsupported {
    /// It has a phrase operator (`<->`, `<N>`): PostgreSQL ranks it.
    Phrase,
    /// Not a `tsquery` this reads (malformed, over [`MAX_ITEMS`] items, or a big-endian machine,
    /// whose bit fields lie otherwise).
    Malformed,
}

/// Most items of a query ranked here (a 200-character search has about 200).
pub const MAX_ITEMS: usize = 4096;
/// Most positions of query words in one vector ranked here (a page's `to_tsvector` keeps at most
/// 255 positions per word): beyond, [`rank_cd`] says `None` rather than allocate without bound.
const MAX_HITS: usize = 1 << 20;

const HEADER: usize = 8;
const ITEM: usize = 12;
const QI_VAL: u8 = 1;
const QI_OPR: u8 = 2;
const OP_NOT: u8 = 1;
const OP_AND: u8 = 2;
const OP_OR: u8 = 3;
const OP_PHRASE: u8 = 4;

/// PostgreSQL's default weights of D, C, B and A (`float4`, used as `double`).
const WEIGHTS: [f32; 4] = [0.1, 0.2, 0.4, 1.0];

#[derive(Debug, Clone, Copy)]
enum Item<'a> {
    Word {
        lexeme: &'a [u8],
        /// Bit `w` set: only positions of weight `w` count (0: all).
        weights: u8,
        prefix: bool,
    },
    Not,
    /// The left argument's offset from this item; the right one is the next item.
    And(usize),
    Or(usize),
}

/// A `tsquery` of words, `&`, `|` and `!`, borrowed from its datum.
#[derive(Debug)]
pub struct Query<'a> {
    items: Vec<Item<'a>>,
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

/// The count after the varlena header (`datum` is the whole value, `VARSIZE` bytes).
fn count(datum: &[u8]) -> Option<usize> {
    usize::try_from(i32::from_ne_bytes(datum.get(4..8)?.try_into().ok()?)).ok()
}

impl<'a> Query<'a> {
    /// The query in `datum` (detoasted, from its 4-byte header).
    pub fn parse(datum: &'a [u8]) -> Result<Self, Unsupported> {
        const BAD: Unsupported = Unsupported::Malformed;
        let size = count(datum).ok_or(BAD)?;
        if size > MAX_ITEMS || cfg!(target_endian = "big") {
            return Err(BAD);
        }
        let operands = HEADER + size * ITEM;
        if datum.len() < operands {
            return Err(BAD);
        }
        let mut items = Vec::with_capacity(size);
        for i in 0..size {
            let at = HEADER + i * ITEM;
            let raw = &datum[at..at + ITEM];
            let item = match raw[0] {
                QI_VAL => {
                    let bits = u32_at(raw, 8).ok_or(BAD)?;
                    let (len, distance) = ((bits & 0xfff) as usize, (bits >> 12) as usize);
                    let start = operands + distance;
                    Item::Word {
                        lexeme: datum.get(start..start + len).ok_or(BAD)?,
                        weights: raw[1],
                        prefix: raw[2] != 0,
                    }
                }
                QI_OPR => {
                    let left = u32_at(raw, 4).ok_or(BAD)? as usize;
                    // Arguments lie after their operator, inside the query: evaluation moves
                    // forward and ends.
                    let (right_ok, left_ok) = (i + 1 < size, left >= 1 && i + left < size);
                    match raw[1] {
                        OP_NOT if right_ok => Item::Not,
                        OP_AND if right_ok && left_ok => Item::And(left),
                        OP_OR if right_ok && left_ok => Item::Or(left),
                        OP_PHRASE if right_ok && left_ok => return Err(Unsupported::Phrase),
                        _ => return Err(BAD),
                    }
                }
                _ => return Err(BAD),
            };
            items.push(item);
        }
        Ok(Query { items })
    }

    /// `TS_execute` over which operands are present (no positions: no phrase operators).
    fn holds(&self, at: usize, present: &[bool]) -> bool {
        match self.items[at] {
            Item::Word { .. } => present[at],
            Item::Not => !self.holds(at + 1, present),
            Item::And(left) => self.holds(at + left, present) && self.holds(at + 1, present),
            Item::Or(left) => self.holds(at + left, present) || self.holds(at + 1, present),
        }
    }
}

/// A `tsvector` borrowed from its datum.
struct Vector<'a> {
    datum: &'a [u8],
    size: usize,
}

impl<'a> Vector<'a> {
    fn parse(datum: &'a [u8]) -> Option<Self> {
        let size = count(datum)?;
        (datum.len() >= HEADER + size.checked_mul(4)?).then_some(Vector { datum, size })
    }

    fn strings(&self) -> usize {
        HEADER + self.size * 4
    }

    /// Entry `i`: whether it has positions, its lexeme's length and offset in the string area.
    fn entry(&self, i: usize) -> (bool, usize, usize) {
        let e = u32_at(self.datum, HEADER + i * 4).unwrap_or(0);
        (e & 1 == 1, ((e >> 1) & 0x7ff) as usize, (e >> 12) as usize)
    }

    fn lexeme(&self, i: usize) -> Option<&'a [u8]> {
        let (_, len, pos) = self.entry(i);
        let start = self.strings() + pos;
        self.datum.get(start..start + len)
    }

    /// The entry's positions (`weight:2, pos:14`); none for a lexeme stored without them.
    fn positions(&self, i: usize) -> Option<impl ExactSizeIterator<Item = u16> + 'a> {
        let (has_positions, len, pos) = self.entry(i);
        let at = self.strings() + ((pos + len + 1) & !1); // SHORTALIGN
        let list = if has_positions {
            let n = u16_at(self.datum, at)? as usize;
            self.datum.get(at + 2..at + 2 + 2 * n)?
        } else {
            &[]
        };
        Some(
            list.chunks_exact(2)
                .map(|c| u16::from_ne_bytes([c[0], c[1]])),
        )
    }
}

/// `tsCompareString(a, b, prefix)`: bytes, then length (a prefix matches longer strings).
fn compare(a: &[u8], b: &[u8], prefix: bool) -> Ordering {
    let n = a.len().min(b.len());
    match a[..n].cmp(&b[..n]) {
        Ordering::Equal if prefix => {
            if a.len() > b.len() {
                Ordering::Greater
            } else {
                Ordering::Equal
            }
        }
        Ordering::Equal => a.len().cmp(&b.len()),
        other => other,
    }
}

/// `find_wordentry`: the entries `word` matches (one, or with `prefix` every entry it begins).
fn entries(v: &Vector<'_>, word: &[u8], prefix: bool) -> Option<std::ops::Range<usize>> {
    let (mut low, mut high) = (0, v.size);
    let mut found = false;
    while low < high {
        let middle = low + (high - low) / 2;
        match compare(word, v.lexeme(middle)?, false) {
            Ordering::Equal => {
                high = middle;
                found = true;
                break;
            }
            Ordering::Greater => low = middle + 1,
            Ordering::Less => high = middle,
        }
    }
    if !prefix {
        return Some(if found { high..high + 1 } else { high..high });
    }
    let mut end = high;
    while end < v.size && compare(word, v.lexeme(end)?, true) == Ordering::Equal {
        end += 1;
    }
    Some(high..end)
}

const fn position(p: u16) -> u16 {
    p & 0x3fff
}

const fn weight(p: u16) -> usize {
    (p >> 14) as usize
}

/// One position of a query word in the text (`DocRepresentation`): its query items.
struct Hit {
    pos: u16,
    items: std::ops::Range<usize>,
}

/// `ts_rank_cd(tsvector, query)` for the detoasted `tsvector` in `vector`, or `None` when that is
/// not a well-formed `tsvector` (or holds over a million positions of the query's words).
/// `interrupt` runs every 4,096 steps (matching entries, cover steps).
pub fn rank_cd(vector: &[u8], query: &Query<'_>, interrupt: &mut dyn FnMut()) -> Option<f32> {
    let v = Vector::parse(vector)?;
    // get_docrep: every position of every matching entry, in query order, then sorted by
    // position, weight and entry; one hit per (position, entry) with all the items it matches.
    let mut raw: Vec<(u16, usize, usize)> = Vec::new(); // (position, entry, item)
    let mut steps = 0usize;
    let mut step = |n: usize| {
        steps += n;
        if steps >= 4096 {
            steps = 0;
            interrupt();
        }
    };
    for (i, item) in query.items.iter().enumerate() {
        let Item::Word {
            lexeme,
            weights,
            prefix,
        } = *item
        else {
            continue;
        };
        for e in entries(&v, lexeme, prefix)? {
            let positions = v.positions(e)?;
            step(1 + positions.len());
            if raw.len() > MAX_HITS {
                return None;
            }
            for p in positions {
                if weights == 0 || weights & (1 << weight(p)) != 0 {
                    raw.push((p, e, i));
                }
            }
        }
    }
    if raw.is_empty() {
        return Some(0.0);
    }
    raw.sort_unstable_by(|a, b| {
        (position(a.0), weight(a.0), a.1).cmp(&(position(b.0), weight(b.0), b.1))
    });
    let mut items = Vec::with_capacity(raw.len());
    let mut hits: Vec<Hit> = Vec::new();
    let mut previous: Option<(u16, usize)> = None;
    for &(p, e, i) in &raw {
        if previous != Some((p, e)) {
            hits.push(Hit {
                pos: p,
                items: items.len()..items.len(),
            });
            previous = Some((p, e));
        }
        items.push(i);
        if let Some(last) = hits.last_mut() {
            last.items.end = items.len();
        }
    }

    let inverse = WEIGHTS.map(|w| 1.0 / f64::from(w));
    let mut present = vec![false; query.items.len()];
    let fill = |present: &mut [bool], hit: &Hit| {
        for &i in &items[hit.items.clone()] {
            present[i] = true;
        }
    };
    let mut wdoc = 0.0f64;
    let mut start = 0usize;
    // Cover: from `start`, the first hit at which the query holds (the cover's end), then back
    // from there the last hit at which it holds (its beginning).
    while start < hits.len() {
        present.iter_mut().for_each(|p| *p = false);
        let mut end = None;
        let mut q = 0i32;
        for (at, hit) in hits.iter().enumerate().skip(start) {
            step(1);
            fill(&mut present, hit);
            if query.holds(0, &present) {
                if i32::from(position(hit.pos)) > q {
                    q = i32::from(position(hit.pos));
                    end = Some(at);
                }
                break;
            }
        }
        let Some(end) = end else { break };
        present.iter_mut().for_each(|p| *p = false);
        let mut p = i32::MAX;
        let mut begin = end;
        let mut at = end as isize;
        while at >= start as isize {
            step(1);
            let hit = &hits[at as usize];
            fill(&mut present, hit);
            if query.holds(0, &present) {
                if i32::from(position(hit.pos)) < p {
                    begin = at as usize;
                    p = i32::from(position(hit.pos));
                }
                break;
            }
            at -= 1;
        }
        if p > q {
            start += 1;
            continue;
        }
        start = at as usize + 1;
        let inv_sum = hits[begin..=end]
            .iter()
            .fold(0.0f64, |sum, h| sum + inverse[weight(h.pos)]);
        let span = (end - begin) as i32;
        let cpos = f64::from(span + 1) / inv_sum;
        let mut noise = (q - p) - span;
        if noise < 0 {
            noise = span / 2;
        }
        wdoc += cpos / f64::from(1 + noise);
    }
    Some(wdoc as f32)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `tsvector` datum of `(lexeme, positions)` in PostgreSQL's order (byte order of the
    /// lexemes); `None` positions: a stripped entry.
    fn vector(entries: &[(&str, Option<&[u16]>)]) -> Vec<u8> {
        let mut strings = Vec::new();
        let mut words = Vec::new();
        for (lexeme, positions) in entries {
            let pos = strings.len() as u32;
            strings.extend_from_slice(lexeme.as_bytes());
            let mut e = (pos << 12) | ((lexeme.len() as u32) << 1);
            if let Some(ps) = positions {
                e |= 1;
                if strings.len() % 2 == 1 {
                    strings.push(0);
                }
                strings.extend_from_slice(&(ps.len() as u16).to_ne_bytes());
                for p in *ps {
                    strings.extend_from_slice(&p.to_ne_bytes());
                }
            }
            words.push(e);
        }
        let mut out = Vec::new();
        let total = HEADER + 4 * words.len() + strings.len();
        out.extend_from_slice(&((total as u32) << 2).to_ne_bytes());
        out.extend_from_slice(&(words.len() as i32).to_ne_bytes());
        for e in words {
            out.extend_from_slice(&e.to_ne_bytes());
        }
        out.extend_from_slice(&strings);
        out
    }

    /// Positions as `tsvector` literals write them: `(pos, weight)` with weight 3 = A ... 0 = D.
    fn at(list: &[(u16, u16)]) -> Vec<u16> {
        list.iter().map(|&(p, w)| (w << 14) | p).collect()
    }

    enum Q {
        W(&'static str, u8, bool),
        Not(Box<Q>),
        And(Box<Q>, Box<Q>),
        Or(Box<Q>, Box<Q>),
        Phrase(Box<Q>, Box<Q>),
    }
    fn w(s: &'static str) -> Q {
        Q::W(s, 0, false)
    }
    fn and(a: Q, b: Q) -> Q {
        Q::And(Box::new(a), Box::new(b))
    }
    fn or(a: Q, b: Q) -> Q {
        Q::Or(Box::new(a), Box::new(b))
    }
    fn not(a: Q) -> Q {
        Q::Not(Box::new(a))
    }

    /// A `tsquery` datum in PostgreSQL's prefix order (an operator, its right argument, its
    /// left argument).
    fn query(q: &Q) -> Vec<u8> {
        fn walk(q: &Q, items: &mut Vec<[u8; ITEM]>, text: &mut Vec<u8>) {
            let at = items.len();
            items.push([0; ITEM]);
            let op = |oper: u8, left: usize| {
                let mut it = [0u8; ITEM];
                it[0] = QI_OPR;
                it[1] = oper;
                it[4..8].copy_from_slice(&(left as u32).to_ne_bytes());
                it
            };
            match q {
                Q::W(s, weights, prefix) => {
                    let mut it = [0u8; ITEM];
                    it[0] = QI_VAL;
                    it[1] = *weights;
                    it[2] = u8::from(*prefix);
                    let bits = (s.len() as u32) | ((text.len() as u32) << 12);
                    it[8..12].copy_from_slice(&bits.to_ne_bytes());
                    text.extend_from_slice(s.as_bytes());
                    text.push(0);
                    items[at] = it;
                }
                Q::Not(a) => {
                    walk(a, items, text);
                    items[at] = op(OP_NOT, 0);
                }
                Q::And(l, r) | Q::Or(l, r) | Q::Phrase(l, r) => {
                    walk(r, items, text);
                    let left = items.len() - at;
                    walk(l, items, text);
                    let oper = match q {
                        Q::And(..) => OP_AND,
                        Q::Or(..) => OP_OR,
                        _ => 4,
                    };
                    items[at] = op(oper, left);
                }
            }
        }
        let (mut items, mut text) = (Vec::new(), Vec::new());
        walk(q, &mut items, &mut text);
        let mut out = Vec::new();
        let total = HEADER + ITEM * items.len() + text.len();
        out.extend_from_slice(&((total as u32) << 2).to_ne_bytes());
        out.extend_from_slice(&(items.len() as i32).to_ne_bytes());
        for it in items {
            out.extend_from_slice(&it);
        }
        out.extend_from_slice(&text);
        out
    }

    fn rank(v: &[u8], q: &Q) -> f32 {
        let q = query(q);
        rank_cd(v, &Query::parse(&q).expect("supported"), &mut || {}).expect("well formed")
    }

    /// The expected values are PostgreSQL 15's `ts_rank_cd(v::tsvector, q::tsquery)` for the
    /// literals in the comments (`float4` printed exactly, so the bits must match).
    #[test]
    fn same_float4_as_postgresql() {
        let abc = vector(&[
            ("a", Some(&[1, 4])),
            ("b", Some(&[2, 5])),
            ("c", Some(&[3])),
        ]);
        // 'a:1,4 b:2,5 c:3'
        assert_eq!(rank(&abc, &and(w("a"), w("c"))), 0.15);
        assert_eq!(rank(&abc, &or(w("a"), w("c"))), 0.3);
        assert_eq!(rank(&abc, &and(w("a"), not(w("c")))), 0.1);
        assert_eq!(rank(&abc, &not(w("c"))), 0.0);
        assert_eq!(rank(&abc, &w("b")), 0.2);
        // 'a:1A,4B b:2C,5 c:3'
        let weighted = vector(&[
            ("a", Some(&at(&[(1, 3), (4, 2)]))),
            ("b", Some(&at(&[(2, 1), (5, 0)]))),
            ("c", Some(&[3])),
        ]);
        assert_eq!(rank(&weighted, &and(w("a"), w("b"))), 0.626_666_67);
        // 'a:B & b'
        assert_eq!(
            rank(&weighted, &and(Q::W("a", 1 << 2, false), w("b"))),
            0.293_333_35
        );
        // 'abc:1 abd:5 abe:9 x:3'
        let prefixed = vector(&[
            ("abc", Some(&[1])),
            ("abd", Some(&[5])),
            ("abe", Some(&[9])),
            ("x", Some(&[3])),
        ]);
        assert_eq!(rank(&prefixed, &and(Q::W("ab", 0, true), w("x"))), 0.1);
        assert_eq!(rank(&prefixed, &Q::W("ab", 0, true)), 0.3);
        // 'a b c': no positions, no rank
        let stripped = vector(&[("a", None), ("b", None), ("c", None)]);
        assert_eq!(rank(&stripped, &and(w("a"), w("b"))), 0.0);
        // 'a:1 b:16383 c:16383': the cover's positions coincide (noise is half its length)
        let far = vector(&[
            ("a", Some(&[1])),
            ("b", Some(&[16383])),
            ("c", Some(&[16383])),
        ]);
        assert_eq!(rank(&far, &and(w("b"), w("c"))), 0.1);
        // 'a:1,20,40 b:10,30 c:50'
        let spread = vector(&[
            ("a", Some(&[1, 20, 40])),
            ("b", Some(&[10, 30])),
            ("c", Some(&[50])),
        ]);
        assert_eq!(
            rank(&spread, &and(and(w("a"), w("b")), w("c"))),
            0.005_263_158
        );
        assert_eq!(rank(&spread, &and(or(w("a"), w("b")), w("c"))), 0.01);
        assert_eq!(rank(&spread, &and(w("a"), w("a"))), 0.3);
        // 'x:1' and 'y'
        assert_eq!(rank(&vector(&[("x", Some(&[1]))]), &w("y")), 0.0);
        // 'a:3 b:3'
        let same = vector(&[("a", Some(&[3])), ("b", Some(&[3]))]);
        assert_eq!(rank(&same, &and(w("a"), w("b"))), 0.1);
        // 'a:2,7,9 b:1,8 c:4,5,6'
        let mixed = vector(&[
            ("a", Some(&[2, 7, 9])),
            ("b", Some(&[1, 8])),
            ("c", Some(&[4, 5, 6])),
        ]);
        assert_eq!(rank(&mixed, &and(and(w("a"), w("b")), not(w("c")))), 0.1);
    }

    #[test]
    fn phrases_and_malformed_data_are_not_ranked_here() {
        assert_eq!(
            Query::parse(&query(&Q::Phrase(Box::new(w("a")), Box::new(w("b"))))).err(),
            Some(Unsupported::Phrase)
        );
        let good = query(&and(w("a"), w("b")));
        // Truncated, a wrong length, an operand past the end, a left argument out of range.
        assert!(Query::parse(&good[..good.len() - 2]).is_err());
        assert!(Query::parse(&good[..6]).is_err());
        let mut far = good.clone();
        far[HEADER + ITEM + 8..HEADER + ITEM + 12]
            .copy_from_slice(&(1u32 | (4000 << 12)).to_ne_bytes());
        assert!(Query::parse(&far).is_err());
        let mut left = good.clone();
        left[HEADER + 4..HEADER + 8].copy_from_slice(&7u32.to_ne_bytes());
        assert!(Query::parse(&left).is_err());
        let mut zero = good;
        zero[HEADER + 4..HEADER + 8].copy_from_slice(&0u32.to_ne_bytes());
        assert!(Query::parse(&zero).is_err());
        // A vector whose entry points past its data.
        let q = query(&w("a"));
        let q = Query::parse(&q).expect("supported");
        let mut v = vector(&[("a", Some(&[1]))]);
        v[HEADER..HEADER + 4].copy_from_slice(&((100u32 << 12) | (1 << 1) | 1).to_ne_bytes());
        assert_eq!(rank_cd(&v, &q, &mut || {}), None);
        assert_eq!(rank_cd(&v[..5], &q, &mut || {}), None);
    }

    #[test]
    fn a_million_positions_are_not_gathered() {
        // A vector's strings and positions fit in 1 MB (its 20-bit offsets): 8 words of 16,383
        // positions. Each query item gathers the positions it matches: 9 prefix items matching
        // all 8 words gather 1,179,576, past MAX_HITS; 7 gather 917,448, under it.
        let many: Vec<u16> = (1..=16_383).collect();
        let names: Vec<String> = (0..8).map(|i| format!("a{i}")).collect();
        let entries: Vec<(&str, Option<&[u16]>)> = names
            .iter()
            .map(|n| (n.as_str(), Some(&many[..])))
            .collect();
        let v = vector(&entries);
        let items = |n: usize| (1..n).fold(Q::W("a", 0, true), |q, _| or(Q::W("a", 0, true), q));
        let q = query(&items(9));
        let q = Query::parse(&q).expect("supported");
        let mut calls = 0;
        assert_eq!(rank_cd(&v, &q, &mut || calls += 1), None);
        assert!(calls >= 1, "interrupts are checked while gathering");
        let q = query(&items(7));
        let q = Query::parse(&q).expect("supported");
        assert!(rank_cd(&v, &q, &mut || {}).is_some_and(|r| r > 0.0));
    }

    #[test]
    fn long_pages_check_for_interrupts() {
        let many: Vec<u16> = (1..=8000).collect();
        let v = vector(&[("a", Some(&many)), ("b", Some(&[16000]))]);
        let q = query(&and(w("a"), w("b")));
        let mut calls = 0;
        rank_cd(&v, &Query::parse(&q).expect("supported"), &mut || {
            calls += 1
        });
        assert!(calls >= 1);
    }
}
