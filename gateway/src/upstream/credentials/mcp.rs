//! MCP clients and a missing connection (issue 33): what a `tools/call` of a `user_oauth` tool
//! answers when the user has not connected yet, in the shape the client's protocol revision knows.
//!
//! - 2026-07-28 (stateless): an `input_required` result (SEP-2322, multi round-trip requests) whose
//!   one input request is a URL-mode elicitation of the connect URL; the client's retry is the call
//!   again. A retry still without the connection answers the tool error (with the URL), so a client
//!   that cannot connect never loops.
//! - 2025-11-25 sessions whose client declared `elicitation.url`: an `elicitation/create` request
//!   (`mode: "url"`, the connect URL, an elicitation id); whatever the user answers, the call then
//!   answers the `CONNECTION_REQUIRED` tool error naming the elicitation, and the client retries
//!   once the user has connected.
//! - Any other client: the `CONNECTION_REQUIRED` tool error with the connect URL in its structured
//!   content and `_meta`.
//!
//! The connect URL is minted for the verified caller of this request (`connect_hint`): single use,
//! bound to the user and the server, so a client only ever gets its own user's URL. It reaches the
//! user's client, never the model of a chat turn.

use std::time::Duration;

use rmcp::model::{
    CallToolResponse, CallToolResult, ClientResult, ElicitRequest, ElicitRequestParams,
    InputRequest, InputRequests, InputRequiredResult, ProtocolVersion, ServerRequest,
};
use rmcp::service::RequestContext;
use rmcp::RoleServer;
use serde_json::{json, Value};
use uuid::Uuid;

/// How long a session's client has to answer the elicitation (the user reading it).
const ELICITATION_TIMEOUT: Duration = Duration::from_secs(300);

/// The `_meta` key the connect URL is under in a tool error.
pub const META_KEY: &str = "io.ctxguard/connectionRequired";

/// The input request's key in an `input_required` result.
fn input_key(server: &str) -> String {
    format!("connect:{server}")
}

fn message(server: &str) -> String {
    format!("Connect your {server} account to let the assistant use it, then retry.")
}

/// The tool error `refused` (a `CONNECTION_REQUIRED` refusal naming the server) with `fields`
/// added to its structured `error` and, under [`META_KEY`], to its `_meta`.
fn with_fields(mut refused: CallToolResult, fields: Value) -> CallToolResult {
    if let (Some(Value::Object(error)), Value::Object(f)) = (
        refused
            .structured_content
            .as_mut()
            .and_then(|s| s.get_mut("error")),
        &fields,
    ) {
        error.extend(f.clone());
    }
    let mut meta = refused.meta.take().unwrap_or_default();
    meta.0.insert(META_KEY.into(), fields);
    refused.meta = Some(meta);
    refused
}

/// The answer to a call refused with `CONNECTION_REQUIRED`: `hint` is `connect_hint`'s
/// `{server, connectUrl}`, `refused` the tool error, `retried` whether the request is a client's
/// retry of an `input_required` result (it carries input responses).
pub async fn missing_connection(
    context: &RequestContext<RoleServer>,
    hint: Value,
    refused: CallToolResult,
    retried: bool,
) -> CallToolResponse {
    let server = hint["server"].as_str().unwrap_or_default().to_string();
    let Some(url) = hint["connectUrl"].as_str().map(str::to_string) else {
        // Nothing to connect through (the server's authorization server is unreachable): the
        // refusal alone.
        return refused.into();
    };
    let stateless = context
        .protocol_version()
        .is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
    if stateless {
        if retried {
            return with_fields(refused, json!({"server": server, "connectUrl": url})).into();
        }
        let elicit = ElicitRequest::new(ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message: message(&server),
            url,
            // 2026-07-28 dropped the elicitation id (its input requests are keyed instead).
            elicitation_id: String::new(),
        });
        let mut requests = InputRequests::new();
        requests.insert(input_key(&server), InputRequest::Elicitation(elicit));
        let mut result = InputRequiredResult::from_input_requests(requests);
        let mut meta = rmcp::model::MetaObject::default();
        meta.0.insert(META_KEY.into(), json!({"server": server}));
        result.meta = Some(meta);
        return result.into();
    }
    let url_capable = context
        .peer
        .peer_info()
        .and_then(|i| i.capabilities.elicitation.as_ref().map(|e| e.url.is_some()))
        .unwrap_or(false);
    if !url_capable {
        return with_fields(refused, json!({"server": server, "connectUrl": url})).into();
    }
    let id = Uuid::new_v4().to_string();
    let request = ServerRequest::ElicitRequest(ElicitRequest::new(
        ElicitRequestParams::UrlElicitationParams {
            meta: None,
            message: message(&server),
            url: url.clone(),
            elicitation_id: id.clone(),
        },
    ));
    let answer =
        tokio::time::timeout(ELICITATION_TIMEOUT, context.peer.send_request(request)).await;
    let action = match answer {
        Ok(Ok(ClientResult::ElicitResult(r))) => {
            serde_json::to_value(r.action).unwrap_or(Value::Null)
        }
        // The client could not be asked after all: the URL in the refusal instead.
        _ => return with_fields(refused, json!({"server": server, "connectUrl": url})).into(),
    };
    with_fields(
        refused,
        json!({"server": server, "elicitationId": id, "action": action}),
    )
    .into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rmcp::model::ContentBlock;

    #[test]
    fn the_url_goes_into_the_structured_error_and_meta() {
        let mut r = CallToolResult::error(vec![ContentBlock::text("CONNECTION_REQUIRED: x")]);
        r.structured_content = Some(json!({"error": {"code": "CONNECTION_REQUIRED"}}));
        let r = with_fields(r, json!({"server": "drive", "connectUrl": "https://as/x"}));
        let v = serde_json::to_value(&r).unwrap();
        assert_eq!(
            v["structuredContent"]["error"]["connectUrl"],
            "https://as/x"
        );
        assert_eq!(
            v["structuredContent"]["error"]["code"],
            "CONNECTION_REQUIRED"
        );
        assert_eq!(v["_meta"][META_KEY]["server"], "drive");
    }
}
