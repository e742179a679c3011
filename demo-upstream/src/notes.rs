//! The MCP side: two read-only tools that answer for the user the request's access token was
//! issued to ([`crate::TokenUser`], set by the bearer check in front of `/mcp`), never for
//! anything in the arguments (they take none).
//!
//! Tool names and descriptions are what the gateway's offline model matches words against:
//! "what are my notes?" reaches `my_notes` (catalogued as `notes.my_notes`).

use std::sync::Arc;

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeResult, ListToolsResult, PaginatedRequestParams, ServerCapabilities, Tool,
    ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData as McpError, RoleServer, ServerHandler};
use serde_json::{json, Value};

use crate::auth::USERS;

/// Each account's own private notes (fixed demo data).
pub fn notes_of(user: &str) -> &'static [&'static str] {
    match user {
        "alice" => &[
            "Ask Contoso Paper for a corrected May invoice",
            "Lunch with Maria on Thursday: the Q3 vendor review",
            "Renew the scanner licence before the end of the month",
        ],
        "maria" => &[
            "Approve the Acme payment batch on Friday",
            "Four-eyes rule: check the large invoices twice",
        ],
        "bob" => &["Read the onboarding guide for viewers"],
        "carol" => &[
            "Globex offsite agenda: budget, hiring, the new warehouse",
            "Chase Initech about the missing delivery",
        ],
        _ => &[],
    }
}

fn schema() -> Arc<serde_json::Map<String, Value>> {
    match json!({"type": "object", "properties": {}, "additionalProperties": false}) {
        Value::Object(m) => Arc::new(m),
        _ => Arc::default(),
    }
}

/// The tools, as `tools/list` gives them (and `--print-tools` prints them).
pub fn tools() -> Vec<Tool> {
    let read_only = ToolAnnotations::new()
        .read_only(true)
        .destructive(false)
        .idempotent(true)
        .open_world(false);
    vec![
        Tool::new(
            "my_notes",
            "Your own private notes in Demo Notes: the notes of the account you connected.",
            schema(),
        )
        .annotate(read_only.clone()),
        Tool::new(
            "whoami",
            "Who am I on Demo Notes: the account this connection is signed in as.",
            schema(),
        )
        .annotate(read_only),
    ]
}

#[derive(Clone)]
pub struct Notes;

/// The user whose access token this request carries.
fn token_user(ctx: &RequestContext<RoleServer>) -> Option<String> {
    ctx.extensions
        .get::<axum::http::request::Parts>()
        .and_then(|p| p.extensions.get::<crate::TokenUser>())
        .map(|u| u.0.clone())
}

/// A tool's answer for `user`.
pub fn answer(tool: &str, user: &str) -> Option<CallToolResult> {
    let name = USERS
        .iter()
        .find(|(id, _)| *id == user)
        .map_or(user, |(_, n)| *n);
    match tool {
        "whoami" => {
            let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
                "You are signed in to Demo Notes as {user} ({name})."
            ))]);
            r.structured_content = Some(json!({"user": user, "name": name}));
            Some(r)
        }
        "my_notes" => {
            let notes = notes_of(user);
            let list: Vec<String> = notes
                .iter()
                .enumerate()
                .map(|(i, n)| format!("{}. {n}", i + 1))
                .collect();
            let mut r = CallToolResult::success(vec![ContentBlock::text(format!(
                "Notes of {user} ({} in Demo Notes): {}",
                notes.len(),
                list.join(" ")
            ))]);
            r.structured_content =
                Some(json!({"user": user, "count": notes.len(), "notes": notes}));
            Some(r)
        }
        _ => None,
    }
}

impl ServerHandler for Notes {
    fn get_info(&self) -> InitializeResult {
        InitializeResult::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("demo-notes", env!("CARGO_PKG_VERSION")))
            .with_instructions("Demo Notes: the signed-in user's own notes.")
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, McpError> {
        Ok(ListToolsResult::with_all_items(tools()))
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, McpError> {
        let Some(user) = token_user(&context) else {
            return Err(McpError::invalid_request("no access token", None));
        };
        match answer(&request.name, &user) {
            Some(r) => {
                crate::log(format!("mcp: {} for {user}", request.name));
                Ok(r.into())
            }
            None => Err(McpError::invalid_params("no such tool", None)),
        }
    }
}
