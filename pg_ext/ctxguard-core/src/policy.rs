//! Tool policies: parsing with contradiction checks, and evaluation against a context.
//!
//! A tool without a policy does not exist for Gate A or Gate B. Evaluation is total and ordered:
//! the first failing rule is the reason reported by `ctxguard.explain_tools()`.

use serde_json::{Map, Value};

use crate::names::{is_valid_label, is_valid_name};
use crate::page::PageTypeInfo;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Danger {
    Safe,
    Moderate,
    Destructive,
}

impl Danger {
    pub fn as_str(self) -> &'static str {
        match self {
            Danger::Safe => "safe",
            Danger::Moderate => "moderate",
            Danger::Destructive => "destructive",
        }
    }
    pub fn parse(s: &str) -> Option<Danger> {
        match s {
            "safe" => Some(Danger::Safe),
            "moderate" => Some(Danger::Moderate),
            "destructive" => Some(Danger::Destructive),
            _ => None,
        }
    }
}

/// A validated policy. `page_types == ["*"]` means any page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    pub page_types: Vec<String>,
    pub requires_entity: bool,
    pub entity_type: Option<String>,
    pub entity_param: Option<String>,
    pub roles: Vec<String>,
    pub required_states: Vec<String>,
    pub read_only: bool,
    pub danger: Danger,
    pub requires_approval: bool,
    pub enabled: bool,
    /// A predicate `schema.name(jsonb)` that must return true for the call to run (issue 30).
    pub when: Option<String>,
    /// A predicate `schema.name(jsonb)`: when it returns true the call needs an approval.
    pub approval_when: Option<String>,
    /// `"mode": "log_only"`: page, role and state conditions and `when` are evaluated, and a
    /// would-be denial is audited as `would_deny`, but the call runs (shadow mode).
    pub log_only: bool,
    /// Four eyes: only a user of the same tenant holding one of these roles, never the
    /// requester, may approve (or reject) a call that needs an approval. Empty: the requester
    /// approves their own call.
    pub approver_roles: Vec<String>,
    /// Quotas in time windows (`rate_limit`): every one must have room for a call to run.
    pub rate_limits: Vec<RateLimit>,
    /// `credential_mode` (issue 33): the upstream credential modes a call may go out with (one
    /// of [`CREDENTIAL_MODES`], or a list). The tool's server must be registered with one of
    /// them, or the tool is neither listed nor callable (`credential_mode_mismatch`); a local
    /// tool never is. Empty: any mode.
    pub credential_modes: Vec<String>,
}

/// How the gateway authenticates to an upstream server (`ctxguard.mcp_servers.credential_mode`).
pub const CREDENTIAL_MODES: [&str; 4] = ["static", "tenant_secret", "user_oauth", "token_exchange"];

/// `credential_mode` as a policy gives it (a mode, or a non-empty list of modes), in the order
/// given, without repeats.
pub fn parse_credential_modes(v: Option<&Value>) -> Result<Vec<String>, PolicyError> {
    let shape = "credential_mode must be static, tenant_secret, user_oauth or token_exchange, or a list of them";
    let items: Vec<&Value> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(s @ Value::String(_)) => vec![s],
        Some(Value::Array(a)) if !a.is_empty() && a.len() <= CREDENTIAL_MODES.len() => {
            a.iter().collect()
        }
        Some(_) => return err(shape),
    };
    let mut out: Vec<String> = Vec::new();
    for item in items {
        match item.as_str() {
            Some(m) if CREDENTIAL_MODES.contains(&m) => {
                if !out.iter().any(|o| o == m) {
                    out.push(m.to_string());
                }
            }
            _ => return err(shape),
        }
    }
    Ok(out)
}

pub const POLICY_KEYS: [&str; 16] = [
    "page_types",
    "requires_entity",
    "entity_type",
    "entity_param",
    "roles",
    "required_states",
    "read_only",
    "danger",
    "requires_approval",
    "enabled",
    "when",
    "approval_when",
    "mode",
    "approver_roles",
    "rate_limit",
    "credential_mode",
];

/// Whose calls a quota counts: each user's of a tenant, or the whole tenant's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaPer {
    User,
    Tenant,
}

impl QuotaPer {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaPer::User => "user",
            QuotaPer::Tenant => "tenant",
        }
    }
}

/// A quota's fixed window, aligned to the Unix epoch (UTC): a minute, an hour, a day.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaWindow {
    Minute,
    Hour,
    Day,
}

impl QuotaWindow {
    pub fn as_str(self) -> &'static str {
        match self {
            QuotaWindow::Minute => "1m",
            QuotaWindow::Hour => "1h",
            QuotaWindow::Day => "1d",
        }
    }
    pub fn parse(s: &str) -> Option<QuotaWindow> {
        match s {
            "1m" => Some(QuotaWindow::Minute),
            "1h" => Some(QuotaWindow::Hour),
            "1d" => Some(QuotaWindow::Day),
            _ => None,
        }
    }
    /// The window's length in seconds.
    pub fn secs(self) -> i64 {
        match self {
            QuotaWindow::Minute => 60,
            QuotaWindow::Hour => 3_600,
            QuotaWindow::Day => 86_400,
        }
    }
    /// Start (Unix seconds) of the window holding `unix_secs`.
    pub fn start(self, unix_secs: i64) -> i64 {
        unix_secs - unix_secs.rem_euclid(self.secs())
    }
    /// Milliseconds from `unix_ms` until the window holding it ends (at least 1).
    pub fn retry_after_ms(self, unix_ms: i64) -> i64 {
        let len = self.secs() * 1000;
        (len - unix_ms.rem_euclid(len)).max(1)
    }
}

/// One quota of a policy: at most `calls` calls per `window`, counted `per` user or tenant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateLimit {
    pub per: QuotaPer,
    pub calls: u32,
    pub window: QuotaWindow,
}

/// Most quotas one policy may carry, and most calls one quota may allow.
pub const MAX_RATE_LIMITS: usize = 4;
pub const MAX_QUOTA_CALLS: u64 = 1_000_000;

impl RateLimit {
    /// The limit as messages name it: `rate_limit: 20 calls per 1h per user`.
    pub fn describe(&self) -> String {
        format!(
            "rate_limit: {} calls per {} per {}",
            self.calls,
            self.window.as_str(),
            self.per.as_str()
        )
    }
    pub fn to_json(&self) -> Value {
        serde_json::json!({"per": self.per.as_str(), "calls": self.calls, "window": self.window.as_str()})
    }
}

/// `rate_limit` as a policy gives it (one object, or a list of at most [`MAX_RATE_LIMITS`]) or as
/// `tool_policies.rate_limits` stores it (a list). Two quotas with the same `per` and `window`
/// are refused (which would count is ambiguous).
pub fn parse_rate_limits(v: Option<&Value>) -> Result<Vec<RateLimit>, PolicyError> {
    let items: Vec<&Value> = match v {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(o @ Value::Object(_)) => vec![o],
        Some(Value::Array(a)) if a.len() <= MAX_RATE_LIMITS => a.iter().collect(),
        Some(Value::Array(_)) => {
            return err(format!("rate_limit holds at most {MAX_RATE_LIMITS} quotas"))
        }
        Some(_) => return err("rate_limit must be an object or a list of objects"),
    };
    let shape = "rate_limit must be {\"per\": \"user\" | \"tenant\", \"calls\": 1..1000000, \"window\": \"1m\" | \"1h\" | \"1d\"}";
    let mut out: Vec<RateLimit> = Vec::new();
    for item in items {
        let Value::Object(o) = item else {
            return err(shape);
        };
        if o.len() != 3 {
            return err(shape);
        }
        let per = match o.get("per").and_then(Value::as_str) {
            Some("user") => QuotaPer::User,
            Some("tenant") => QuotaPer::Tenant,
            _ => return err(shape),
        };
        let calls = match o.get("calls").and_then(Value::as_u64) {
            Some(n) if (1..=MAX_QUOTA_CALLS).contains(&n) => n as u32,
            _ => return err(shape),
        };
        let Some(window) = o
            .get("window")
            .and_then(Value::as_str)
            .and_then(QuotaWindow::parse)
        else {
            return err(shape);
        };
        if out.iter().any(|q| q.per == per && q.window == window) {
            return err("rate_limit has two quotas with the same per and window: use one");
        }
        out.push(RateLimit { per, calls, window });
    }
    Ok(out)
}

/// The stored form of a policy's quotas (`tool_policies.rate_limits`): a list, or NULL.
pub fn rate_limits_json(limits: &[RateLimit]) -> Option<Value> {
    (!limits.is_empty()).then(|| Value::Array(limits.iter().map(RateLimit::to_json).collect()))
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid tool policy: {0}")]
pub struct PolicyError(pub String);

fn err<T>(msg: impl Into<String>) -> Result<T, PolicyError> {
    Err(PolicyError(msg.into()))
}

fn bool_key(obj: &Map<String, Value>, key: &str, default: bool) -> Result<bool, PolicyError> {
    match obj.get(key) {
        None => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => err(format!("{key} must be a boolean")),
    }
}

fn labels(obj: &Map<String, Value>, key: &str) -> Result<Vec<String>, PolicyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => {
            let mut out: Vec<String> = Vec::new();
            for v in a {
                match v.as_str() {
                    Some(s) if is_valid_label(s) => {
                        if !out.iter().any(|o| o == s) {
                            out.push(s.to_string())
                        }
                    }
                    _ => return err(format!("{key} must be an array of names")),
                }
            }
            Ok(out)
        }
        Some(_) => err(format!("{key} must be an array of names")),
    }
}

fn opt_name(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, PolicyError> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if is_valid_name(s) => Ok(Some(s.clone())),
        Some(_) => err(format!("{key} must be a name")),
    }
}

/// A predicate's name as a policy gives it: `schema.name` or `schema.name(jsonb)`, both
/// lower-case unquoted identifiers; normalised to the signature `schema.name(jsonb)`.
fn predicate(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, PolicyError> {
    let ident = |s: &str| {
        !s.is_empty()
            && s.len() <= 63
            && s.starts_with(|c: char| c.is_ascii_lowercase() || c == '_')
            && s.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    };
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => {
            let name = s.strip_suffix("(jsonb)").unwrap_or(s);
            match name.split_once('.') {
                Some((schema, func)) if ident(schema) && ident(func) => {
                    Ok(Some(format!("{schema}.{func}(jsonb)")))
                }
                _ => err(format!(
                    "{key} must name a function as schema.name (a function (args jsonb) RETURNS boolean)"
                )),
            }
        }
        Some(_) => err(format!("{key} must be a function name (schema.name)")),
    }
}

/// Split a tool's `run_as` role name off its policy document: the role its handler runs as.
/// The rest is parsed by [`parse_policy`]. The name must be a plain role name (1-63 bytes).
pub fn split_run_as(v: &Value) -> Result<(Value, Option<String>), PolicyError> {
    let Value::Object(obj) = v else {
        return Ok((v.clone(), None));
    };
    let mut rest = obj.clone();
    let run_as = match rest.remove("run_as") {
        None | Some(Value::Null) => None,
        Some(Value::String(s))
            if !s.is_empty()
                && s.len() <= 63
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') =>
        {
            Some(s)
        }
        Some(_) => return err("run_as must be a role name"),
    };
    Ok((Value::Object(rest), run_as))
}

/// Parse and check a policy. `lookup` answers from `ctxguard.page_types`; `input_schema` is the tool's.
pub fn parse_policy(
    v: &Value,
    input_schema: &Value,
    lookup: impl Fn(&str) -> Option<PageTypeInfo>,
) -> Result<Policy, PolicyError> {
    let obj = match v {
        Value::Object(o) => o,
        Value::Null => return err("a tool cannot exist without a policy"),
        _ => return err("policy must be a JSON object"),
    };
    if let Some(k) = obj.keys().find(|k| !POLICY_KEYS.contains(&k.as_str())) {
        // Policy JSON is written by the DBA, so naming the key is helpful and not a leak.
        return err(format!(
            "unknown key \"{}\" (allowed: {})",
            k.escape_debug(),
            POLICY_KEYS.join(", ")
        ));
    }
    let page_types = match obj.get("page_types") {
        Some(Value::Array(a)) if !a.is_empty() => {
            let mut out: Vec<String> = Vec::new();
            for p in a {
                match p.as_str() {
                    Some("*") => out.push("*".into()),
                    Some(s) if is_valid_name(s) => {
                        if lookup(s).is_none() {
                            return err(format!("unknown page type \"{s}\""));
                        }
                        if !out.iter().any(|o| o == s) {
                            out.push(s.to_string())
                        }
                    }
                    _ => return err("page_types must hold page type names or \"*\""),
                }
            }
            if out.len() > 1 && out.iter().any(|p| p == "*") {
                return err("\"*\" cannot be combined with other page types");
            }
            out
        }
        Some(Value::String(s)) if s == "*" => vec!["*".into()],
        None => return err("page_types is required (use [\"*\"] for any page)"),
        Some(_) => return err("page_types must be a non-empty array"),
    };
    let entity_type = opt_name(obj, "entity_type")?;
    let entity_param = opt_name(obj, "entity_param")?;
    let requires_entity = bool_key(obj, "requires_entity", entity_type.is_some())?;
    let danger = match obj.get("danger") {
        None => Danger::Safe,
        Some(Value::String(s)) => match Danger::parse(s) {
            Some(d) => d,
            None => return err("danger must be one of safe, moderate, destructive"),
        },
        Some(_) => return err("danger must be one of safe, moderate, destructive"),
    };
    let read_only = bool_key(obj, "read_only", true)?;
    let log_only = match obj.get("mode") {
        None | Some(Value::Null) => false,
        Some(Value::String(m)) if m == "enforce" => false,
        Some(Value::String(m)) if m == "log_only" => true,
        Some(_) => return err("mode must be enforce or log_only"),
    };
    let policy = Policy {
        when: predicate(obj, "when")?,
        approval_when: predicate(obj, "approval_when")?,
        log_only,
        approver_roles: labels(obj, "approver_roles")?,
        rate_limits: parse_rate_limits(obj.get("rate_limit"))?,
        credential_modes: parse_credential_modes(obj.get("credential_mode"))?,
        requires_entity,
        roles: labels(obj, "roles")?,
        required_states: labels(obj, "required_states")?,
        requires_approval: bool_key(obj, "requires_approval", false)?,
        enabled: bool_key(obj, "enabled", true)?,
        read_only,
        danger,
        page_types,
        entity_type,
        entity_param,
    };
    check_contradictions(&policy, input_schema, lookup)?;
    Ok(policy)
}

fn check_contradictions(
    p: &Policy,
    input_schema: &Value,
    lookup: impl Fn(&str) -> Option<PageTypeInfo>,
) -> Result<(), PolicyError> {
    if p.entity_param.is_some() && p.entity_type.is_none() {
        return err("entity_param requires entity_type");
    }
    if p.requires_entity && p.entity_type.is_none() {
        return err("requires_entity requires entity_type");
    }
    if p.read_only && p.danger == Danger::Destructive {
        return err("a destructive tool cannot be read_only");
    }
    if !p.approver_roles.is_empty() && !p.requires_approval && p.approval_when.is_none() {
        return err("approver_roles needs requires_approval or approval_when");
    }
    if p.requires_approval && p.approval_when.is_some() {
        return err(
            "requires_approval asks every time and approval_when asks when it holds: use one",
        );
    }
    if p.requires_entity {
        let want = p.entity_type.as_deref();
        for page in p.page_types.iter().filter(|pt| *pt != "*") {
            let info = lookup(page).expect("checked above");
            if info.entity_type.as_deref() != want {
                return err(format!(
                    "page type \"{page}\" never carries entity type \"{}\" so the tool could never be visible there",
                    want.unwrap_or_default()
                ));
            }
        }
    }
    if let Some(param) = &p.entity_param {
        let prop = input_schema
            .get("properties")
            .and_then(|props| props.get(param));
        match prop {
            None => {
                return err(format!(
                    "entity_param \"{param}\" is not a property of the input schema"
                ))
            }
            Some(schema) => match schema.get("type") {
                None => {}
                Some(Value::String(t)) if t == "string" => {}
                Some(_) => {
                    return err(format!(
                        "entity_param \"{param}\" must be a string property"
                    ))
                }
            },
        }
    }
    Ok(())
}

/// The context facts a policy is evaluated against.
#[derive(Debug, Clone, Copy)]
pub struct ContextView<'a> {
    pub page_type: &'a str,
    pub entity_type: Option<&'a str>,
    pub roles: &'a [String],
    pub states: &'a [String],
}

/// Why a tool is (in)visible. Codes are stable: they are part of the SQL API.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reason {
    Visible,
    NoContext,
    MissingPolicy,
    Disabled,
    WrongPage,
    MissingRole,
    MissingState,
    EntityRequired,
    WrongEntityType,
    /// An upstream MCP tool whose server the caller may not use (per-server RBAC).
    ServerNotAllowed,
    /// An upstream MCP tool its server no longer lists (its policy is kept for its return).
    ToolAbsent,
    /// An upstream MCP tool whose name, description or schema changed since the DBA accepted it.
    DefinitionChanged,
    /// A tool whose policy requires a credential mode (`credential_mode`) its server is not
    /// registered with, or a local tool with such a policy.
    CredentialModeMismatch,
}

impl Reason {
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Visible => "visible",
            Reason::NoContext => "no_context",
            Reason::MissingPolicy => "missing_policy",
            Reason::Disabled => "disabled",
            Reason::WrongPage => "wrong_page",
            Reason::MissingRole => "missing_role",
            Reason::MissingState => "missing_state",
            Reason::EntityRequired => "entity_required",
            Reason::WrongEntityType => "wrong_entity_type",
            Reason::ServerNotAllowed => "server_not_allowed",
            Reason::ToolAbsent => "tool_absent",
            Reason::DefinitionChanged => "definition_changed",
            Reason::CredentialModeMismatch => "credential_mode_mismatch",
        }
    }
}

impl Reason {
    /// May shadow mode (`"mode": "log_only"`) let a call through despite this reason? Only the
    /// page, role and state conditions: never a missing or disabled policy, and never the
    /// entity conditions (binding the page's entity is never shadowed).
    pub fn shadowable(self) -> bool {
        matches!(
            self,
            Reason::WrongPage | Reason::MissingRole | Reason::MissingState
        )
    }
}

/// [`evaluate`], with shadow mode: for a `log_only` policy whose page, role or state conditions
/// fail, `(Visible, Some(the first failing one))` when every other condition holds. For any
/// other policy `(evaluate(..), None)`.
pub fn evaluate_shadowed(
    policy: Option<&Policy>,
    ctx: Option<&ContextView<'_>>,
) -> (Reason, Option<Reason>) {
    let strict = evaluate(policy, ctx);
    match policy {
        // Never where the entity argument would go unbound: on a page that does not carry the
        // tool's entity, a shadowed page condition would let the model name any entity.
        Some(p)
            if p.log_only
                && strict.shadowable()
                && !(strict == Reason::WrongPage
                    && p.entity_param.is_some()
                    && ctx.and_then(|c| c.entity_type) != p.entity_type.as_deref()) =>
        {
            let lenient = Policy {
                page_types: vec!["*".into()],
                roles: Vec::new(),
                required_states: Vec::new(),
                ..p.clone()
            };
            match evaluate(Some(&lenient), ctx) {
                Reason::Visible => (Reason::Visible, Some(strict)),
                other => (other, None),
            }
        }
        _ => (strict, None),
    }
}

/// Evaluate a (possibly missing) policy in a (possibly missing) context. Fails closed.
pub fn evaluate(policy: Option<&Policy>, ctx: Option<&ContextView<'_>>) -> Reason {
    let Some(ctx) = ctx else {
        return Reason::NoContext;
    };
    let Some(p) = policy else {
        return Reason::MissingPolicy;
    };
    if !p.enabled {
        return Reason::Disabled;
    }
    if !p
        .page_types
        .iter()
        .any(|pt| pt == "*" || pt == ctx.page_type)
    {
        return Reason::WrongPage;
    }
    if !p.roles.is_empty() && !p.roles.iter().any(|r| ctx.roles.contains(r)) {
        return Reason::MissingRole;
    }
    if !p.required_states.iter().all(|s| ctx.states.contains(s)) {
        return Reason::MissingState;
    }
    if p.requires_entity {
        match ctx.entity_type {
            None => return Reason::EntityRequired,
            Some(t) if Some(t) != p.entity_type.as_deref() => return Reason::WrongEntityType,
            _ => {}
        }
    }
    Reason::Visible
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn lookup(name: &str) -> Option<PageTypeInfo> {
        match name {
            "invoice_table" | "vendor_table" => Some(PageTypeInfo { entity_type: None }),
            "invoice_detail" => Some(PageTypeInfo {
                entity_type: Some("invoice".into()),
            }),
            "vendor_detail" => Some(PageTypeInfo {
                entity_type: Some("vendor".into()),
            }),
            _ => None,
        }
    }

    fn schema() -> Value {
        json!({"type": "object", "properties": {"invoice_id": {"type": "string"}, "n": {"type": "integer"}}})
    }

    fn get_policy() -> Policy {
        parse_policy(
            &json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id"}),
            &schema(),
            lookup,
        )
        .unwrap()
    }

    #[test]
    fn defaults_are_safe() {
        let p = get_policy();
        assert!(p.requires_entity && p.read_only && p.enabled && !p.requires_approval);
        assert_eq!(p.danger, Danger::Safe);
        let any = parse_policy(&json!({"page_types": "*"}), &schema(), lookup).unwrap();
        assert_eq!(any.page_types, vec!["*"]);
        assert!(!any.requires_entity);
    }

    #[test]
    fn rejects_missing_unknown_and_contradictory() {
        let cases = [
            json!(null),
            json!([]),
            json!({}),
            json!({"page_types": []}),
            json!({"page_types": ["nope"]}),
            json!({"page_types": ["*", "invoice_table"]}),
            json!({"page_types": "*", "tenant": "x"}),
            json!({"page_types": "*", "entity_param": "invoice_id"}),
            json!({"page_types": "*", "requires_entity": true}),
            json!({"page_types": "*", "danger": "destructive"}),
            json!({"page_types": "*", "danger": "nuclear", "read_only": false}),
            json!({"page_types": "*", "read_only": "yes"}),
            json!({"page_types": ["invoice_table"], "entity_type": "invoice"}),
            json!({"page_types": ["vendor_detail"], "entity_type": "invoice"}),
            json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "missing"}),
            json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "n"}),
            json!({"page_types": "*", "roles": ["a b"]}),
        ];
        for c in cases {
            assert!(parse_policy(&c, &schema(), lookup).is_err(), "{c}");
        }
    }

    #[test]
    fn evaluation_order_and_reasons() {
        let roles = vec!["ap_clerk".to_string()];
        let states = vec!["authenticated".to_string()];
        let detail = ContextView {
            page_type: "invoice_detail",
            entity_type: Some("invoice"),
            roles: &roles,
            states: &states,
        };
        let table = ContextView {
            page_type: "invoice_table",
            entity_type: None,
            roles: &roles,
            states: &states,
        };
        let p = get_policy();
        assert_eq!(evaluate(Some(&p), Some(&detail)), Reason::Visible);
        assert_eq!(evaluate(Some(&p), Some(&table)), Reason::WrongPage);
        assert_eq!(evaluate(Some(&p), None), Reason::NoContext);
        assert_eq!(evaluate(None, Some(&detail)), Reason::MissingPolicy);
        let mut q = p.clone();
        q.enabled = false;
        assert_eq!(evaluate(Some(&q), Some(&detail)), Reason::Disabled);
        let mut q = p.clone();
        q.roles = vec!["admin".into()];
        assert_eq!(evaluate(Some(&q), Some(&detail)), Reason::MissingRole);
        let mut q = p.clone();
        q.required_states = vec!["authenticated".into(), "admin-mode".into()];
        assert_eq!(evaluate(Some(&q), Some(&detail)), Reason::MissingState);
        let mut q = p.clone();
        q.page_types = vec!["*".into()];
        assert_eq!(evaluate(Some(&q), Some(&table)), Reason::EntityRequired);
        let vendor = ContextView {
            page_type: "vendor_detail",
            entity_type: Some("vendor"),
            ..detail
        };
        assert_eq!(evaluate(Some(&q), Some(&vendor)), Reason::WrongEntityType);
    }

    #[test]
    fn run_as_is_split_off_and_checked() {
        let (rest, role) =
            split_run_as(&json!({"page_types": "*", "run_as": "ctxguard_tools"})).unwrap();
        assert_eq!(role.as_deref(), Some("ctxguard_tools"));
        assert_eq!(rest, json!({"page_types": "*"}));
        assert_eq!(split_run_as(&json!({"page_types": "*"})).unwrap().1, None);
        for bad in [
            json!({"run_as": ""}),
            json!({"run_as": 7}),
            json!({"run_as": "a b"}),
            json!({"run_as": "x\"; DROP"}),
            json!({"run_as": "r".repeat(64)}),
        ] {
            assert!(split_run_as(&bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn predicates_and_mode() {
        let p = parse_policy(
            &json!({"page_types": ["invoice_detail"], "entity_type": "invoice",
                    "when": "app.refund_ok", "approval_when": "app.big_refund(jsonb)", "mode": "log_only"}),
            &schema(),
            lookup,
        )
        .unwrap();
        assert_eq!(p.when.as_deref(), Some("app.refund_ok(jsonb)"));
        assert_eq!(p.approval_when.as_deref(), Some("app.big_refund(jsonb)"));
        assert!(p.log_only);
        assert!(!get_policy().log_only && get_policy().when.is_none());
        assert!(get_policy().approver_roles.is_empty());
        let four_eyes = parse_policy(
            &json!({"page_types": "*", "requires_approval": true, "approver_roles": ["manager", "cfo", "manager"]}),
            &schema(),
            lookup,
        )
        .unwrap();
        assert_eq!(four_eyes.approver_roles, vec!["manager", "cfo"]);
        for bad in [
            json!({"page_types": "*", "when": "refund_ok"}),
            json!({"page_types": "*", "when": "App.refund_ok"}),
            json!({"page_types": "*", "when": "app.refund_ok(text)"}),
            json!({"page_types": "*", "when": "app.refund_ok; DROP TABLE x"}),
            json!({"page_types": "*", "when": "a.b.c"}),
            json!({"page_types": "*", "when": 7}),
            json!({"page_types": "*", "mode": "audit"}),
            json!({"page_types": "*", "requires_approval": true, "approval_when": "app.big"}),
            json!({"page_types": "*", "approver_roles": ["manager"]}),
            json!({"page_types": "*", "requires_approval": true, "approver_roles": "manager"}),
        ] {
            assert!(parse_policy(&bad, &schema(), lookup).is_err(), "{bad}");
        }
    }

    #[test]
    fn rate_limits_parse_and_refuse() {
        let one = parse_policy(
            &json!({"page_types": "*", "rate_limit": {"per": "user", "calls": 20, "window": "1h"}}),
            &schema(),
            lookup,
        )
        .unwrap();
        assert_eq!(
            one.rate_limits,
            vec![RateLimit {
                per: QuotaPer::User,
                calls: 20,
                window: QuotaWindow::Hour
            }]
        );
        assert_eq!(
            one.rate_limits[0].describe(),
            "rate_limit: 20 calls per 1h per user"
        );
        let list = parse_policy(
            &json!({"page_types": "*", "rate_limit": [
                {"per": "user", "calls": 1, "window": "1m"},
                {"per": "tenant", "calls": 1000000, "window": "1d"}]}),
            &schema(),
            lookup,
        )
        .unwrap();
        assert_eq!(list.rate_limits.len(), 2);
        // The stored form reads back the same.
        let stored = rate_limits_json(&list.rate_limits).unwrap();
        assert_eq!(parse_rate_limits(Some(&stored)).unwrap(), list.rate_limits);
        assert_eq!(rate_limits_json(&[]), None);
        assert!(get_policy().rate_limits.is_empty());
        let q = |v: Value| json!({"page_types": "*", "rate_limit": v});
        for bad in [
            q(json!("20/h")),
            q(json!(20)),
            q(json!({"per": "user", "calls": 0, "window": "1h"})),
            q(json!({"per": "user", "calls": 1000001, "window": "1h"})),
            q(json!({"per": "user", "calls": -1, "window": "1h"})),
            q(json!({"per": "user", "calls": 2.5, "window": "1h"})),
            q(json!({"per": "user", "calls": "20", "window": "1h"})),
            q(json!({"per": "group", "calls": 20, "window": "1h"})),
            q(json!({"per": "user", "calls": 20, "window": "2h"})),
            q(json!({"per": "user", "calls": 20})),
            q(json!({"per": "user", "calls": 20, "window": "1h", "burst": 5})),
            q(json!([{"per": "user", "calls": 20, "window": "1h"},
                     {"per": "user", "calls": 10, "window": "1h"}])),
            q(
                json!([{"per": "user", "calls": 1, "window": "1m"}, {"per": "user", "calls": 1, "window": "1h"},
                     {"per": "user", "calls": 1, "window": "1d"}, {"per": "tenant", "calls": 1, "window": "1m"},
                     {"per": "tenant", "calls": 1, "window": "1h"}]),
            ),
            q(json!(["x"])),
        ] {
            assert!(parse_policy(&bad, &schema(), lookup).is_err(), "{bad}");
        }
        assert!(parse_policy(&q(json!([])), &schema(), lookup)
            .unwrap()
            .rate_limits
            .is_empty());
    }

    #[test]
    fn quota_windows_are_aligned_to_the_epoch() {
        let t = 1_700_000_123; // 2023-11-14 22:15:23 UTC
        assert_eq!(QuotaWindow::Minute.start(t), 1_700_000_100);
        assert_eq!(QuotaWindow::Hour.start(t), 1_699_999_200);
        assert_eq!(QuotaWindow::Day.start(t), 1_699_920_000);
        assert_eq!(QuotaWindow::Minute.retry_after_ms(t * 1000 + 500), 36_500);
        assert_eq!(
            QuotaWindow::Minute.retry_after_ms(1_700_000_160_000),
            60_000
        );
        assert_eq!(QuotaWindow::Day.start(-1), -86_400);
    }

    #[test]
    fn shadow_mode_lets_only_page_role_and_state_through() {
        let ctx = |page, entity, roles: &'static [String]| ContextView {
            page_type: page,
            entity_type: entity,
            roles,
            states: &[],
        };
        let shadow = parse_policy(
            &json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "roles": ["manager"],
                    "mode": "log_only"}),
            &schema(),
            lookup,
        )
        .unwrap();
        let enforce = Policy {
            log_only: false,
            ..shadow.clone()
        };
        let none: &'static [String] = &[];
        let detail = ctx("invoice_detail", Some("invoice"), none);
        assert_eq!(
            evaluate_shadowed(Some(&shadow), Some(&detail)),
            (Reason::Visible, Some(Reason::MissingRole))
        );
        assert_eq!(
            evaluate_shadowed(Some(&enforce), Some(&detail)),
            (Reason::MissingRole, None)
        );
        // Another page with the same entity type: the page condition is shadowed.
        let other = ctx("other_invoice_page", Some("invoice"), none);
        assert_eq!(
            evaluate_shadowed(Some(&shadow), Some(&other)),
            (Reason::Visible, Some(Reason::WrongPage))
        );
        // The entity conditions never are.
        let table = ctx("invoice_table", None, none);
        assert_eq!(
            evaluate_shadowed(Some(&shadow), Some(&table)),
            (Reason::EntityRequired, None)
        );
        let vendor = ctx("vendor_detail", Some("vendor"), none);
        assert_eq!(
            evaluate_shadowed(Some(&shadow), Some(&vendor)),
            (Reason::WrongEntityType, None)
        );
        // A tool whose entity argument is bound only when the page carries its entity
        // (requires_entity false): on another page without that entity the argument would be
        // taken as given, so the page condition is not shadowed there.
        let unbound = parse_policy(
            &json!({"page_types": ["invoice_detail"], "entity_type": "invoice", "entity_param": "invoice_id",
                    "requires_entity": false, "mode": "log_only"}),
            &schema(),
            lookup,
        )
        .unwrap();
        assert_eq!(
            evaluate_shadowed(Some(&unbound), Some(&table)),
            (Reason::WrongPage, None)
        );
        assert_eq!(
            evaluate_shadowed(Some(&unbound), Some(&other)),
            (Reason::Visible, Some(Reason::WrongPage))
        );
        let disabled = Policy {
            enabled: false,
            ..shadow.clone()
        };
        assert_eq!(
            evaluate_shadowed(Some(&disabled), Some(&detail)),
            (Reason::Disabled, None)
        );
    }

    #[test]
    fn credential_mode_is_a_mode_or_a_list_of_modes() {
        let parse = |v: Value| parse_policy(&v, &schema(), lookup);
        let one = parse(json!({"page_types": "*", "credential_mode": "user_oauth"})).unwrap();
        assert_eq!(one.credential_modes, vec!["user_oauth"]);
        let two = parse(json!({"page_types": "*",
            "credential_mode": ["tenant_secret", "token_exchange", "tenant_secret"]}))
        .unwrap();
        assert_eq!(
            two.credential_modes,
            vec!["tenant_secret", "token_exchange"]
        );
        assert!(get_policy().credential_modes.is_empty());
        assert!(parse(json!({"page_types": "*", "credential_mode": null}))
            .unwrap()
            .credential_modes
            .is_empty());
        for bad in [
            json!("oauth"),
            json!(""),
            json!([]),
            json!(["user_oauth", 1]),
            json!([
                "static",
                "tenant_secret",
                "user_oauth",
                "token_exchange",
                "static"
            ]),
            json!({"mode": "static"}),
            json!(true),
        ] {
            let e = parse(json!({"page_types": "*", "credential_mode": bad})).unwrap_err();
            assert!(e.0.starts_with("credential_mode must be"), "{e}");
        }
    }
}
