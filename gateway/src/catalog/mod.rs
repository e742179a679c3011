//! **Room `catalog/`**: what a tool is ([`ToolSpec`], wire names), the tool budget
//! (`compact.rs`: the compact list and `find_tools`) and tool search (`disclosure/`). It may use
//! `config` only; `llm`, `db`, `tools`, `chat` and `mcp` build on it.

pub mod compact;
pub mod disclosure;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// A tool as Gate A showed it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub read_only: bool,
    pub danger: String,
    pub requires_approval: bool,
    /// The upstream MCP server of an external tool (`None` for database tools).
    #[serde(skip)]
    pub server: Option<String>,
    /// The catalog's title (`register_tool`'s `title`), if any.
    #[serde(skip)]
    pub title: Option<String>,
    /// The tool's namespace (`visible_tools`' column: its name's first segment, or its upstream
    /// server); `None` for the gateway's own `find_tools`.
    #[serde(skip)]
    pub namespace: Option<String>,
    /// Beyond the tool budget and not offered directly (`compact.rs`): a provider with native tool
    /// search may send it deferred (loaded on demand); any other provider is not given it.
    #[serde(skip)]
    pub deferred: bool,
}

/// Tool names as providers accept them (`^[a-zA-Z0-9_-]{1,64}$`): dots become `__`. The mapping back
/// prefers the offered tools; any other name is decoded the same way and the database judges it
/// (an invisible tool is audited as TOOL_NOT_VISIBLE, an unknown one as TOOL_NOT_FOUND).
pub fn wire_name(name: &str) -> String {
    name.replace('.', "__")
}

pub fn tool_name_from_wire(wire: &str, tools: &[ToolSpec]) -> String {
    tools
        .iter()
        .find(|t| wire_name(&t.name) == wire)
        .map_or_else(|| wire.replace("__", "."), |t| t.name.clone())
}
