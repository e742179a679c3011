//! BERT's uncased WordPiece tokenizer (what `tokenizer.json` of a `bert-*-uncased` model describes:
//! `BertNormalizer` with lowercasing and accent stripping, `BertPreTokenizer`, `WordPiece` with the
//! `##` prefix), from the model's `vocab.txt`. Punctuation is ASCII punctuation and the common
//! Unicode punctuation blocks (the model's own tokenizer uses the full Unicode `P*` categories: a
//! rarer punctuation mark here stays inside its word, which then most likely becomes `[UNK]`).

use std::collections::HashMap;

use unicode_normalization::char::is_combining_mark;
use unicode_normalization::UnicodeNormalization;

use crate::LoadError;

/// Longest word WordPiece splits (longer ones are `[UNK]`), as the model's tokenizer.
const MAX_WORD_CHARS: usize = 100;

pub struct WordPiece {
    vocab: HashMap<String, u32>,
    pub cls: u32,
    pub sep: u32,
    unk: u32,
}

impl WordPiece {
    /// From `vocab.txt`: one token a line, its id the line number.
    pub fn from_vocab(text: &str) -> Result<WordPiece, LoadError> {
        let vocab: HashMap<String, u32> = text
            .lines()
            .enumerate()
            .map(|(i, t)| (t.to_string(), i as u32))
            .collect();
        let id = |t: &str| {
            vocab
                .get(t)
                .copied()
                .ok_or_else(|| LoadError::Format(format!("vocab.txt has no {t}")))
        };
        Ok(WordPiece {
            cls: id("[CLS]")?,
            sep: id("[SEP]")?,
            unk: id("[UNK]")?,
            vocab,
        })
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Token ids of `text` (without `[CLS]`/`[SEP]`), at most `max` of them.
    pub fn encode(&self, text: &str, max: usize) -> Vec<u32> {
        let mut ids = Vec::new();
        for word in words(text) {
            if ids.len() >= max {
                break;
            }
            self.word_pieces(&word, &mut ids);
        }
        ids.truncate(max);
        ids
    }

    fn word_pieces(&self, word: &str, ids: &mut Vec<u32>) {
        let chars: Vec<(usize, char)> = word.char_indices().collect();
        if chars.len() > MAX_WORD_CHARS {
            ids.push(self.unk);
            return;
        }
        let mut pieces = Vec::new();
        let mut start = 0;
        let mut piece = String::new();
        while start < chars.len() {
            let mut end = chars.len();
            let mut found = None;
            while end > start {
                let from = chars[start].0;
                let to = chars.get(end).map_or(word.len(), |c| c.0);
                piece.clear();
                if start > 0 {
                    piece.push_str("##");
                }
                piece.push_str(&word[from..to]);
                if let Some(&id) = self.vocab.get(piece.as_str()) {
                    found = Some(id);
                    break;
                }
                end -= 1;
            }
            let Some(id) = found else {
                ids.push(self.unk);
                return;
            };
            pieces.push(id);
            start = end;
        }
        ids.extend(pieces);
    }
}

/// The normalized words and punctuation marks of `text`, in order.
fn words(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut word = String::new();
    let flush = |word: &mut String, out: &mut Vec<String>| {
        if !word.is_empty() {
            out.push(std::mem::take(word));
        }
    };
    for c in text.chars() {
        if c == '\0' || c == '\u{fffd}' || (c.is_control() && !c.is_whitespace()) || is_format(c) {
            continue;
        }
        if c.is_whitespace() {
            flush(&mut word, &mut out);
        } else if is_punctuation(c) || is_cjk(c) {
            flush(&mut word, &mut out);
            out.push(normalize(c));
        } else {
            word.push_str(&normalize(c));
        }
    }
    flush(&mut word, &mut out);
    out
}

/// Lowercased, decomposed, combining marks dropped (`strip_accents` under `lowercase`).
fn normalize(c: char) -> String {
    c.to_lowercase()
        .collect::<String>()
        .nfd()
        .filter(|c| !is_combining_mark(*c))
        .collect()
}

/// Format characters the model's tokenizer drops as control characters (`Cf`), the usual ones.
fn is_format(c: char) -> bool {
    matches!(c, '\u{ad}' | '\u{200b}'..='\u{200f}' | '\u{202a}'..='\u{202e}' | '\u{2060}'..='\u{2064}' | '\u{feff}')
}

fn is_punctuation(c: char) -> bool {
    c.is_ascii_punctuation()
        || matches!(c,
            '\u{a1}' | '\u{a7}' | '\u{ab}' | '\u{b6}' | '\u{b7}' | '\u{bb}' | '\u{bf}'
            | '\u{2010}'..='\u{2027}' | '\u{2030}'..='\u{205e}'
            | '\u{3001}'..='\u{3003}' | '\u{3008}'..='\u{3011}' | '\u{3014}'..='\u{301f}'
            | '\u{ff01}'..='\u{ff0f}' | '\u{ff1a}'..='\u{ff20}' | '\u{ff3b}'..='\u{ff40}'
            | '\u{ff5b}'..='\u{ff65}')
}

/// CJK ideographs, each its own word (`handle_chinese_chars`).
fn is_cjk(c: char) -> bool {
    matches!(c,
        '\u{4e00}'..='\u{9fff}' | '\u{3400}'..='\u{4dbf}' | '\u{20000}'..='\u{2a6df}'
        | '\u{2a700}'..='\u{2b73f}' | '\u{2b740}'..='\u{2b81f}' | '\u{2b820}'..='\u{2ceaf}'
        | '\u{f900}'..='\u{faff}' | '\u{2f800}'..='\u{2fa1f}')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiny() -> WordPiece {
        let vocab = "[PAD]\n[UNK]\n[CLS]\n[SEP]\nun\n##pa\n##id\ninvoice\n##s\n,\ncafe\n!\n中";
        WordPiece::from_vocab(vocab).unwrap()
    }

    #[test]
    fn splits_words_punctuation_and_pieces_as_bert_uncased() {
        let t = tiny();
        // "Unpaid" -> un ##pa ##id; "Invoices," -> invoice ##s ,; "Café" -> cafe (accent stripped).
        assert_eq!(
            t.encode("Unpaid Invoices, Café!", 64),
            [4, 5, 6, 7, 8, 9, 10, 11]
        );
        // A word with no full split is one [UNK]; CJK characters are words of their own.
        assert_eq!(t.encode("zzz 中中", 64), [1, 12, 12]);
        // Control and zero-width characters vanish; the cap holds.
        assert_eq!(t.encode("inv\u{200b}oice\u{0007}", 64), [7]);
        assert_eq!(t.encode("invoice invoice invoice", 2), [7, 7]);
        let long = "a".repeat(MAX_WORD_CHARS + 1);
        assert_eq!(t.encode(&long, 8), [1]);
    }
}
