//! Embeddings for tool search: the offline model (`ctxguard-embed`, from `CTXGUARD_EMBED_MODEL_DIR`)
//! by default, or an OpenAI-compatible `/v1/embeddings` endpoint, or none (lexical order only).
//! A tool's vector is computed once per definition (keyed by a hash of the text embedded) and kept
//! in a bounded cache; a query's vector once per call.
//!
//! The offline model loads on a thread of its own (about 100 MB, half a second): the gateway
//! serves at once and ranks lexically until the model is there.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use ctxguard_embed::{cosine, cut, Embedder, MAX_TEXT_BYTES};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::fusion::{fuse, Fused, FIND_COSINE};
use crate::catalog::ToolSpec;

/// Longest query embedded, in bytes (the model then cuts at its token limit).
pub const MAX_QUERY_BYTES: usize = 2048;
/// Most bytes of an embeddings endpoint's answer read.
const MAX_EMBEDDINGS_BODY_BYTES: usize = 32 * 1024 * 1024;
/// Most dimensions of an endpoint's vector (OpenAI's largest model has 3,072).
const MAX_EMBEDDING_DIMS: usize = 8192;
/// Tool vectors kept (about 1.5 kB each with MiniLM: 24 MB at most).
const CACHE_ENTRIES: usize = 16_384;

/// Where vectors come from.
pub enum Embeddings {
    /// No model: the lexical order alone.
    None,
    /// The offline model.
    Local(Arc<Embedder>),
    /// An OpenAI-compatible embeddings endpoint (`{base}/embeddings`).
    Provider {
        http: reqwest::Client,
        base_url: String,
        api_key: Option<String>,
        model: String,
    },
}

/// A query's vector and its candidates' vectors, in candidate order.
type Vectors = (Vec<f32>, Vec<Arc<Vec<f32>>>);

/// Ranks the visible tools for a request.
pub struct Ranker {
    /// Empty while the offline model loads (then the lexical order stands).
    embeddings: OnceLock<Embeddings>,
    /// Most upstream tools of one server in an answer (the database's
    /// `ctxguard.max_offered_tools_per_server`, default 8).
    per_server: usize,
    cache: Mutex<HashMap<[u8; 32], Arc<Vec<f32>>>>,
}

/// The text a tool is embedded from: its name as words (the namespace is its first part), its
/// description, and its arguments' names and descriptions.
pub fn definition_text(tool: &ToolSpec) -> String {
    let mut text: String = tool
        .name
        .chars()
        .map(|c| if matches!(c, '.' | '_' | '-') { ' ' } else { c })
        .collect();
    if let Some(title) = &tool.title {
        text.push_str(". ");
        text.push_str(title);
    }
    text.push_str(". ");
    text.push_str(&tool.description);
    if let Some(props) = tool
        .input_schema
        .get("properties")
        .and_then(Value::as_object)
    {
        for (name, prop) in props {
            text.push_str(if text.ends_with('.') { " " } else { ". " });
            text.push_str(&name.replace('_', " "));
            if let Some(d) = prop.get("description").and_then(Value::as_str) {
                text.push_str(": ");
                text.push_str(d);
            }
        }
    }
    cut(&text, MAX_TEXT_BYTES).to_string()
}

/// The ranker the configuration asks for. The offline model is loaded once per process and
/// directory (about 100 MB, shared by every state built from the same configuration).
pub fn from_config(config: &crate::config::Config) -> Arc<Ranker> {
    use crate::config::EmbedProvider;
    // The database's default `ctxguard.max_offered_tools_per_server`.
    const PER_SERVER: usize = 8;
    match config.embed_provider {
        EmbedProvider::None => {
            tracing::info!("tool search: lexical matching only (CTXGUARD_EMBED_PROVIDER=none)");
            Arc::new(Ranker::new(Embeddings::None, PER_SERVER))
        }
        EmbedProvider::Openai => Arc::new(Ranker::new(
            Embeddings::Provider {
                http: reqwest::Client::builder()
                    .timeout(config.llm_timeout())
                    .build()
                    .unwrap_or_default(),
                base_url: config.embed_base_url.clone().unwrap_or_default(),
                api_key: config.embed_api_key.clone(),
                model: config.embed_model.clone(),
            },
            PER_SERVER,
        )),
        EmbedProvider::Offline => {
            static LOADED: Mutex<Vec<(std::path::PathBuf, Arc<Ranker>)>> = Mutex::new(Vec::new());
            let dir = config.embed_model_dir();
            let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
            if let Some((_, r)) = loaded.iter().find(|(d, _)| *d == dir) {
                return r.clone();
            }
            let r = Ranker::load_in_background(PER_SERVER, {
                let dir = dir.clone();
                move || Ranker::model_dir_embeddings(&dir)
            });
            loaded.push((dir, r.clone()));
            r
        }
    }
}

impl Ranker {
    pub fn new(embeddings: Embeddings, per_server: usize) -> Ranker {
        Ranker {
            embeddings: OnceLock::from(embeddings),
            per_server: per_server.max(1),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// A ranker that ranks lexically until `load` (run on a thread of its own) has returned its
    /// embeddings.
    pub fn load_in_background(
        per_server: usize,
        load: impl FnOnce() -> Embeddings + Send + 'static,
    ) -> Arc<Ranker> {
        let ranker = Arc::new(Ranker {
            embeddings: OnceLock::new(),
            per_server: per_server.max(1),
            cache: Mutex::new(HashMap::new()),
        });
        let weak = Arc::downgrade(&ranker);
        let spawned = std::thread::Builder::new()
            .name("ctxguard-embed-load".into())
            .spawn(move || {
                let embeddings = load();
                if let Some(r) = weak.upgrade() {
                    let _ = r.embeddings.set(embeddings);
                }
            });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "tool search: cannot start the model's loader, lexical matching only");
            let _ = ranker.embeddings.set(Embeddings::None);
        }
        ranker
    }

    /// The offline model in `dir`, or lexical only (with the reason logged) when it cannot be
    /// loaded. Reads about 100 MB: call once at startup.
    pub fn from_model_dir(dir: &Path, per_server: usize) -> Ranker {
        Ranker::new(Ranker::model_dir_embeddings(dir), per_server)
    }

    fn model_dir_embeddings(dir: &Path) -> Embeddings {
        let started = Instant::now();
        match Embedder::load(dir) {
            Ok(e) => {
                tracing::info!(dir = %dir.display(), dimensions = e.dimensions(),
                    took_ms = started.elapsed().as_millis() as u64,
                    "tool search: semantic matching with the offline embedding model");
                Embeddings::Local(Arc::new(e))
            }
            Err(err) => {
                tracing::warn!(dir = %dir.display(), error = %err,
                    "tool search: no embedding model, lexical matching only (scripts/setup.sh installs the model)");
                Embeddings::None
            }
        }
    }

    /// The embeddings in use: none while the model loads.
    fn embeddings(&self) -> &Embeddings {
        self.embeddings.get().unwrap_or(&Embeddings::None)
    }

    /// Whether the embeddings are settled (the model loaded or given up on).
    pub fn is_ready(&self) -> bool {
        self.embeddings.get().is_some()
    }

    /// Wait at most `timeout` for [`is_ready`](Self::is_ready) (tests and benchmarks).
    pub fn wait_ready(&self, timeout: Duration) -> bool {
        let until = Instant::now() + timeout;
        while !self.is_ready() {
            if Instant::now() >= until {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// Whether vectors are used at all.
    pub fn is_semantic(&self) -> bool {
        !matches!(self.embeddings(), Embeddings::None)
    }

    /// The names of at most `top_k` of `candidates` (the tools the database returned as visible
    /// for the context; nothing else is ever returned), best first, for `query`. `lexical_order` is
    /// the database's lexical ranking (`find_tools`). A provider that fails leaves the lexical order
    /// (logged).
    pub async fn rank_for_query(
        &self,
        query: &str,
        candidates: &[ToolSpec],
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let vectors = self.vectors_for(query, candidates).await;
        self.place(candidates, vectors.as_ref(), lexical_order, top_k)
    }

    /// What a search (`find_tools`) finds: [`rank_for_query`](Self::rank_for_query)'s order of the
    /// candidates that come near the query (cosine at least [`FIND_COSINE`]) or match it
    /// lexically. Tools far from the request are not returned (they would only lengthen the
    /// model's list): a search for something the page does not offer finds nothing.
    pub async fn find_for_query(
        &self,
        query: &str,
        candidates: &[ToolSpec],
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let vectors = self.vectors_for(query, candidates).await;
        self.place_near(candidates, vectors, lexical_order, top_k)
    }

    /// [`find_for_query`](Self::find_for_query) on the calling thread (benchmarks and tests).
    pub fn find_blocking(
        &self,
        query: &str,
        candidates: &[ToolSpec],
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let vectors = self.vectors_blocking(query, candidates);
        self.place_near(candidates, vectors, lexical_order, top_k)
    }

    /// [`place`](Self::place) of the candidates near the query or matching it lexically.
    fn place_near(
        &self,
        candidates: &[ToolSpec],
        vectors: Option<Vectors>,
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let Some((q, tools)) = vectors else {
            return self.place(candidates, None, lexical_order, top_k);
        };
        let near: Vec<usize> = (0..candidates.len())
            .filter(|&i| {
                cosine(&q, &tools[i]) >= FIND_COSINE || lexical_order.contains(&candidates[i].name)
            })
            .collect();
        let kept: Vec<ToolSpec> = near.iter().map(|&i| candidates[i].clone()).collect();
        let vectors = (q, near.iter().map(|&i| tools[i].clone()).collect());
        self.place(&kept, Some(&vectors), lexical_order, top_k)
    }

    async fn vectors_for(&self, query: &str, candidates: &[ToolSpec]) -> Option<Vectors> {
        match self.embeddings() {
            Embeddings::None => None,
            Embeddings::Local(model) => {
                let model = model.clone();
                let query = cut(query, MAX_QUERY_BYTES).to_string();
                let texts: Vec<String> = candidates.iter().map(definition_text).collect();
                let cached = self.cached(&texts);
                let computed = tokio::task::spawn_blocking(move || {
                    let (q, tools) = embed_missing(&model, &query, &texts, &cached);
                    (q, tools, texts)
                })
                .await;
                match computed {
                    Ok((q, fresh, texts)) => Some((q, self.merge(&texts, fresh))),
                    Err(e) => {
                        tracing::warn!(error = %e, "tool search: embedding failed, lexical order");
                        None
                    }
                }
            }
            Embeddings::Provider { .. } => match self.provider_vectors(query, candidates).await {
                Ok(v) => Some(v),
                Err(e) => {
                    tracing::warn!(error = %e, "tool search: embeddings endpoint failed, lexical order");
                    None
                }
            },
        }
    }

    /// [`rank_for_query`](Self::rank_for_query) on the calling thread (offline model or none):
    /// for benchmarks and tests.
    pub fn rank_blocking(
        &self,
        query: &str,
        candidates: &[ToolSpec],
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let vectors = self.vectors_blocking(query, candidates);
        self.place(candidates, vectors.as_ref(), lexical_order, top_k)
    }

    fn vectors_blocking(&self, query: &str, candidates: &[ToolSpec]) -> Option<Vectors> {
        match self.embeddings() {
            Embeddings::Local(model) => {
                let texts: Vec<String> = candidates.iter().map(definition_text).collect();
                let (q, fresh) = embed_missing(
                    model,
                    cut(query, MAX_QUERY_BYTES),
                    &texts,
                    &self.cached(&texts),
                );
                Some((q, self.merge(&texts, fresh)))
            }
            _ => None,
        }
    }

    fn place(
        &self,
        candidates: &[ToolSpec],
        vectors: Option<&Vectors>,
        lexical_order: &[String],
        top_k: usize,
    ) -> Vec<String> {
        let fused: Vec<Fused<'_>> = candidates
            .iter()
            .enumerate()
            .map(|(i, t)| Fused {
                name: &t.name,
                server: t.server.as_deref(),
                cosine: vectors.map(|(q, tools)| cosine(q, &tools[i])),
            })
            .collect();
        fuse(&fused, lexical_order, top_k, self.per_server)
    }

    fn key(&self, text: &str) -> [u8; 32] {
        let model = match self.embeddings() {
            Embeddings::Local(m) => m.dir().display().to_string(),
            Embeddings::Provider { model, .. } => model.clone(),
            Embeddings::None => String::new(),
        };
        let mut h = Sha256::new();
        h.update(model.as_bytes());
        h.update([0]);
        h.update(text.as_bytes());
        h.finalize().into()
    }

    fn cached(&self, texts: &[String]) -> Vec<Option<Arc<Vec<f32>>>> {
        let cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        texts
            .iter()
            .map(|t| cache.get(&self.key(t)).cloned())
            .collect()
    }

    /// Put freshly computed vectors in the cache; every text's vector, in order.
    fn merge(&self, texts: &[String], fresh: Vec<Option<Vec<f32>>>) -> Vec<Arc<Vec<f32>>> {
        let mut cache = self.cache.lock().unwrap_or_else(|e| e.into_inner());
        texts
            .iter()
            .zip(fresh)
            .map(|(t, f)| {
                let key = self.key(t);
                match f {
                    Some(v) => {
                        if cache.len() >= CACHE_ENTRIES {
                            // Bounded: a full cache starts over (definitions change rarely; the
                            // next calls recompute what they need).
                            cache.clear();
                        }
                        let v = Arc::new(v);
                        cache.insert(key, v.clone());
                        v
                    }
                    None => cache.get(&key).cloned().unwrap_or_default(),
                }
            })
            .collect()
    }

    async fn provider_vectors(
        &self,
        query: &str,
        candidates: &[ToolSpec],
    ) -> Result<Vectors, String> {
        let Embeddings::Provider {
            http,
            base_url,
            api_key,
            model,
        } = self.embeddings()
        else {
            return Err("no provider".into());
        };
        let texts: Vec<String> = candidates.iter().map(definition_text).collect();
        let cached = self.cached(&texts);
        let mut inputs = vec![cut(query, MAX_QUERY_BYTES).to_string()];
        inputs.extend(
            cached
                .iter()
                .zip(&texts)
                .filter(|(c, _)| c.is_none())
                .map(|(_, t)| t.clone()),
        );
        let mut req = http
            .post(format!("{}/embeddings", base_url.trim_end_matches('/')))
            .json(&json!({"model": model, "input": inputs}));
        if let Some(key) = api_key {
            req = req.bearer_auth(key);
        }
        let resp = req.send().await.map_err(|e| e.to_string())?;
        if !resp.status().is_success() {
            return Err(format!("HTTP {}", resp.status()));
        }
        // A query and up to a batch of tool texts: a few MB of floats at most.
        let body = crate::bounded::body(resp, MAX_EMBEDDINGS_BODY_BYTES)
            .await
            .map_err(|e| e.to_string())?;
        // Read typed (no generic JSON tree of a large answer), one vector per input at most, all
        // of one length within MAX_EMBEDDING_DIMS: a hostile endpoint cannot grow the cache.
        #[derive(serde::Deserialize)]
        struct Answer {
            data: Vec<Item>,
        }
        #[derive(serde::Deserialize)]
        struct Item {
            index: usize,
            embedding: Vec<f32>,
        }
        let answer: Answer =
            serde_json::from_slice(&body).map_err(|_| "the answer is not an embeddings list")?;
        if answer.data.len() > inputs.len() {
            return Err("more vectors than inputs".into());
        }
        let dims = answer.data.first().map_or(0, |d| d.embedding.len());
        if dims == 0
            || dims > MAX_EMBEDDING_DIMS
            || answer.data.iter().any(|d| d.embedding.len() != dims)
        {
            return Err("vectors of no, mixed or too many dimensions".into());
        }
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
        for d in answer.data {
            let mut v = d.embedding;
            ctxguard_embed::normalize(&mut v);
            *vectors.get_mut(d.index).ok_or("index out of range")? = Some(v);
        }
        let mut vectors = vectors.into_iter();
        let query = vectors.next().flatten().ok_or("no query vector")?;
        let fresh: Vec<Option<Vec<f32>>> = cached
            .iter()
            .map(|c| {
                if c.is_none() {
                    vectors.next().flatten()
                } else {
                    None
                }
            })
            .collect();
        Ok((query, self.merge(&texts, fresh)))
    }
}

/// The query's vector, and the vectors of the `texts` not in `cached` (parallel to `texts`;
/// `None` where the cache had one). Blocking: call it off the async runtime.
fn embed_missing(
    model: &Embedder,
    query: &str,
    texts: &[String],
    cached: &[Option<Arc<Vec<f32>>>],
) -> (Vec<f32>, Vec<Option<Vec<f32>>>) {
    let tools = cached
        .iter()
        .zip(texts)
        .map(|(c, t)| c.is_none().then(|| model.embed(t)))
        .collect();
    (model.embed(query), tools)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool(name: &str, description: &str, server: Option<&str>) -> ToolSpec {
        ToolSpec {
            name: name.into(),
            description: description.into(),
            input_schema: json!({"type": "object", "properties": {}}),
            read_only: true,
            danger: "low".into(),
            requires_approval: false,
            server: server.map(str::to_string),
            title: None,
            namespace: None,
            deferred: false,
        }
    }

    /// An invoice page's tools, and two upstream servers' (one of them stuffed).
    fn page() -> Vec<ToolSpec> {
        let mut tools = vec![
            tool(
                "invoice.get",
                "Get this supplier invoice with its amount due, due date and payment status.",
                None,
            ),
            tool(
                "invoice.mark_paid",
                "Record that this supplier invoice was paid.",
                None,
            ),
            tool(
                "invoice.email_party",
                "Email the vendor of this supplier invoice, with a link to it.",
                None,
            ),
            tool(
                "invoice.history",
                "Show the change history of this supplier invoice: who changed what and when.",
                None,
            ),
            tool(
                "invoice.attachments",
                "List the files attached to this supplier invoice.",
                None,
            ),
            tool(
                "app.change_language",
                "Change the language of the app's interface.",
                None,
            ),
            tool(
                "app.out_of_office",
                "Turn your out-of-office status on or off.",
                None,
            ),
            tool(
                "chat.create_message",
                "Create a chat message.",
                Some("chat"),
            ),
            tool("drive.create_folder", "Create a folder.", Some("drive")),
        ];
        for i in 0..12 {
            tools.push(tool(
                &format!("evil.t{i}"),
                "bill bills pay paid payment invoice supplier who edited changed history PDF files",
                Some("evil"),
            ));
        }
        tools
    }

    /// The offline model, if setup installed it; tests that need it say so and pass without it
    /// (scripts/test.sh installs it, so CI runs them).
    fn model() -> Option<Ranker> {
        let dir = std::env::var_os("CTXGUARD_EMBED_MODEL_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| {
                crate::config::Config::try_parse_from(["gw", "--database-url", "postgres://x"])
                    .expect("config")
                    .embed_model_dir()
            });
        if !dir.join("model.safetensors").is_file() {
            eprintln!(
                "SKIPPED: no embedding model in {} (scripts/embed_model.sh installs it)",
                dir.display()
            );
            return None;
        }
        Some(Ranker::new(
            Embeddings::Local(Arc::new(Embedder::load(&dir).expect("model loads"))),
            8,
        ))
    }

    use clap::Parser;

    #[test]
    fn paraphrases_find_their_tool_in_the_top_five() {
        let Some(r) = model() else { return };
        let tools = page();
        for (query, want) in [
            ("who touched this bill last?", "invoice.history"),
            (
                "which documents are uploaded on this bill?",
                "invoice.attachments",
            ),
            ("switch everything to German", "app.change_language"),
            (
                "I'm on vacation from Friday, set my away message",
                "app.out_of_office",
            ),
            // Not yet: "tell the ops room we're running late" -> chat.create_message (a terse
            // upstream description under the matching cosine ranks behind the page's own tools;
            // see BENCHMARKS.md, reachability).
            ("make a directory named Q3 audits", "drive.create_folder"),
        ] {
            let got = r.rank_blocking(query, &tools, &[], 5);
            assert!(got.iter().any(|n| n == want), "{query}: {got:?}");
            assert!(got.len() <= 5);
        }
    }

    #[test]
    fn a_stuffed_upstream_description_cannot_displace_a_matching_local_tool() {
        let Some(r) = model() else { return };
        let tools = page();
        // The evil server's tools carry every word of the query; lexically they come first.
        let lexical: Vec<String> = (0..12).map(|i| format!("evil.t{i}")).collect();
        let got = r.rank_blocking("who edited this bill's history?", &tools, &lexical, 5);
        assert_eq!(got[0], "invoice.history", "{got:?}");
        assert!(
            got.iter().filter(|n| n.starts_with("evil.")).count() < 5,
            "{got:?}"
        );
    }

    #[test]
    fn only_candidates_come_back_and_an_oversize_query_is_cut() {
        let tools = page();
        let lexical = vec!["not.visible".to_string(), "invoice.get".to_string()];
        let huge = "pay this bill now ".repeat(10_000);
        let rankers: Vec<Ranker> = model()
            .into_iter()
            .chain([Ranker::new(Embeddings::None, 8)])
            .collect();
        for r in rankers {
            for q in [huge.as_str(), "", "\u{0}\u{fffd}"] {
                let got = r.rank_blocking(q, &tools, &lexical, 5);
                assert_eq!(got.len(), 5);
                assert!(
                    got.iter().all(|n| tools.iter().any(|t| &t.name == n)),
                    "{got:?}"
                );
            }
            assert!(r.rank_blocking("x", &[], &lexical, 5).is_empty());
        }
    }

    #[test]
    fn without_a_model_directory_the_lexical_order_stands() {
        let dir = std::env::temp_dir().join(format!("ctxguard-no-model-{}", std::process::id()));
        let r = Ranker::from_model_dir(&dir, 8);
        assert!(!r.is_semantic());
        let tools = page();
        let lexical = vec!["invoice.history".to_string(), "invoice.get".to_string()];
        let got = r.rank_blocking("who touched this bill last?", &tools, &lexical, 3);
        assert_eq!(got[..2], ["invoice.history", "invoice.get"]);
    }

    #[test]
    fn ranks_lexically_while_the_model_loads() {
        let (release, wait) = std::sync::mpsc::channel::<()>();
        let model = model().map(|r| r.embeddings.into_inner().expect("loaded"));
        let semantic = model.is_some();
        let r = Ranker::load_in_background(8, move || {
            wait.recv().ok();
            model.unwrap_or(Embeddings::None)
        });
        assert!(!r.is_ready() && !r.is_semantic());
        let tools = page();
        let lexical = vec!["invoice.get".to_string(), "invoice.history".to_string()];
        let got = r.rank_blocking("who touched this bill last?", &tools, &lexical, 3);
        assert_eq!(got[..2], ["invoice.get", "invoice.history"], "{got:?}");
        release.send(()).unwrap();
        assert!(r.wait_ready(Duration::from_secs(60)));
        assert_eq!(r.is_semantic(), semantic);
    }

    #[test]
    fn from_config_loads_in_the_background_once_per_directory() {
        // A directory of its own (the model, if installed, through a link), so this process has
        // not loaded it yet.
        let installed =
            crate::config::Config::try_parse_from(["gw", "--database-url", "postgres://x"])
                .expect("config")
                .embed_model_dir();
        let dir = std::env::temp_dir().join(format!("ctxguard-embed-bg-{}", std::process::id()));
        let _ = std::fs::remove_file(&dir);
        let linked = installed.join("model.safetensors").is_file()
            && std::os::unix::fs::symlink(&installed, &dir).is_ok();
        let config = crate::config::Config::try_parse_from([
            "gw",
            "--database-url",
            "postgres://x",
            "--embed-model-dir",
            dir.to_str().expect("UTF-8 path"),
        ])
        .expect("config");
        // (That it ranks lexically until the model is in is the test above, with the load held.)
        let r = from_config(&config);
        assert!(r.wait_ready(Duration::from_secs(60)));
        assert_eq!(r.is_semantic(), linked);
        // Loaded once per directory and process.
        assert!(Arc::ptr_eq(&r, &from_config(&config)));
        let _ = std::fs::remove_file(&dir);
    }

    /// A mock OpenAI-compatible `/v1/embeddings`: a text's vector has a 1 in the place of each
    /// topic word it names (bill, chat, folder), so cosines are known.
    async fn mock_embeddings(
        fail: bool,
    ) -> (String, Arc<Mutex<Vec<Value>>>, tokio::task::JoinHandle<()>) {
        use axum::{http::HeaderMap, routing::post, Json, Router};
        let seen: Arc<Mutex<Vec<Value>>> = Arc::default();
        let log = seen.clone();
        let app = Router::new().route(
            "/v1/embeddings",
            post(move |headers: HeaderMap, Json(body): Json<Value>| {
                let log = log.clone();
                async move {
                    let auth = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .unwrap_or_default()
                        .to_string();
                    log.lock()
                        .unwrap()
                        .push(json!({"auth": auth, "body": body.clone()}));
                    if fail {
                        return (
                            axum::http::StatusCode::INTERNAL_SERVER_ERROR,
                            Json(json!({})),
                        );
                    }
                    let inputs = body["input"].as_array().cloned().unwrap_or_default();
                    let data: Vec<Value> = inputs
                        .iter()
                        .enumerate()
                        .map(|(i, t)| {
                            let t = t.as_str().unwrap_or_default().to_lowercase();
                            let v: Vec<f32> = ["bill", "chat", "folder"]
                                .iter()
                                .map(|w| if t.contains(w) { 1.0 } else { 0.0 })
                                .chain([0.1])
                                .collect();
                            // In reverse order: the index, not the position, says which input.
                            json!({"object": "embedding", "index": i, "embedding": v})
                        })
                        .rev()
                        .collect();
                    (
                        axum::http::StatusCode::OK,
                        Json(json!({"object": "list", "data": data})),
                    )
                }
            }),
        );
        let (base, server) = serve(app).await;
        (base, seen, server)
    }

    /// Serve `app` on a loopback port: its `/v1` base URL, and the task to abort.
    async fn serve(app: axum::Router) -> (String, tokio::task::JoinHandle<()>) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}/v1", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        (base, server)
    }

    fn provider(base_url: String) -> Ranker {
        Ranker::new(
            Embeddings::Provider {
                http: reqwest::Client::new(),
                base_url,
                api_key: Some("sk-test".into()),
                model: "embed-small".into(),
            },
            8,
        )
    }

    /// An endpoint answering every request with `answer`.
    async fn answering(answer: Value) -> (String, tokio::task::JoinHandle<()>) {
        let app = axum::Router::new().route(
            "/v1/embeddings",
            axum::routing::post(move || {
                let answer = answer.clone();
                async move { axum::Json(answer) }
            }),
        );
        serve(app).await
    }

    #[tokio::test]
    async fn a_hostile_embeddings_endpoint_cannot_grow_the_cache() {
        let tools = vec![tool("invoice.get", "Get this bill.", None)];
        let item = |i: usize, dims: usize| json!({"index": i, "embedding": vec![0.5_f32; dims]});
        for (answer, what) in [
            (
                json!({"data": [item(0, MAX_EMBEDDING_DIMS + 1), item(1, MAX_EMBEDDING_DIMS + 1)]}),
                "too many dimensions",
            ),
            (
                json!({"data": [item(0, 3), item(1, 4)]}),
                "mixed dimensions",
            ),
            (
                json!({"data": [item(0, 3), item(1, 3), item(1, 3)]}),
                "more vectors than inputs",
            ),
            (json!({"data": [item(0, 0), item(1, 0)]}), "no dimensions"),
            (json!({"data": "nope"}), "not a list"),
        ] {
            let (base, server) = answering(answer).await;
            let r = provider(base);
            assert!(
                r.provider_vectors("pay the bill", &tools).await.is_err(),
                "{what}"
            );
            assert!(r.cache.lock().unwrap().is_empty(), "{what}: nothing cached");
            server.abort();
        }
    }

    #[tokio::test]
    async fn an_openai_compatible_endpoint_ranks_and_tool_vectors_are_asked_once() {
        let (base, seen, server) = mock_embeddings(false).await;
        let r = provider(base);
        let tools = vec![
            tool("drive.create_folder", "Create a folder.", Some("drive")),
            tool("invoice.get", "Get this bill.", None),
            tool(
                "chat.create_message",
                "Create a chat message.",
                Some("chat"),
            ),
        ];
        let got = r.rank_for_query("pay the bill", &tools, &[], 3).await;
        assert_eq!(got[0], "invoice.get", "{got:?}");
        let got = r.rank_for_query("write in the chat", &tools, &[], 1).await;
        assert_eq!(got, ["chat.create_message"]);
        let seen = seen.lock().unwrap().clone();
        assert_eq!(seen.len(), 2);
        assert_eq!(seen[0]["auth"], "Bearer sk-test");
        assert_eq!(seen[0]["body"]["model"], "embed-small");
        // The query first, then each tool's definition; the second call only the query.
        let first: Vec<&str> = seen[0]["body"]["input"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(first.len(), 4);
        assert_eq!(first[0], "pay the bill");
        assert_eq!(first[1], definition_text(&tools[0]));
        assert_eq!(seen[1]["body"]["input"], json!(["write in the chat"]));
        server.abort();
    }

    #[tokio::test]
    async fn a_search_finds_only_tools_near_the_request_or_matching_its_words() {
        let (base, _seen, server) = mock_embeddings(false).await;
        let r = provider(base);
        let tools = vec![
            tool("drive.create_folder", "Create a folder.", Some("drive")),
            tool("invoice.get", "Get this bill.", None),
            tool(
                "chat.create_message",
                "Create a chat message.",
                Some("chat"),
            ),
        ];
        // Ranking orders every candidate; a search leaves out the far ones.
        assert_eq!(
            r.rank_for_query("pay the bill", &tools, &[], 3).await.len(),
            3
        );
        assert_eq!(
            r.find_for_query("pay the bill", &tools, &[], 3).await,
            ["invoice.get"]
        );
        // A lexical match is found however far its meaning.
        let lexical = vec!["drive.create_folder".to_string()];
        assert_eq!(
            r.find_for_query("pay the bill", &tools, &lexical, 3).await,
            ["invoice.get", "drive.create_folder"]
        );
        assert!(r
            .find_for_query("the weather", &tools, &[], 3)
            .await
            .is_empty());
        server.abort();
    }

    #[tokio::test]
    async fn a_failing_endpoint_leaves_the_lexical_order() {
        let (base, seen, server) = mock_embeddings(true).await;
        let r = provider(base);
        let tools = page();
        let lexical = vec!["invoice.history".to_string(), "invoice.get".to_string()];
        let got = r
            .rank_for_query("who touched this bill last?", &tools, &lexical, 2)
            .await;
        assert_eq!(got, ["invoice.history", "invoice.get"]);
        assert_eq!(seen.lock().unwrap().len(), 1);
        server.abort();
    }

    #[test]
    fn tool_vectors_are_computed_once_per_definition() {
        let Some(r) = model() else { return };
        let tools = page();
        r.rank_blocking("pay", &tools, &[], 5);
        let n = r.cache.lock().unwrap().len();
        assert_eq!(n, tools.len());
        r.rank_blocking("another query", &tools, &[], 5);
        assert_eq!(r.cache.lock().unwrap().len(), n);
    }

    #[test]
    fn definition_text_has_name_words_description_and_arguments() {
        let mut t = tool("invoice.mark_paid", "Record a payment.", None);
        t.input_schema = json!({"type": "object", "properties": {"paid_on": {"type": "string", "description": "Date paid"}}});
        assert_eq!(
            definition_text(&t),
            "invoice mark paid. Record a payment. paid on: Date paid"
        );
    }
}
