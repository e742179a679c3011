//! `ctxguard-gateway`: config → secrets sealed → tracing (and the OTLP exporter, when configured) →
//! pool → serve (with graceful shutdown) → traces flushed.
//! `ctxguard-gateway jwks-sync --url … --out …`: fetch, check and write an identity provider's JWKS.

use std::sync::Arc;

use ctxguard_gateway::config::Config;
use ctxguard_gateway::http::{serve, AppState};
use ctxguard_gateway::{secrets, telemetry};

fn main() {
    // `ctxguard-gateway jwks-sync …`: keep ctxguard.jwks_file current (gateway/src/jwks_sync.rs).
    if std::env::args().nth(1).as_deref() == Some("jwks-sync") {
        let args = std::env::args().skip(1);
        std::process::exit(ctxguard_gateway::jwks_sync::main(args));
    }
    let config = match Config::load() {
        Ok(c) => c,
        Err(e) => {
            eprintln!("ctxguard-gateway: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    // The standard OTEL_* variables (read before they are sealed away: the headers may be secret).
    let otel = match telemetry::Settings::from_env(|k| std::env::var(k).ok()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ctxguard-gateway: invalid configuration: {e}");
            std::process::exit(2);
        }
    };
    // Before any thread or child exists: secrets out of the environment, the process non-dumpable.
    let sealed = secrets::seal(&config.secret_values());
    // The log, and the trace exporter's thread (after the seal; outside the runtime).
    let telemetry = match telemetry::init(otel.as_ref()) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("ctxguard-gateway: {e}");
            std::process::exit(2);
        }
    };
    if let Some(s) = &otel {
        tracing::info!(collector = %s.collector(), service = %s.service_name, "exporting traces (OTLP)");
    }
    tracing::info!(
        moved = ?sealed.moved,
        "variables moved out of the environment (kept in memory only)"
    );
    if let Some(e) = &sealed.scrub_failed {
        tracing::warn!(error = %e, "could not overwrite the original environment and argument blocks");
    }
    if let Some(e) = &sealed.dumpable_failed {
        tracing::warn!(error = %e, "could not make the process non-dumpable");
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("ctxguard-gateway: cannot start the runtime: {e}");
            std::process::exit(1);
        }
    };
    runtime.block_on(run(config));
    drop(runtime);
    // The spans still queued are exported before the process ends.
    telemetry.shutdown();
}

async fn run(config: Config) {
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
    if state.core.config.mcp_discover {
        // In the background: a slow or dead upstream server never delays serving.
        let state = state.clone();
        tokio::spawn(async move {
            let up = state.core.upstreams.discover(&state.core.db).await;
            tracing::info!(servers = ?up, "upstream MCP discovery done");
        });
    }
    let served = serve(listener, state.clone()).await;
    // Stdio servers end with the gateway.
    state.core.upstreams.shutdown().await;
    if let Err(e) = served {
        eprintln!("ctxguard-gateway: {e}");
        std::process::exit(1);
    }
}
