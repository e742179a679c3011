//! **Floor** (uses `upstream`, `llm`, `db`, `catalog`, `config`, `metrics`): the services chat, tool calls and MCP share: the database, the model, the settings and
//! metrics, the upstream registry and credentials, tool search, the public URL. `http` builds them
//! once ((`http::AppState::from_config`)) and hands them down; nothing here knows HTTP
//! routes, the model loop or MCP.

use std::sync::Arc;

use crate::catalog::disclosure::Ranker;
use crate::config::public_url::PublicUrl;
use crate::config::Config;
use crate::db::Db;
use crate::llm::ChatModel;
use crate::metrics::Metrics;
use crate::upstream::credentials::{self, Credentials};
use crate::upstream::Upstreams;

pub struct Services {
    pub db: Db,
    pub model: Arc<dyn ChatModel>,
    pub config: Arc<Config>,
    pub metrics: Arc<Metrics>,
    /// Connections to upstream MCP servers.
    pub upstreams: Arc<Upstreams>,
    /// Where clients reach the gateway (`CTXGUARD_PUBLIC_URL`): what it advertises.
    pub public: PublicUrl,
    /// Tool search: the visible tools ranked for a request (`catalog/disclosure/`).
    pub tool_search: Arc<Ranker>,
    /// Upstream credentials: the sealing keys, connect requests, exchanged tokens
    /// (`upstream/credentials/`).
    pub credentials: Arc<Credentials>,
}

impl Services {
    /// What the credential modes use of these (`upstream::credentials`), lent for one call.
    pub fn credential_deps(&self) -> credentials::Deps<'_> {
        credentials::Deps {
            db: &self.db,
            upstreams: &self.upstreams,
            credentials: &self.credentials,
            public: &self.public,
        }
    }
}
