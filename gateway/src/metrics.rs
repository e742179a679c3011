//! **Floor** (uses no other room).
//!
//! Prometheus metrics: requests, tool decisions by code, LLM latency, pool usage.

use prometheus::{
    Encoder, HistogramOpts, HistogramVec, IntCounterVec, IntGauge, Opts, Registry, TextEncoder,
};

pub struct Metrics {
    registry: Registry,
    pub requests: IntCounterVec,
    pub tool_decisions: IntCounterVec,
    pub llm_seconds: HistogramVec,
    pub pool_size: IntGauge,
    pub pool_available: IntGauge,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let requests = IntCounterVec::new(
            Opts::new("ctxguard_http_requests_total", "HTTP requests"),
            &["route", "status"],
        )
        .expect("metric");
        let tool_decisions = IntCounterVec::new(
            Opts::new("ctxguard_tool_decisions_total", "Gate B decisions by code"),
            &["code"],
        )
        .expect("metric");
        let llm_seconds = HistogramVec::new(
            HistogramOpts::new("ctxguard_llm_request_seconds", "Model request latency").buckets(
                vec![
                    0.001, 0.005, 0.02, 0.1, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
                ],
            ),
            &["provider", "outcome"],
        )
        .expect("metric");
        let pool_size =
            IntGauge::new("ctxguard_db_pool_size", "Database connections open").expect("metric");
        let pool_available =
            IntGauge::new("ctxguard_db_pool_available", "Idle database connections")
                .expect("metric");
        for c in [
            Box::new(requests.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(tool_decisions.clone()),
            Box::new(llm_seconds.clone()),
            Box::new(pool_size.clone()),
            Box::new(pool_available.clone()),
        ] {
            registry.register(c).expect("register metric");
        }
        Metrics {
            registry,
            requests,
            tool_decisions,
            llm_seconds,
            pool_size,
            pool_available,
        }
    }

    /// Register a collector kept by another room (e.g. `limits.rs`'s connection counters).
    pub fn register(&self, collector: Box<dyn prometheus::core::Collector>) {
        self.registry.register(collector).expect("register metric");
    }

    pub fn render(&self) -> String {
        let mut buf = Vec::new();
        TextEncoder::new()
            .encode(&self.registry.gather(), &mut buf)
            .expect("encode metrics");
        String::from_utf8(buf).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}
