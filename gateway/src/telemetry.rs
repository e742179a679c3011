//! **Floor** (uses `llm` for a model call's outcome): every room above may open spans.
//!
//! OpenTelemetry traces: the W3C trace context of a request, the spans the gateway opens, and the
//! OTLP exporter.
//!
//! **Off by default.** Without `OTEL_EXPORTER_OTLP_ENDPOINT` (or `_TRACES_ENDPOINT`) no exporter,
//! no SDK and no span exists: every span here is created under the target [`TARGET`], which no
//! logging filter enables (`main.rs` turns it off for the log), so a disabled span costs one cached
//! check. With an endpoint, spans go to a batch processor on its own thread with a bounded queue
//! (full: the span is dropped, a request never waits) that posts OTLP HTTP/protobuf; the gateway
//! flushes it when it exits ([`Telemetry::shutdown`]).
//!
//! **Trace ids join the audit.** An incoming `traceparent` (HTTP header, or MCP `_meta`) is
//! continued; a malformed or oversized one is ignored (a new trace). The trace id of the request
//! (32 lowercase hex digits) is the `trace_id` the database stores on its audit rows ([`begin`]).
//!
//! **What spans carry**: names and ids the gateway already logs (operation, tool and model names,
//! Gate B's decision and code, JSON-RPC ids, a hash of the MCP session id), never a token, page,
//! question, argument value, tool result or answer. Attribute names follow the OpenTelemetry GenAI
//! and MCP semantic conventions (`gen_ai.*`, `mcp.*`, `jsonrpc.request.id`, `error.type`).

use std::time::Duration;

use axum::http::HeaderMap;
use opentelemetry::trace::{
    SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState, TracerProvider as _,
};
use opentelemetry::KeyValue;
use opentelemetry_otlp::{Protocol, WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, Sampler, SdkTracerProvider,
};
use opentelemetry_sdk::Resource;
use sha2::{Digest, Sha256};
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::filter::{EnvFilter, Targets};
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::Layer;

/// The `tracing` target of every span meant for OpenTelemetry (and of nothing else).
pub const TARGET: &str = "ctxguard_otel";
/// A `traceparent` longer than this is ignored before it is parsed (version 00 is 55 bytes;
/// later versions may append fields).
pub const MAX_TRACEPARENT_BYTES: usize = 128;
/// A `tracestate` longer than this is ignored (W3C: 32 members; 512 bytes is what every vendor
/// must be able to pass on).
pub const MAX_TRACESTATE_BYTES: usize = 512;
/// The service name when `OTEL_SERVICE_NAME` is not set.
pub const SERVICE_NAME: &str = "ctxguard-gateway";

/// A span for OpenTelemetry: `tracing`'s span macro under [`TARGET`] at `INFO`.
#[macro_export]
macro_rules! otel_span {
    (parent: $parent:expr, $name:expr, $($fields:tt)*) => {
        ::tracing::info_span!(target: $crate::telemetry::TARGET, parent: $parent, $name, $($fields)*)
    };
    ($name:expr, $($fields:tt)*) => {
        ::tracing::info_span!(target: $crate::telemetry::TARGET, $name, $($fields)*)
    };
}

/// A remote parent: a valid W3C `traceparent`, and the `tracestate` that came with it.
#[derive(Debug, Clone, PartialEq)]
pub struct Remote {
    pub trace_id: TraceId,
    pub span_id: SpanId,
    pub flags: TraceFlags,
    pub state: TraceState,
}

impl Remote {
    /// A `traceparent` (and optional `tracestate`) as W3C Trace Context defines them, or `None`
    /// for anything else: wrong size, version `ff`, upper-case or non-hex digits, an all-zero id.
    /// A `tracestate` that is too long or malformed is dropped (the parent still counts).
    pub fn parse(traceparent: &str, tracestate: Option<&str>) -> Option<Remote> {
        let tp = traceparent.trim_matches([' ', '\t']);
        if tp.len() > MAX_TRACEPARENT_BYTES || tp.len() < 55 || !tp.is_ascii() {
            return None;
        }
        let lower_hex = |s: &str| {
            s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        };
        let (version, rest) = tp.split_at(2);
        if !lower_hex(version) || version == "ff" {
            return None;
        }
        // Version 00 is exactly 55 bytes; a later version may append `-…` fields after the flags.
        if (version == "00" && tp.len() != 55) || (tp.len() > 55 && tp.as_bytes()[55] != b'-') {
            return None;
        }
        let b = rest.as_bytes();
        if b[0] != b'-' || b[33] != b'-' || b[50] != b'-' {
            return None;
        }
        let (trace, span, flags) = (&rest[1..33], &rest[34..50], &rest[51..53]);
        if !lower_hex(trace) || !lower_hex(span) || !lower_hex(flags) {
            return None;
        }
        let trace_id = TraceId::from_hex(trace).ok()?;
        let span_id = SpanId::from_hex(span).ok()?;
        if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        let state = tracestate
            .filter(|s| s.len() <= MAX_TRACESTATE_BYTES)
            .and_then(|s| s.parse::<TraceState>().ok())
            .unwrap_or_default();
        Some(Remote {
            trace_id,
            span_id,
            // Only the sampled bit is defined; the others are not passed on.
            flags: TraceFlags::new(flags) & TraceFlags::SAMPLED,
            state,
        })
    }

    /// From the `traceparent` and `tracestate` headers (each must appear once).
    pub fn from_headers(headers: &HeaderMap) -> Option<Remote> {
        let one = |name: &str| {
            let mut values = headers.get_all(name).iter();
            match (values.next(), values.next()) {
                (Some(v), None) => v.to_str().ok(),
                _ => None,
            }
        };
        Remote::parse(one("traceparent")?, one("tracestate"))
    }

    /// From an MCP request's `_meta` (`traceparent`, `tracestate`: MCP 2026-07-28, SEP-414).
    pub fn from_meta(meta: &serde_json::Map<String, serde_json::Value>) -> Option<Remote> {
        let tp = meta.get("traceparent")?.as_str()?;
        Remote::parse(tp, meta.get("tracestate").and_then(|v| v.as_str()))
    }

    fn context(&self) -> opentelemetry::Context {
        opentelemetry::Context::new().with_remote_span_context(SpanContext::new(
            self.trace_id,
            self.span_id,
            self.flags,
            true,
            self.state.clone(),
        ))
    }
}

/// A trace id as the audit stores it: 32 lowercase hex digits.
pub fn hex_trace_id(id: TraceId) -> String {
    format!("{id:032x}")
}

/// Make `span` continue `remote` (if any) and return the request's trace id for the audit: the
/// span's own (which is `remote`'s when there is one) when spans are exported, else `remote`'s,
/// else a new random one. Call right after creating the span, before entering it.
pub fn begin(span: &Span, remote: Option<&Remote>) -> String {
    if let Some(r) = remote {
        // Fails only when no exporter is set up (or the span is off): the id below still is `r`'s.
        let _ = span.set_parent(r.context());
    }
    let own = span.context().span().span_context().trace_id();
    if own != TraceId::INVALID {
        return hex_trace_id(own);
    }
    match remote {
        Some(r) => hex_trace_id(r.trace_id),
        None => uuid::Uuid::new_v4().simple().to_string(),
    }
}

/// The `traceparent` to send upstream from inside `span`: its own context when spans are exported;
/// otherwise the request's trace id (when it is one: 32 hex digits) with a fresh span id, unsampled
/// (nothing here records it). `None` when there is nothing to continue.
pub fn traceparent(span: &Span, trace_id: &str) -> Option<String> {
    let cx = span.context();
    let sc = cx.span().span_context().clone();
    if sc.is_valid() {
        return Some(format!(
            "00-{}-{}-{:02x}",
            hex_trace_id(sc.trace_id()),
            sc.span_id(),
            sc.trace_flags().to_u8()
        ));
    }
    let id = TraceId::from_hex(trace_id)
        .ok()
        .filter(|_| trace_id.len() == 32)?;
    if id == TraceId::INVALID {
        return None;
    }
    let span_id = uuid::Uuid::new_v4().as_u64_pair().0 | 1;
    Some(format!("00-{trace_id}-{span_id:016x}-00"))
}

/// Gate A: the transaction that opens a turn (context, generation, the page's tools, history).
pub fn gate_a_span() -> Span {
    otel_span!(
        "gate_a",
        otel.name = "gate_a open_turn",
        otel.kind = "client",
        "db.system.name" = "postgresql",
        "db.operation.name" = "ctxguard.open_turn",
    )
}

/// Gate B: the transaction of one call (`ctxguard.call_tool`: the decision and, for a tool the
/// database runs, its handler).
pub fn gate_b_span() -> Span {
    otel_span!(
        "gate_b",
        otel.name = "gate_b call_tool",
        otel.kind = "client",
        "db.system.name" = "postgresql",
        "db.operation.name" = "ctxguard.call_tool",
    )
}

/// One model call (GenAI `chat`).
pub fn model_span(provider: &str, model: &str) -> Span {
    otel_span!(
        "chat",
        otel.name = format!("chat {}", model),
        otel.kind = "client",
        otel.status_code = tracing::field::Empty,
        "gen_ai.operation.name" = "chat",
        "gen_ai.provider.name" = provider_name(provider),
        "gen_ai.request.model" = model,
        "ctxguard.tool_calls" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    )
}

/// Record a model call's outcome: how many tool calls it asked for, or its error's kind.
pub fn record_model(
    span: &Span,
    completion: &Result<crate::llm::Completion, crate::llm::LlmError>,
) {
    match completion {
        Ok(c) => {
            span.record("ctxguard.tool_calls", count(c.tool_calls.len()));
        }
        Err(crate::llm::LlmError::Timeout) => record_error(span, "timeout"),
        Err(_) => record_error(span, "provider_error"),
    }
}

/// One tool call of the model (GenAI `execute_tool`): Gate B's decision and code are recorded
/// when it is judged ([`record_decision`]); never its arguments or result.
pub fn tool_span(name: &str, call_id: &str) -> Span {
    let name = clip(name, 256);
    otel_span!(
        "execute_tool",
        otel.name = format!("execute_tool {name}"),
        otel.status_code = tracing::field::Empty,
        "gen_ai.operation.name" = "execute_tool",
        "gen_ai.tool.name" = name,
        "gen_ai.tool.call.id" = clip(call_id, 256),
        "gen_ai.tool.type" = "function",
        "ctxguard.decision" = tracing::field::Empty,
        "ctxguard.code" = tracing::field::Empty,
        "error.type" = tracing::field::Empty,
    )
}

/// The longest prefix of `s` of at most `max` bytes on a character boundary.
pub fn clip(s: &str, max: usize) -> &str {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// `gen_ai.provider.name` for a provider of `CTXGUARD_PROVIDER`.
pub fn provider_name(provider: &str) -> &'static str {
    match provider {
        "openai" => "openai",
        "anthropic" => "anthropic",
        _ => "ctxguard.offline",
    }
}

/// An MCP session id as spans carry it: a hash (the id itself lets its holder use the session).
pub fn session_hash(id: &str) -> String {
    let digest = Sha256::digest(format!("ctxguard mcp session\0{id}").as_bytes());
    digest[..16].iter().map(|b| format!("{b:02x}")).collect()
}

/// Record Gate B's outcome on a tool span: `ctxguard.decision`, `ctxguard.code`, and `error.type`
/// for a call that failed (not for a refusal, which is the policy working).
pub fn record_decision(span: &Span, decision: &str, code: Option<&str>) {
    span.record("ctxguard.decision", decision);
    if let Some(c) = code {
        span.record("ctxguard.code", c);
    }
    if decision == "error" {
        span.record("error.type", code.unwrap_or("TOOL_ERROR"));
        span.record("otel.status_code", "error");
    }
}

/// A count as an attribute: an `i64` (tracing-opentelemetry records `u64`/`usize` as text).
pub fn count(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Record a failure on `span`: `error.type` (a stable code, never a message) and an error status.
pub fn record_error(span: &Span, error_type: &str) {
    span.record("error.type", error_type);
    span.record("otel.status_code", "error");
}

/// The exporter's settings, read from the standard `OTEL_*` variables.
#[derive(Clone, PartialEq)]
pub struct Settings {
    /// The full URL spans are posted to (`…/v1/traces`).
    pub endpoint: String,
    pub headers: Vec<(String, String)>,
    pub timeout: Duration,
    pub service_name: String,
    pub resource: Vec<(String, String)>,
    pub sampler: SamplerSetting,
    pub max_queue_size: usize,
    pub max_export_batch_size: usize,
    pub scheduled_delay: Duration,
}

impl std::fmt::Debug for Settings {
    // Headers may carry the collector's credentials: never printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("endpoint", &self.endpoint)
            .field("headers", &self.headers.len())
            .field("service_name", &self.service_name)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SamplerSetting {
    AlwaysOn,
    AlwaysOff,
    Ratio(f64),
    ParentBasedOn,
    ParentBasedOff,
    ParentBasedRatio(f64),
}

impl SamplerSetting {
    fn sampler(self) -> Sampler {
        match self {
            SamplerSetting::AlwaysOn => Sampler::AlwaysOn,
            SamplerSetting::AlwaysOff => Sampler::AlwaysOff,
            SamplerSetting::Ratio(r) => Sampler::TraceIdRatioBased(r),
            SamplerSetting::ParentBasedOn => Sampler::ParentBased(Box::new(Sampler::AlwaysOn)),
            SamplerSetting::ParentBasedOff => Sampler::ParentBased(Box::new(Sampler::AlwaysOff)),
            SamplerSetting::ParentBasedRatio(r) => {
                Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(r)))
            }
        }
    }
}

/// `k=v,k2=v2` (W3C baggage-like lists of `OTEL_EXPORTER_OTLP_HEADERS` and
/// `OTEL_RESOURCE_ATTRIBUTES`), values percent-decoded. Errors name the variable, never a value.
fn pairs(var: &str, text: &str) -> Result<Vec<(String, String)>, String> {
    text.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p
                .split_once('=')
                .ok_or_else(|| format!("{var}: expected key=value pairs separated by commas"))?;
            let v = url::form_urlencoded::parse(
                format!("v={}", v.trim().replace('+', "%2B")).as_bytes(),
            )
            .next()
            .map(|(_, v)| v.into_owned())
            .unwrap_or_default();
            Ok((k.trim().to_string(), v))
        })
        .collect()
}

impl Settings {
    /// Where spans go, for the log: scheme, host and port (no user, path or query).
    pub fn collector(&self) -> String {
        url::Url::parse(&self.endpoint).map_or_else(
            |_| "?".into(),
            |u| {
                let port = u.port_or_known_default().unwrap_or_default();
                format!(
                    "{}://{}:{port}",
                    u.scheme(),
                    u.host_str().unwrap_or_default()
                )
            },
        )
    }

    /// The settings from `get` (the environment), or `None` when no trace exporter is configured:
    /// no endpoint, `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none`. A value the gateway
    /// cannot honour (another protocol or exporter, a bad number) is an error, before anything
    /// starts.
    pub fn from_env(get: impl Fn(&str) -> Option<String>) -> Result<Option<Settings>, String> {
        let get = |k: &str| {
            get(k)
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
        };
        if get("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        match get("OTEL_TRACES_EXPORTER").as_deref() {
            None | Some("otlp") => {}
            Some("none") => return Ok(None),
            Some(_) => return Err("OTEL_TRACES_EXPORTER: only otlp or none is supported".into()),
        }
        let endpoint = match (
            get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"),
            get("OTEL_EXPORTER_OTLP_ENDPOINT"),
        ) {
            (Some(e), _) => e,
            (None, Some(base)) => format!("{}/v1/traces", base.trim_end_matches('/')),
            (None, None) => return Ok(None),
        };
        match url::Url::parse(&endpoint) {
            Ok(u) if matches!(u.scheme(), "http" | "https") && u.host().is_some() => {}
            _ => {
                return Err("OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT: expected an http(s) URL".into())
            }
        }
        let protocol = get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .or_else(|| get("OTEL_EXPORTER_OTLP_PROTOCOL"));
        if protocol.as_deref().is_some_and(|p| p != "http/protobuf") {
            return Err(
                "OTEL_EXPORTER_OTLP_(TRACES_)PROTOCOL: only http/protobuf is supported".into(),
            );
        }
        let number = |k: &str, default: u64| -> Result<u64, String> {
            get(k).map_or(Ok(default), |v| {
                v.parse::<u64>()
                    .map_err(|_| format!("{k}: expected a non-negative integer"))
            })
        };
        let timeout_ms = match get("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT") {
            Some(_) => number("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", 10_000)?,
            None => number("OTEL_EXPORTER_OTLP_TIMEOUT", 10_000)?,
        };
        let headers = match get("OTEL_EXPORTER_OTLP_TRACES_HEADERS")
            .or_else(|| get("OTEL_EXPORTER_OTLP_HEADERS"))
        {
            Some(h) => pairs("OTEL_EXPORTER_OTLP_HEADERS", &h)?,
            None => Vec::new(),
        };
        let resource = match get("OTEL_RESOURCE_ATTRIBUTES") {
            Some(r) => pairs("OTEL_RESOURCE_ATTRIBUTES", &r)?,
            None => Vec::new(),
        };
        let service_name = get("OTEL_SERVICE_NAME")
            .or_else(|| {
                resource
                    .iter()
                    .find(|(k, _)| k == "service.name")
                    .map(|(_, v)| v.clone())
            })
            .unwrap_or_else(|| SERVICE_NAME.to_string());
        let ratio = || -> Result<f64, String> {
            match get("OTEL_TRACES_SAMPLER_ARG") {
                None => Ok(1.0),
                Some(a) => a
                    .parse::<f64>()
                    .ok()
                    .filter(|r| (0.0..=1.0).contains(r))
                    .ok_or_else(|| "OTEL_TRACES_SAMPLER_ARG: expected a number from 0 to 1".into()),
            }
        };
        let sampler = match get("OTEL_TRACES_SAMPLER").as_deref() {
            None | Some("parentbased_always_on") => SamplerSetting::ParentBasedOn,
            Some("always_on") => SamplerSetting::AlwaysOn,
            Some("always_off") => SamplerSetting::AlwaysOff,
            Some("traceidratio") => SamplerSetting::Ratio(ratio()?),
            Some("parentbased_always_off") => SamplerSetting::ParentBasedOff,
            Some("parentbased_traceidratio") => SamplerSetting::ParentBasedRatio(ratio()?),
            Some(_) => return Err("OTEL_TRACES_SAMPLER: not a supported sampler".into()),
        };
        let max_queue_size = number("OTEL_BSP_MAX_QUEUE_SIZE", 2048)?.clamp(1, 65_536) as usize;
        let max_export_batch_size =
            (number("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)?.max(1) as usize).min(max_queue_size);
        Ok(Some(Settings {
            endpoint,
            headers,
            timeout: Duration::from_millis(timeout_ms),
            service_name,
            resource,
            sampler,
            max_queue_size,
            max_export_batch_size,
            scheduled_delay: Duration::from_millis(number("OTEL_BSP_SCHEDULE_DELAY", 5000)?),
        }))
    }
}

/// The installed tracing: what to flush on exit.
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are exported.
    pub fn exporting(&self) -> bool {
        self.provider.is_some()
    }

    /// Export what is queued and stop the exporter (blocking: call outside the runtime).
    pub fn shutdown(self) {
        if let Some(p) = self.provider {
            if let Err(e) = p.shutdown() {
                eprintln!("ctxguard-gateway: the trace exporter did not shut down cleanly: {e}");
            }
        }
    }
}

/// The log filter: `RUST_LOG`, else `info`; the spans of [`TARGET`] never go to the log.
fn log_filter() -> EnvFilter {
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,tower_http=info".into());
    match format!("{TARGET}=off").parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    }
}

/// Install the global subscriber: the log, and with `settings` the OpenTelemetry layer exporting
/// to the OTLP endpoint. Call once, after `secrets::seal` (the exporter starts a thread) and
/// outside the runtime (its HTTP client is a blocking one).
pub fn init(settings: Option<&Settings>) -> Result<Telemetry, String> {
    let log = tracing_subscriber::fmt::layer().with_filter(log_filter());
    let Some(s) = settings else {
        tracing_subscriber::registry().with(log).init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(Protocol::HttpBinary)
        .with_endpoint(&s.endpoint)
        .with_timeout(s.timeout)
        .with_headers(s.headers.iter().cloned().collect())
        .build()
        .map_err(|e| format!("cannot set up the OTLP trace exporter: {e}"))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(s.max_queue_size)
        .with_max_export_batch_size(s.max_export_batch_size)
        .with_scheduled_delay(s.scheduled_delay)
        .build();
    let resource = Resource::builder_empty()
        .with_attributes(
            s.resource
                .iter()
                .filter(|(k, _)| k != "service.name")
                .map(|(k, v)| KeyValue::new(k.clone(), v.clone())),
        )
        .with_attributes([
            KeyValue::new("service.name", s.service_name.clone()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(
            BatchSpanProcessor::builder(exporter)
                .with_batch_config(batch)
                .build(),
        )
        .with_sampler(s.sampler.sampler())
        .with_resource(resource)
        .build();
    let layer = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("ctxguard-gateway"))
        .with_location(false)
        .with_target(false)
        .with_level(false)
        .with_threads(false)
        .with_tracked_inactivity(false)
        // Not made the OpenTelemetry context of the thread at each poll of an instrumented future
        // (nothing here reads `opentelemetry::Context::current()`: parents come from the span
        // tree, upstream `traceparent`s from `span.context()`): a turn's futures are polled
        // hundreds of times, and each activation cloned and attached the span's context.
        .with_context_activation(false)
        // INFO, the level of every span here: a TRACE filter raised the subscriber's level hint,
        // and every `log` record of the dependencies (tokio-postgres logs each message at
        // trace) was then turned into an event to be judged and dropped.
        .with_filter(Targets::new().with_target(TARGET, tracing::Level::INFO));
    tracing_subscriber::registry().with(log).with(layer).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const TP: &str = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

    #[test]
    fn traceparents_are_parsed_strictly() {
        let r = Remote::parse(TP, Some("congo=t61rcWkgMzE")).unwrap();
        assert_eq!(hex_trace_id(r.trace_id), "0af7651916cd43dd8448eb211c80319c");
        assert_eq!(format!("{}", r.span_id), "b7ad6b7169203331");
        assert!(r.flags.is_sampled());
        assert_eq!(r.state.get("congo"), Some("t61rcWkgMzE"));
        // A later version may append fields; version 00 may not.
        assert!(Remote::parse(&format!("01{}-extra", &TP[2..]), None).is_some());
        for bad in [
            "",
            "garbage",
            &TP[..54],
            &format!("{TP}-extra"),
            &format!("{TP}0"),
            &TP.to_uppercase(),
            &TP.replace("0af7651916cd43dd8448eb211c80319c", &"0".repeat(32)),
            &TP.replace("b7ad6b7169203331", &"0".repeat(16)),
            &format!("ff{}", &TP[2..]),
            &TP.replacen('-', "_", 1),
            &TP.replace("-01", "-g1"),
            &format!("01{}-{}", &TP[2..], "x".repeat(200)),
            "00-0af7651916cd43dd8448eb211c80319ç-b7ad6b7169203331-01",
        ] {
            assert_eq!(Remote::parse(bad, None), None, "{bad}");
        }
        // Unknown flag bits are not passed on; a bad or oversized tracestate is dropped alone.
        let r = Remote::parse(&TP.replace("-01", "-ff"), Some(&"a=b,".repeat(200))).unwrap();
        assert_eq!(r.flags, TraceFlags::SAMPLED);
        assert_eq!(r.state, TraceState::default());
        let r = Remote::parse(TP, Some("not a tracestate")).unwrap();
        assert_eq!(r.state, TraceState::default());
    }

    #[test]
    fn headers_and_meta_give_the_same_parent_and_duplicates_none() {
        let mut h = HeaderMap::new();
        h.insert("traceparent", TP.parse().unwrap());
        let from_header = Remote::from_headers(&h).unwrap();
        let meta = serde_json::json!({"traceparent": TP});
        assert_eq!(
            Remote::from_meta(meta.as_object().unwrap()),
            Some(from_header)
        );
        h.append("traceparent", TP.parse().unwrap());
        assert_eq!(Remote::from_headers(&h), None);
        let meta = serde_json::json!({"traceparent": 7});
        assert_eq!(Remote::from_meta(meta.as_object().unwrap()), None);
    }

    #[test]
    fn without_an_exporter_the_trace_id_is_the_remote_one_or_new() {
        let span = Span::none();
        let r = Remote::parse(TP, None).unwrap();
        assert_eq!(begin(&span, Some(&r)), "0af7651916cd43dd8448eb211c80319c");
        let fresh = begin(&span, None);
        assert!(fresh.len() == 32 && fresh.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(fresh, begin(&span, None));
        // Upstream: the request's trace id, a new span id, unsampled; none for other ids.
        let tp = traceparent(&span, &fresh).unwrap();
        let sent = Remote::parse(&tp, None).unwrap();
        assert_eq!(hex_trace_id(sent.trace_id), fresh);
        assert!(!sent.flags.is_sampled());
        assert_eq!(traceparent(&span, "caller-request-id"), None);
        assert_eq!(traceparent(&span, &"0".repeat(32)), None);
    }

    #[test]
    fn settings_come_from_the_standard_variables_and_are_off_without_an_endpoint() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| v.to_string())
            }
        };
        assert_eq!(Settings::from_env(env(&[])), Ok(None));
        let on = &[("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/")];
        let s = Settings::from_env(env(on)).unwrap().unwrap();
        assert_eq!(s.endpoint, "http://127.0.0.1:4318/v1/traces");
        assert_eq!(s.service_name, SERVICE_NAME);
        assert_eq!(s.sampler, SamplerSetting::ParentBasedOn);
        let s = Settings::from_env(env(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://base:4318"),
            (
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
                "https://collector.example/custom",
            ),
            (
                "OTEL_EXPORTER_OTLP_HEADERS",
                "authorization=Bearer%20secret-value, x-tenant = a",
            ),
            ("OTEL_SERVICE_NAME", "gw-1"),
            ("OTEL_TRACES_SAMPLER", "parentbased_traceidratio"),
            ("OTEL_TRACES_SAMPLER_ARG", "0.25"),
            ("OTEL_BSP_MAX_QUEUE_SIZE", "100"),
        ]))
        .unwrap()
        .unwrap();
        assert_eq!(s.endpoint, "https://collector.example/custom");
        assert_eq!(
            s.headers,
            vec![
                (
                    "authorization".to_string(),
                    "Bearer secret-value".to_string()
                ),
                ("x-tenant".to_string(), "a".to_string())
            ]
        );
        assert_eq!(
            (s.service_name.as_str(), s.sampler),
            ("gw-1", SamplerSetting::ParentBasedRatio(0.25))
        );
        assert_eq!((s.max_queue_size, s.max_export_batch_size), (100, 100));
        assert!(!format!("{s:?}").contains("secret-value"));
        for off in [
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_SDK_DISABLED", "true"),
            ][..],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_TRACES_EXPORTER", "none"),
            ],
        ] {
            assert_eq!(Settings::from_env(env(off)), Ok(None));
        }
        for bad in [
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
            ][..],
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", "not a url")],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_TRACES_EXPORTER", "zipkin"),
            ],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_BSP_MAX_QUEUE_SIZE", "-1"),
            ],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_TRACES_SAMPLER", "traceidratio"),
                ("OTEL_TRACES_SAMPLER_ARG", "2"),
            ],
            &[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://x:4318"),
                ("OTEL_EXPORTER_OTLP_HEADERS", "secret-without-equals"),
            ],
        ] {
            let e = Settings::from_env(env(bad)).unwrap_err();
            assert!(
                !e.contains("secret-without-equals") && !e.contains("zipkin"),
                "{e}"
            );
        }
    }

    #[test]
    fn session_ids_are_hashed() {
        let h = session_hash("9f8e7d6c-session-id");
        assert_eq!(h.len(), 32);
        assert!(!h.contains("9f8e7d6c"));
        assert_eq!(h, session_hash("9f8e7d6c-session-id"));
        assert_ne!(h, session_hash("another"));
    }
}
