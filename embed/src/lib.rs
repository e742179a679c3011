//! Sentence embeddings that work offline: a BERT encoder (e.g. `sentence-transformers/
//! all-MiniLM-L6-v2`) read from a model directory that setup installed, mean-pooled and
//! L2-normalized. Nothing here opens a network connection: [`Embedder::load`] reads four files of
//! a directory, each checked for size before it is parsed.
//!
//! The directory holds what a sentence-transformers export has: `config.json`, `model.safetensors`
//! (`F32`), `vocab.txt` (uncased WordPiece), and optionally `sentence_bert_config.json`
//! (`max_seq_length`) and `1_Pooling/config.json` (which must say mean pooling if present).
//!
//! What is whose: the weights file is read by Hugging Face's `safetensors` crate (`weights.rs`);
//! the BERT forward pass (`bert.rs`) is written here on `matrixmultiply`'s sgemm, because a tensor
//! library was too costly to build: `candle-core` took 18 minutes to compile on the project's 2-core
//! machines, where CI must finish within 45. The WordPiece tokenizer (`wordpiece.rs`) is written
//! here too: Hugging Face's `tokenizers` (0.22, default features off) adds about 30 crates and
//! 100 s of compile units, tokenizers itself 34 s; a test checks our ids against its output
//! (`tests/wordpiece_matches_hf.rs`).

mod bert;
mod matmul;
mod weights;
mod wordpiece;

use std::path::{Path, PathBuf};

pub use bert::Config;

/// Why a model directory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("{0}: not found")]
    Missing(PathBuf),
    #[error("{path}: {size} bytes, over the {limit}-byte limit")]
    TooLarge {
        path: PathBuf,
        size: u64,
        limit: u64,
    },
    #[error("{0}: {1}")]
    Io(PathBuf, std::io::Error),
    #[error("{0}")]
    Format(String),
}

/// Size limits of the files read (a MiniLM's weights are 91 MB, its vocabulary 232 KB).
const MAX_WEIGHTS: u64 = 512 << 20;
const MAX_VOCAB: u64 = 4 << 20;
const MAX_JSON: u64 = 64 << 10;
/// Longest text embedded, in bytes (cut at a character boundary before tokenizing).
pub const MAX_TEXT_BYTES: usize = 8 << 10;

/// A loaded model: tokenizer and encoder.
pub struct Embedder {
    tokenizer: wordpiece::WordPiece,
    bert: bert::Bert,
    /// Most tokens per text, `[CLS]` and `[SEP]` included.
    max_tokens: usize,
    dir: PathBuf,
}

fn read_limited(path: &Path, limit: u64) -> Result<Vec<u8>, LoadError> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(LoadError::Missing(path.to_path_buf()))
        }
        Err(e) => return Err(LoadError::Io(path.to_path_buf(), e)),
    };
    if !meta.is_file() {
        return Err(LoadError::Format(format!("{}: not a file", path.display())));
    }
    if meta.len() > limit {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            size: meta.len(),
            limit,
        });
    }
    let bytes = std::fs::read(path).map_err(|e| LoadError::Io(path.to_path_buf(), e))?;
    // The file may have grown between the two calls.
    if bytes.len() as u64 > limit {
        return Err(LoadError::TooLarge {
            path: path.to_path_buf(),
            size: bytes.len() as u64,
            limit,
        });
    }
    Ok(bytes)
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, LoadError> {
    let bytes = read_limited(path, MAX_JSON)?;
    serde_json::from_slice(&bytes)
        .map_err(|e| LoadError::Format(format!("{}: {e}", path.display())))
}

#[derive(serde::Deserialize)]
struct SentenceConfig {
    max_seq_length: Option<usize>,
}

#[derive(serde::Deserialize)]
struct Pooling {
    #[serde(default)]
    pooling_mode_mean_tokens: bool,
}

impl Embedder {
    /// Load the model in `dir` (reads about 100 MB for MiniLM; takes a fraction of a second).
    pub fn load(dir: &Path) -> Result<Embedder, LoadError> {
        if !dir.is_dir() {
            return Err(LoadError::Missing(dir.to_path_buf()));
        }
        let cfg: Config = read_json(&dir.join("config.json"))?;
        let pooling = dir.join("1_Pooling/config.json");
        if pooling.exists() && !read_json::<Pooling>(&pooling)?.pooling_mode_mean_tokens {
            return Err(LoadError::Format(format!(
                "{}: only mean pooling is supported",
                pooling.display()
            )));
        }
        let sentence = dir.join("sentence_bert_config.json");
        let max_seq = if sentence.exists() {
            read_json::<SentenceConfig>(&sentence)?.max_seq_length
        } else {
            None
        };
        let vocab = read_limited(&dir.join("vocab.txt"), MAX_VOCAB)?;
        let vocab = String::from_utf8(vocab)
            .map_err(|_| LoadError::Format("vocab.txt: not UTF-8".into()))?;
        let tokenizer = wordpiece::WordPiece::from_vocab(&vocab)?;
        if tokenizer.vocab_size() > cfg.vocab_size {
            return Err(LoadError::Format(format!(
                "vocab.txt has {} tokens, the model {}",
                tokenizer.vocab_size(),
                cfg.vocab_size
            )));
        }
        let weights = read_limited(&dir.join("model.safetensors"), MAX_WEIGHTS)?;
        let tensors = weights::Tensors::parse(&weights)?;
        let max_tokens = max_seq
            .unwrap_or(cfg.max_position_embeddings)
            .min(cfg.max_position_embeddings)
            .max(3);
        let bert = bert::Bert::load(cfg, &tensors)?;
        Ok(Embedder {
            tokenizer,
            bert,
            max_tokens,
            dir: dir.to_path_buf(),
        })
    }

    /// Where the model was read from.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Length of the vectors [`embed`](Self::embed) returns.
    pub fn dimensions(&self) -> usize {
        self.bert.config().hidden_size
    }

    /// Most tokens of a text that count (the rest is cut), `[CLS]` and `[SEP]` included.
    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// The token ids the encoder sees for `text`: its first [`MAX_TEXT_BYTES`], tokenized, cut to
    /// [`max_tokens`](Self::max_tokens), between `[CLS]` and `[SEP]`.
    pub fn tokens(&self, text: &str) -> Vec<u32> {
        let text = cut(text, MAX_TEXT_BYTES);
        let mut ids = Vec::with_capacity(self.max_tokens);
        ids.push(self.tokenizer.cls);
        ids.extend(self.tokenizer.encode(text, self.max_tokens - 2));
        ids.push(self.tokenizer.sep);
        ids
    }

    /// The unit-length embedding of `text` (mean of the last hidden states, L2-normalized).
    pub fn embed(&self, text: &str) -> Vec<f32> {
        let ids = self.tokens(text);
        let h = self.dimensions();
        let states = self.bert.forward(&ids);
        let mut v = vec![0f32; h];
        for row in states.chunks_exact(h) {
            for (a, b) in v.iter_mut().zip(row) {
                *a += b;
            }
        }
        let n = ids.len() as f32;
        v.iter_mut().for_each(|a| *a /= n);
        normalize(&mut v);
        v
    }
}

/// `text` cut to at most `max` bytes at a character boundary.
pub fn cut(text: &str, max: usize) -> &str {
    if text.len() <= max {
        return text;
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// Scale `v` to unit length (a zero vector stays zero).
pub fn normalize(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// Cosine similarity of two unit vectors (their dot product); 0 when the lengths differ.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return 0.0;
    }
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_whole_characters() {
        assert_eq!(cut("abc", 8), "abc");
        assert_eq!(cut("aé", 2), "a");
        assert_eq!(cut("€€", 4), "€");
    }

    #[test]
    fn a_missing_directory_or_file_is_missing() {
        let dir =
            std::env::temp_dir().join(format!("ctxguard-embed-missing-{}", std::process::id()));
        assert!(matches!(Embedder::load(&dir), Err(LoadError::Missing(_))));
        std::fs::create_dir_all(&dir).unwrap();
        assert!(
            matches!(Embedder::load(&dir), Err(LoadError::Missing(p)) if p.ends_with("config.json"))
        );
        // An oversize file is refused before it is parsed.
        std::fs::write(dir.join("config.json"), vec![b' '; MAX_JSON as usize + 1]).unwrap();
        assert!(matches!(
            Embedder::load(&dir),
            Err(LoadError::TooLarge { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
