//! ctxguard gateway: authenticates the caller (by handing the bearer token to the database), sets
//! the context for each short transaction, runs the LLM loop and reports. Every decision stays in
//! PostgreSQL.
//!
//! # Rooms and floors
//!
//! Each folder is a room, each top-level file a floor; a room uses only the floors below it
//! (`gateway/tests/layout.rs` holds the table and checks it), so there is no circle between rooms:
//! a piece two rooms need goes down a floor.
//!
//! | floor | room | owns |
//! |---|---|---|
//! | top | [`http`] | where a request enters: the router, the `/v1` handlers, [`http::AppState`] (built from the config), `/mcp`'s host and origin guard and body cap, demo and connection routes, [`http::serve`] |
//! | | [`mcp`] | the MCP server at `/mcp` (tools/list, tools/call, sessions, the JSON-RPC edge, page notifications), on the state `http` hands it ([`mcp::McpState`]) |
//! | | [`chat`] | the model loop of `POST /v1/chat` ([`chat::run_turn`]), answer hygiene, streaming |
//! | | [`tools`] | one tool call: Gate B in the database, then its upstream; approvals; `find_tools` |
//! | | [`services`] | what chat, tool calls and MCP share: database, model, settings, upstreams, credentials, tool search |
//! | | [`upstream`] | upstream MCP servers: connections per credential mode, stdio isolation, credentials |
//! | | [`pages`] | page views and their generations |
//! | | [`db`] | the only SQL ([`db::sql`]): fully qualified, pinned per transaction, pooler-safe |
//! | | [`telemetry`] | OpenTelemetry setup and the spans' names and attributes |
//! | | [`llm`] | model providers behind one trait |
//! | | [`catalog`] | what a tool is, the tool budget (compact lists), tool search |
//! | | [`limits`], [`auth`] | HTTP limits (timeouts, connections, streams per user); the bearer token |
//! | bottom | [`config`] | settings and the values parsed from them (public URL, OAuth metadata, hosts) |
//! | | [`error`], [`metrics`], [`secrets`], [`seal`], [`jwks_sync`], [`bounded`] | the API's errors, Prometheus metrics, process hygiene, sealed credentials, the `jwks-sync` command, bounded reads of peers' HTTP bodies |
//!
//! A request enters in `http` (`http::app`); `POST /v1/chat` goes to `chat`, `/mcp` to `mcp`; both
//! call tools through `tools` and read the database through `db`. `main.rs` only wires config,
//! tracing, state and [`http::serve`].

pub mod auth;
pub mod bounded;
pub mod catalog;
pub mod chat;
pub mod config;
pub mod db;
pub mod error;
pub mod http;
pub mod jwks_sync;
pub mod limits;
pub mod llm;
pub mod mcp;
pub mod metrics;
pub mod pages;
pub mod seal;
pub mod secrets;
pub mod services;
pub mod telemetry;
pub mod tools;
pub mod upstream;
