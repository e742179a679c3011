//! ctxguard gateway (rooms: see below).

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
pub mod telemetry;
pub mod tools;
pub mod upstream;
