//! Database access. Every step is one short transaction that starts with `ctxguard.set_context`;
//! no transaction is held while the model thinks. The gateway decides nothing: the database does.
//!
//! A `Db` is one pool, connected as one role. The gateway holds up to three: the gateway role's
//! (model calls: EXECUTE on ctxguard's API only), the discovery role's (`sync_mcp_tools` only) and,
//! in demo mode, the demo screens' role (`demo_page`). Each method says which pool it is for.

use std::time::Duration;

use deadpool_postgres::{ManagerConfig, Pool, PoolError, RecyclingMethod, Runtime, Timeouts};
use serde_json::Value;
use tokio_postgres::error::SqlState;
use tokio_postgres::NoTls;
use uuid::Uuid;

use crate::error::ApiError;
use crate::llm::ToolSpec;
use crate::upstream::ServerConfig;

/// Who and where: the caller's token and page, plus the turn's generation and trace id.
#[derive(Debug, Clone)]
pub struct Scope {
    pub token: String,
    pub page: Value,
    pub generation: Option<Uuid>,
    pub trace_id: String,
}

/// A tool as a caller names it: by its catalog name (`invoice.get`), or by the name MCP and model
/// clients see (`invoice__get`: `llm::wire_name`), which the database maps back.
#[derive(Debug, Clone, Copy)]
pub enum ToolName<'a> {
    Catalog(&'a str),
    Wire(&'a str),
}

/// What a turn starts from (read in one transaction).
#[derive(Debug, Clone)]
pub struct TurnStart {
    pub context: Value,
    pub generation: Uuid,
    /// How long the database keeps `generation` (the tenant's generation lifetime).
    pub generation_ttl: Duration,
    pub page_description: String,
    pub tools: Vec<ToolSpec>,
    pub history: Vec<(String, String)>,
}

#[derive(Clone)]
pub struct Db {
    pool: Pool,
}

/// A lifetime in seconds from the database (never below a second).
fn ttl_secs(secs: i32) -> Duration {
    Duration::from_secs(u64::try_from(secs).unwrap_or(0).max(1))
}

pub fn map_pg(e: tokio_postgres::Error) -> ApiError {
    if let Some(db) = e.as_db_error() {
        let code = db.code();
        if *code == SqlState::INVALID_AUTHORIZATION_SPECIFICATION {
            return ApiError::Unauthorized(
                db.message().trim_start_matches("ctxguard: ").to_string(),
            );
        }
        if *code == SqlState::INVALID_PARAMETER_VALUE {
            return ApiError::Unprocessable(
                db.message().trim_start_matches("ctxguard: ").to_string(),
            );
        }
        if code.code().starts_with("57")
            || code.code().starts_with("08")
            || *code == SqlState::OBJECT_NOT_IN_PREREQUISITE_STATE
        {
            return ApiError::DatabaseUnavailable;
        }
        return ApiError::Internal(format!("{}: {}", code.code(), db.message()));
    }
    // No SQLSTATE: the error is the client's own (connection refused or closed, I/O, protocol).
    tracing::warn!(error = %e, "database connection error");
    ApiError::DatabaseUnavailable
}

/// `save_turn`'s size refusals: SQLSTATE 54000 naming the limit (0.1.0 and early 0.2.0 said
/// "turn too large" with 22023), which would otherwise read as an internal or page-context error.
fn turn_error(e: ApiError) -> ApiError {
    match e {
        ApiError::Internal(detail) if detail.starts_with("54000") => {
            tracing::warn!(%detail, "save_turn refused the turn's size");
            ApiError::TurnTooLarge
        }
        ApiError::Unprocessable(m) if m.starts_with("turn too large") => {
            tracing::warn!(detail = %m, "save_turn refused the turn's size");
            ApiError::TurnTooLarge
        }
        other => other,
    }
}

fn map_pool(e: PoolError) -> ApiError {
    match e {
        PoolError::Backend(e) => map_pg(e),
        PoolError::Timeout(_) | PoolError::Closed | PoolError::NoRuntimeSpecified => {
            ApiError::DatabaseUnavailable
        }
        PoolError::PostCreateHook(_) => ApiError::DatabaseUnavailable,
    }
}

impl Db {
    pub fn connect(url: &str, size: usize, timeout: Duration) -> Result<Db, String> {
        let mut cfg = deadpool_postgres::Config::new();
        cfg.url = Some(url.to_string());
        cfg.manager = Some(ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        });
        let mut pool_cfg = deadpool_postgres::PoolConfig::new(size);
        pool_cfg.timeouts = Timeouts {
            wait: Some(timeout),
            create: Some(timeout),
            recycle: Some(timeout),
        };
        cfg.pool = Some(pool_cfg);
        let pool = cfg
            .create_pool(Some(Runtime::Tokio1), NoTls)
            .map_err(|e| e.to_string())?;
        Ok(Db { pool })
    }

    pub fn status(&self) -> (usize, usize) {
        let s = self.pool.status();
        (s.size, s.available)
    }

    async fn client(&self) -> Result<deadpool_postgres::Object, ApiError> {
        self.pool.get().await.map_err(map_pool)
    }

    /// Open a transaction with the scope's context set.
    async fn begin<'a>(
        client: &'a mut deadpool_postgres::Object,
        scope: &Scope,
    ) -> Result<(deadpool_postgres::Transaction<'a>, Value), ApiError> {
        let tx = client.transaction().await.map_err(map_pg)?;
        let stmt = tx
            .prepare_cached("SELECT ctxguard.set_context($1, $2, $3, $4)")
            .await
            .map_err(map_pg)?;
        let row = tx
            .query_one(
                &stmt,
                &[
                    &scope.token,
                    &scope.page,
                    &scope.generation,
                    &scope.trace_id,
                ],
            )
            .await
            .map_err(map_pg)?;
        Ok((tx, row.get(0)))
    }

    /// `SELECT extversion` of ctxguard, for readiness.
    pub async fn extension_version(&self) -> Result<Option<String>, ApiError> {
        let client = self.client().await?;
        let row = client
            .query_opt(
                "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'ctxguard'",
                &[],
            )
            .await
            .map_err(map_pg)?;
        Ok(row.map(|r| r.get(0)))
    }

    /// Mint a generation (it becomes the transaction's context generation), read Gate A (ranked
    /// by the message), the page description and, for a continuing conversation, recent history.
    pub async fn open_turn(
        &self,
        scope: &Scope,
        conversation_id: &str,
        continuing: bool,
        message: &str,
        max_tools: i32,
    ) -> Result<TurnStart, ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let mint = tx
            .prepare_cached(
                "SELECT ctxguard.begin_generation($1), ctxguard.context(),
                        (SELECT generation_ttl FROM ctxguard.effective_ttls())",
            )
            .await
            .map_err(map_pg)?;
        let row = tx
            .query_one(&mint, &[&conversation_id])
            .await
            .map_err(map_pg)?;
        let (generation, context, ttl): (Uuid, Value, i32) = (row.get(0), row.get(1), row.get(2));
        let (tools, page_description) =
            Self::page_tools_in(&tx, Some(message), Some(max_tools)).await?;
        let mut history: Vec<(String, String)> = Vec::new();
        if continuing {
            let stmt = tx
                .prepare_cached(
                    "SELECT message, coalesce(answer, '') FROM ctxguard.conversation_turns
                      WHERE conversation_id = $1 ORDER BY turn DESC LIMIT 6",
                )
                .await
                .map_err(map_pg)?;
            history = tx
                .query(&stmt, &[&conversation_id])
                .await
                .map_err(map_pg)?
                .into_iter()
                .map(|r| (r.get(0), r.get(1)))
                .collect();
            history.reverse();
        }
        tx.commit().await.map_err(map_pg)?;
        Ok(TurnStart {
            context,
            generation,
            generation_ttl: ttl_secs(ttl),
            page_description,
            tools,
            history,
        })
    }

    /// One statement returning one value, in its own transaction with the scope's context.
    pub(crate) async fn one<T>(
        &self,
        scope: &Scope,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<T, ApiError>
    where
        T: for<'r> tokio_postgres::types::FromSql<'r>,
    {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let stmt = tx.prepare_cached(sql).await.map_err(map_pg)?;
        let value: T = tx.query_one(&stmt, params).await.map_err(map_pg)?.get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(value)
    }

    /// The validated context, the page description, and every catalogued tool with Gate A's
    /// verdict (`explain_tools`), for the visible ones their policy flags, and whether each is in
    /// the model's list for `query` and `top_k` (and if not, why). Offered first, then visible.
    pub async fn explain_page(
        &self,
        scope: &Scope,
        query: Option<&str>,
        top_k: i32,
    ) -> Result<Value, ApiError> {
        self.one(
            scope,
            "SELECT jsonb_build_object(
                 'context', ctxguard.context(),
                 'page', (SELECT jsonb_build_object('type', pt.name, 'description', pt.description)
                            FROM ctxguard.page_types pt WHERE pt.name = ctxguard.page_type()),
                 'tools', (SELECT coalesce(jsonb_agg(jsonb_build_object(
                                      'name', e.name, 'visible', e.visible, 'reason', e.reason,
                                      'offered', e.offered, 'leftOut', e.left_out,
                                      'description', t.description, 'readOnly', v.read_only,
                                      'danger', v.danger, 'requiresApproval', v.requires_approval)
                                      ORDER BY NOT e.visible, e.offered IS NOT TRUE, e.name), '[]')
                             FROM ctxguard.explain_tools($1, $2) e
                             JOIN ctxguard.tools t ON t.name = e.name
                             LEFT JOIN ctxguard.visible_tools() v ON v.name = e.name))",
            &[&query, &top_k],
        )
        .await
    }

    /// Gate B for one tool call, in its own transaction. Returns the envelope.
    pub async fn call_tool(
        &self,
        scope: &Scope,
        name: &ToolName<'_>,
        args: &Value,
    ) -> Result<Value, ApiError> {
        match name {
            ToolName::Catalog(name) => {
                self.one(scope, "SELECT ctxguard.call_tool($1, $2)", &[name, args])
                    .await
            }
            // The catalog name whose wire form this is (unique: `tools_wire_name_key`); a name
            // that is no tool's wire form goes to Gate B as it is (TOOL_NOT_FOUND).
            ToolName::Wire(wire) => {
                self.one(
                    scope,
                    "SELECT ctxguard.call_tool(coalesce(
                         (SELECT t.name FROM ctxguard.tools t
                           WHERE pg_catalog.replace(t.name, '.', '__') = $1), $1), $2)",
                    &[wire, args],
                )
                .await
            }
        }
    }

    /// A demo screen: the validated context and the data of the screen it names. Only on the demo
    /// screens' pool (`CTXGUARD_DEMO_DATABASE_URL`): the gateway role cannot (`42501`).
    pub async fn demo_page(&self, scope: &Scope) -> Result<Value, ApiError> {
        self.one(
            scope,
            "SELECT jsonb_build_object('context', ctxguard.context(), 'data', demo.page_data())",
            &[],
        )
        .await
    }

    /// Run a pending approval exactly once (the database consumes it atomically).
    pub async fn approve(&self, scope: &Scope, call_id: Uuid) -> Result<Value, ApiError> {
        self.one(scope, "SELECT ctxguard.approve_call($1)", &[&call_id])
            .await
    }

    /// Verify the token and page, returning the context (who the database says the caller is).
    pub async fn context(&self, scope: &Scope) -> Result<Value, ApiError> {
        let mut client = self.client().await?;
        let (tx, context) = Self::begin(&mut client, scope).await?;
        tx.commit().await.map_err(map_pg)?;
        Ok(context)
    }

    /// Mint a generation for a conversation: its id and how long the database keeps it.
    pub async fn mint_generation(
        &self,
        scope: &Scope,
        conversation_id: &str,
    ) -> Result<(Uuid, Duration), ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let stmt = tx
            .prepare_cached(
                "SELECT ctxguard.begin_generation($1),
                        (SELECT generation_ttl FROM ctxguard.effective_ttls())",
            )
            .await
            .map_err(map_pg)?;
        let row = tx
            .query_one(&stmt, &[&conversation_id])
            .await
            .map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        Ok((row.get(0), ttl_secs(row.get(1))))
    }

    /// Persist a finished turn (tenant- and user-scoped, with its page context). A turn over the
    /// database's size limits is TURN_TOO_LARGE, never a page-context error.
    pub async fn save_turn(
        &self,
        scope: &Scope,
        conversation_id: &str,
        message: &str,
        answer: &str,
        calls: &Value,
    ) -> Result<i32, ApiError> {
        self.one(
            scope,
            "SELECT ctxguard.save_turn($1, $2, $3, $4)",
            &[&conversation_id, &message, &answer, calls],
        )
        .await
        .map_err(turn_error)
    }

    /// Verify a bearer token without a page (for MCP requests): the identity, or 401.
    pub async fn verify_token(&self, token: &str) -> Result<Value, ApiError> {
        let client = self.client().await?;
        let stmt = client
            .prepare_cached("SELECT ctxguard.verify_token($1)")
            .await
            .map_err(map_pg)?;
        Ok(client
            .query_one(&stmt, &[&token])
            .await
            .map_err(map_pg)?
            .get(0))
    }

    /// Gate A (optionally ranked by `query` and cut at `top_k`) and the page type's description.
    pub async fn page_tools(
        &self,
        scope: &Scope,
        query: Option<&str>,
        top_k: Option<i32>,
    ) -> Result<(Vec<ToolSpec>, String), ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let out = Self::page_tools_in(&tx, query, top_k).await?;
        tx.commit().await.map_err(map_pg)?;
        Ok(out)
    }

    /// Gate A and the page description in one statement of an open transaction. The page type's
    /// row comes out once even when no tool is visible.
    async fn page_tools_in(
        tx: &deadpool_postgres::Transaction<'_>,
        query: Option<&str>,
        top_k: Option<i32>,
    ) -> Result<(Vec<ToolSpec>, String), ApiError> {
        let stmt = tx
            .prepare_cached(
                "SELECT pt.description, v.name, v.description, v.input_schema, v.read_only, v.danger,
                        v.requires_approval, v.server, t.title
                   FROM ctxguard.page_types pt
                   LEFT JOIN LATERAL ctxguard.visible_tools($1, $2) WITH ORDINALITY v ON true
                   LEFT JOIN ctxguard.tools t ON t.name = v.name
                  WHERE pt.name = ctxguard.page_type()
                  ORDER BY v.ordinality",
            )
            .await
            .map_err(map_pg)?;
        let rows = tx.query(&stmt, &[&query, &top_k]).await.map_err(map_pg)?;
        let description = rows
            .first()
            .map(|r| r.get::<_, String>(0))
            .unwrap_or_default();
        let tools = rows
            .iter()
            .filter(|r| r.get::<_, Option<String>>(1).is_some())
            .map(|r| ToolSpec {
                name: r.get(1),
                description: r.get(2),
                input_schema: r.get(3),
                read_only: r.get(4),
                danger: r.get(5),
                requires_approval: r.get(6),
                server: r.get(7),
                title: r.get(8),
            })
            .collect();
        Ok((tools, description))
    }

    /// Second half of a forwarded upstream call: mask, charge and audit the result.
    pub async fn complete_call(
        &self,
        scope: &Scope,
        call_id: Uuid,
        result: &Value,
        is_error: bool,
    ) -> Result<Value, ApiError> {
        self.one(
            scope,
            "SELECT ctxguard.complete_call($1, $2, $3)",
            &[&call_id, result, &is_error],
        )
        .await
    }

    /// Enabled upstream servers from the registry (all, or those named).
    pub async fn mcp_servers(
        &self,
        names: Option<&[String]>,
    ) -> Result<Vec<ServerConfig>, ApiError> {
        let client = self.client().await?;
        let names: Option<Vec<String>> = names.map(<[String]>::to_vec);
        let rows = client
            .query(
                "SELECT name, transport, url, command, args, env, cwd, headers, bearer_token_env
                   FROM ctxguard.mcp_servers WHERE enabled AND ($1::text[] IS NULL OR name = ANY($1))
                  ORDER BY name",
                &[&names],
            )
            .await
            .map_err(map_pg)?;
        let strings = |v: Value| -> std::collections::HashMap<String, String> {
            v.as_object()
                .map(|o| {
                    o.iter()
                        .filter_map(|(k, v)| v.as_str().map(|s| (k.clone(), s.to_string())))
                        .collect()
                })
                .unwrap_or_default()
        };
        Ok(rows
            .into_iter()
            .map(|r| ServerConfig {
                name: r.get(0),
                transport: r.get(1),
                url: r.get(2),
                command: r.get(3),
                args: r.get(4),
                env: strings(r.get(5)),
                cwd: r.get(6),
                headers: strings(r.get(7)),
                bearer_token_env: r.get(8),
            })
            .collect())
    }

    /// Record a server's discovered tools in the catalog, without a context. Only on the discovery
    /// pool (`CTXGUARD_DISCOVERY_DATABASE_URL`): the gateway role cannot (`42501`).
    pub async fn sync_mcp_tools(&self, server: &str, tools: &Value) -> Result<Value, ApiError> {
        let client = self.client().await?;
        Ok(client
            .query_one("SELECT ctxguard.sync_mcp_tools($1, $2)", &[&server, tools])
            .await
            .map_err(map_pg)?
            .get(0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_over_the_size_limits_is_turn_too_large() {
        let limit = ApiError::Internal(
            "54000: ctxguard: a turn's answer is limited to 262144 bytes".into(),
        );
        assert_eq!(turn_error(limit).code(), "TURN_TOO_LARGE");
        let old = ApiError::Unprocessable("turn too large or malformed".into());
        assert_eq!(turn_error(old).code(), "TURN_TOO_LARGE");
        let page = ApiError::Unprocessable("page context: unknown pageType".into());
        assert_eq!(turn_error(page).code(), "INVALID_PAGE_CONTEXT");
        let other = ApiError::Internal("XX000: boom".into());
        assert_eq!(turn_error(other).code(), "INTERNAL");
    }
}
