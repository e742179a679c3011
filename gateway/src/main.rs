//! `ctxguard-gateway`: config → tracing → pool → serve (with graceful shutdown).

use std::sync::Arc;

use ctxguard_gateway::config::Config;
use ctxguard_gateway::{serve, AppState};

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tower_http=info".into()),
        )
        .init();
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ctxguard-gateway: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    let listen = config.listen;
    let provider = config.provider;
    let state = match AppState::from_config(config) {
        Ok(s) => Arc::new(s),
        Err(e) => {
            eprintln!("ctxguard-gateway: {e}");
            std::process::exit(2);
        }
    };
    let listener = match tokio::net::TcpListener::bind(listen).await {
        Ok(l) => l,
        Err(e) => {
            eprintln!("ctxguard-gateway: cannot listen on {listen}: {e}");
            std::process::exit(2);
        }
    };
    tracing::info!(%listen, ?provider, "ctxguard gateway listening");
    if state.config.mcp_discover {
        // In the background: a slow or dead upstream server never delays serving.
        let state = state.clone();
        tokio::spawn(async move {
            let up = state.upstreams.discover(&state.db).await;
            tracing::info!(servers = ?up, "upstream MCP discovery done");
        });
    }
    if let Err(e) = serve(listener, state).await {
        eprintln!("ctxguard-gateway: {e}");
        std::process::exit(1);
    }
}
