//! **Floor** (uses `services`, `upstream`, `pages`, `db`, `catalog`, `telemetry`, `error`): shared
//! by `chat`, `mcp` and `http`; it may not touch them.
//!
//! Tool calls as the gateway runs them: Gate B in the database, and for upstream MCP tools the
//! forward between `call_tool` (which answers `authorized`) and `complete_call`. Each database
//! step runs under the page view's live generation (`pages::View::run`).

use serde_json::{json, Value};
use tracing::Instrument;
use uuid::Uuid;

use crate::catalog::compact;
use crate::catalog::ToolSpec;
use crate::db::{Scope, ToolName};
use crate::error::ApiError;
use crate::pages::View;
use crate::services::Services;

/// Gate B for one call; upstream tools are forwarded and completed.
pub async fn call(
    state: &Services,
    view: &mut View,
    name: ToolName<'_>,
    args: &Value,
) -> Result<Value, ApiError> {
    let envelope = view
        .run(&state.db, |s| async move {
            state.db.call_tool(&s, &name, args).await
        })
        .instrument(crate::telemetry::gate_b_span())
        .await?;
    settle(state, view, envelope).await
}

/// Run a pending approval once; an approved upstream call is forwarded and completed.
pub async fn approve(state: &Services, scope: &Scope, call_id: Uuid) -> Result<Value, ApiError> {
    let envelope = state.db.approve(scope, call_id).await?;
    settle(state, &mut View::without(scope.clone()), envelope).await
}

async fn settle(state: &Services, view: &mut View, envelope: Value) -> Result<Value, ApiError> {
    if envelope["status"] != "authorized" {
        return Ok(envelope);
    }
    let call_id = envelope["call_id"]
        .as_str()
        .and_then(|c| Uuid::parse_str(c).ok())
        .ok_or_else(|| ApiError::Internal("authorized call without call_id".into()))?;
    let server = envelope["server"].as_str().unwrap_or_default();
    let tool = envelope["tool"].as_str().unwrap_or_default();
    // The registration as Gate B authorized the call: its credential mode now (an envelope
    // without one names none, and fails closed below).
    let mode = envelope["credential_mode"].as_str().unwrap_or_default();
    let cfg = state
        .upstreams
        .config_for_mode(&state.db, server, mode)
        .await;
    // Connect first if needed (a call need not follow a listing: /internal/mcp/execute, or a
    // connection dropped after a failure); a server in its back-off stays unavailable. Not for a
    // call that will not go out.
    if cfg.is_some() {
        state
            .upstreams
            .ensure(&state.db, &[server.to_string()])
            .await;
    }
    // The credential the verified context chose (issue 33): static, the tenant's secret, the
    // user's own connection, or an exchanged token. Without one the call is completed as failed
    // (audited) and answered with why.
    let checked = match cfg {
        Some(cfg) => {
            crate::upstream::credentials::for_call(&state.credential_deps(), view, &cfg, call_id)
                .await
                .map(|auth| (cfg, auth))
        }
        None => Err(crate::upstream::credentials::CredError::Unavailable),
    };
    let (cfg, auth) = match checked {
        Ok(checked) => checked,
        Err(e) => {
            let failed =
                json!({"content": [{"type": "text", "text": e.to_string()}], "isError": true});
            let failed = &failed;
            view.run(&state.db, |s| async move {
                state.db.complete_call(&s, call_id, failed, true).await
            })
            .await?;
            return Ok(crate::upstream::credentials::refusal(&e, call_id, server));
        }
    };
    // Forwarded under the registration just checked against Gate B's authorization.
    let (result, is_error) = match state
        .upstreams
        .forward_as(
            &cfg,
            tool,
            envelope["args"].clone(),
            &auth,
            &view.scope.trace_id,
        )
        .await
    {
        Ok(result) => {
            let failed = result["isError"] == true;
            (result, failed)
        }
        Err(e) => (
            json!({"content": [{"type": "text", "text": e.to_string()}], "isError": true}),
            true,
        ),
    };
    let result = &result;
    view.run(&state.db, |s| async move {
        state.db.complete_call(&s, call_id, result, is_error).await
    })
    .await
}

/// A `find_tools` search over what the database read for it ([`crate::db::Db::search_candidates`]):
/// the page's visible tools narrowed to the asked namespace, ordered by the tool search ranker
/// ([`compact::found`]), without the tools of servers that cannot be reached now, at most
/// [`compact::FIND_TOP_K`].
pub async fn find(
    state: &Services,
    args: &compact::FindArgs,
    read: crate::db::SearchCandidates,
) -> Vec<ToolSpec> {
    let k = usize::try_from(compact::FIND_TOP_K).unwrap_or(5);
    let candidates = compact::candidates(read.visible, &read.lexical, args);
    // Twice as many as returned, so that a server that cannot be reached leaves room.
    let ranked = compact::found(
        &state.tool_search,
        &args.query,
        candidates,
        &read.lexical,
        2 * k,
    )
    .await;
    let mut found = reachable(state, ranked).await;
    found.truncate(k);
    found
}

/// Drop upstream tools whose server is not reachable now (with a warning, once per failure).
pub async fn reachable(state: &Services, tools: Vec<ToolSpec>) -> Vec<ToolSpec> {
    let mut servers: Vec<String> = tools.iter().filter_map(|t| t.server.clone()).collect();
    if servers.is_empty() {
        return tools;
    }
    servers.sort();
    servers.dedup();
    let up = state.upstreams.ensure(&state.db, &servers).await;
    tools
        .into_iter()
        .filter(|t| t.server.as_ref().is_none_or(|s| up.contains(s)))
        .collect()
}
