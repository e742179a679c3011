//! Embeddings for tool search: the offline model (`ctxguard-embed`, from `CTXGUARD_EMBED_MODEL_DIR`)
//! by default, or an OpenAI-compatible `/v1/embeddings` endpoint, or none (lexical order only).
//! A tool's vector is computed once per definition (keyed by a hash of the text embedded) and kept
//! in a bounded cache; a query's vector once per call.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use ctxguard_embed::{cosine, cut, Embedder, MAX_TEXT_BYTES};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use super::fusion::{fuse, Fused};
use crate::llm::ToolSpec;

/// Longest query embedded, in bytes (the model then cuts at its token limit).
pub const MAX_QUERY_BYTES: usize = 2048;
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
    embeddings: Embeddings,
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
            let r = Arc::new(Ranker::from_model_dir(&dir, PER_SERVER));
            loaded.push((dir, r.clone()));
            r
        }
    }
}

impl Ranker {
    pub fn new(embeddings: Embeddings, per_server: usize) -> Ranker {
        Ranker {
            embeddings,
            per_server: per_server.max(1),
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The offline model in `dir`, or lexical only (with the reason logged) when it cannot be
    /// loaded. Reads about 100 MB: call once at startup.
    pub fn from_model_dir(dir: &Path, per_server: usize) -> Ranker {
        match Embedder::load(dir) {
            Ok(e) => {
                tracing::info!(dir = %dir.display(), dimensions = e.dimensions(),
                    "tool search: semantic matching with the offline embedding model");
                Ranker::new(Embeddings::Local(Arc::new(e)), per_server)
            }
            Err(err) => {
                tracing::warn!(dir = %dir.display(), error = %err,
                    "tool search: no embedding model, lexical matching only (scripts/setup.sh installs the model)");
                Ranker::new(Embeddings::None, per_server)
            }
        }
    }

    /// Whether vectors are used at all.
    pub fn is_semantic(&self) -> bool {
        !matches!(self.embeddings, Embeddings::None)
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
        let vectors = match &self.embeddings {
            Embeddings::None => None,
            Embeddings::Local(model) => {
                let model = model.clone();
                let query = cut(query, MAX_QUERY_BYTES).to_string();
                let texts: Vec<String> = candidates.iter().map(definition_text).collect();
                let cached = self.cached(&texts);
                let computed = tokio::task::spawn_blocking(move || {
                    let q = model.embed(&query);
                    let tools: Vec<Option<Vec<f32>>> = cached
                        .iter()
                        .zip(&texts)
                        .map(|(c, t)| c.is_none().then(|| model.embed(t)))
                        .collect();
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
        };
        self.place(candidates, vectors.as_ref(), lexical_order, top_k)
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
        let vectors = match &self.embeddings {
            Embeddings::Local(model) => {
                let texts: Vec<String> = candidates.iter().map(definition_text).collect();
                let fresh = self
                    .cached(&texts)
                    .iter()
                    .zip(&texts)
                    .map(|(c, t)| c.is_none().then(|| model.embed(t)))
                    .collect();
                Some((
                    model.embed(cut(query, MAX_QUERY_BYTES)),
                    self.merge(&texts, fresh),
                ))
            }
            _ => None,
        };
        self.place(candidates, vectors.as_ref(), lexical_order, top_k)
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
        let model = match &self.embeddings {
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
        } = &self.embeddings
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
        let body: Value = resp.json().await.map_err(|e| e.to_string())?;
        let data = body
            .get("data")
            .and_then(Value::as_array)
            .ok_or("no data in the answer")?;
        let mut vectors: Vec<Option<Vec<f32>>> = vec![None; inputs.len()];
        for d in data {
            let i = d.get("index").and_then(Value::as_u64).ok_or("no index")? as usize;
            let v: Vec<f32> = d
                .get("embedding")
                .and_then(Value::as_array)
                .ok_or("no embedding")?
                .iter()
                .map(|x| x.as_f64().unwrap_or(0.0) as f32)
                .collect();
            let mut v = v;
            ctxguard_embed::normalize(&mut v);
            *vectors.get_mut(i).ok_or("index out of range")? = Some(v);
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
