//! Database access. Every step is one short transaction that starts with `ctxguard.set_context`;
//! no transaction is held while the model thinks. The gateway decides nothing: the database does.

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

/// What a turn starts from (read in one transaction).
#[derive(Debug, Clone)]
pub struct TurnStart {
    pub context: Value,
    pub generation: Uuid,
    pub page_description: String,
    pub tools: Vec<ToolSpec>,
    pub history: Vec<(String, String)>,
}

#[derive(Clone)]
pub struct Db {
    pool: Pool,
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
            .prepare_cached("SELECT ctxguard.begin_generation($1), ctxguard.context()")
            .await
            .map_err(map_pg)?;
        let row = tx
            .query_one(&mint, &[&conversation_id])
            .await
            .map_err(map_pg)?;
        let (generation, context): (Uuid, Value) = (row.get(0), row.get(1));
        let tools_stmt = tx
            .prepare_cached(
                "SELECT name, description, input_schema, read_only, danger, requires_approval,
                        (SELECT description FROM ctxguard.page_types WHERE name = ctxguard.page_type()), server
                   FROM ctxguard.visible_tools($1, $2)",
            )
            .await
            .map_err(map_pg)?;
        let rows = tx
            .query(&tools_stmt, &[&message, &max_tools])
            .await
            .map_err(map_pg)?;
        let page_description: String = rows
            .first()
            .and_then(|r| r.get::<_, Option<String>>(6))
            .unwrap_or_default();
        let tools = rows
            .into_iter()
            .map(|r| ToolSpec {
                name: r.get(0),
                description: r.get(1),
                input_schema: r.get(2),
                read_only: r.get(3),
                danger: r.get(4),
                requires_approval: r.get(5),
                server: r.get(7),
            })
            .collect();
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
            page_description,
            tools,
            history,
        })
    }

    /// Gate B for one tool call, in its own transaction. Returns the envelope.
    pub async fn call_tool(
        &self,
        scope: &Scope,
        name: &str,
        args: &Value,
    ) -> Result<Value, ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let stmt = tx
            .prepare_cached("SELECT ctxguard.call_tool($1, $2)")
            .await
            .map_err(map_pg)?;
        let envelope: Value = tx
            .query_one(&stmt, &[&name, args])
            .await
            .map_err(map_pg)?
            .get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(envelope)
    }

    /// Run a pending approval exactly once (the database consumes it atomically).
    pub async fn approve(&self, scope: &Scope, call_id: Uuid) -> Result<Value, ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let envelope: Value = tx
            .query_one(
                &tx.prepare_cached("SELECT ctxguard.approve_call($1)")
                    .await
                    .map_err(map_pg)?,
                &[&call_id],
            )
            .await
            .map_err(map_pg)?
            .get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(envelope)
    }

    /// Verify the token and page, returning the context (who the database says the caller is).
    pub async fn context(&self, scope: &Scope) -> Result<Value, ApiError> {
        let mut client = self.client().await?;
        let (tx, context) = Self::begin(&mut client, scope).await?;
        tx.commit().await.map_err(map_pg)?;
        Ok(context)
    }

    /// Mint a generation for a conversation.
    pub async fn mint_generation(
        &self,
        scope: &Scope,
        conversation_id: &str,
    ) -> Result<Uuid, ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let g: Uuid = tx
            .query_one(
                &tx.prepare_cached("SELECT ctxguard.begin_generation($1)")
                    .await
                    .map_err(map_pg)?,
                &[&conversation_id],
            )
            .await
            .map_err(map_pg)?
            .get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(g)
    }

    /// Persist a finished turn (tenant- and user-scoped, with its page context).
    pub async fn save_turn(
        &self,
        scope: &Scope,
        conversation_id: &str,
        message: &str,
        answer: &str,
        calls: &Value,
    ) -> Result<i32, ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let n: i32 = tx
            .query_one(
                "SELECT ctxguard.save_turn($1, $2, $3, $4)",
                &[&conversation_id, &message, &answer, calls],
            )
            .await
            .map_err(map_pg)?
            .get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(n)
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

    /// Gate A for a page (no generation, no ranking) and the page type's description.
    pub async fn visible_tools(&self, scope: &Scope) -> Result<(Vec<ToolSpec>, String), ApiError> {
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let stmt = tx
            .prepare_cached(
                "SELECT name, description, input_schema, read_only, danger, requires_approval, server,
                        (SELECT description FROM ctxguard.page_types WHERE name = ctxguard.page_type())
                   FROM ctxguard.visible_tools()
                 UNION ALL
                 SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL,
                        (SELECT description FROM ctxguard.page_types WHERE name = ctxguard.page_type())",
            )
            .await
            .map_err(map_pg)?;
        let rows = tx.query(&stmt, &[]).await.map_err(map_pg)?;
        tx.commit().await.map_err(map_pg)?;
        let description = rows
            .last()
            .and_then(|r| r.get::<_, Option<String>>(7))
            .unwrap_or_default();
        let tools = rows
            .iter()
            .filter(|r| r.get::<_, Option<String>>(0).is_some())
            .map(|r| ToolSpec {
                name: r.get(0),
                description: r.get(1),
                input_schema: r.get(2),
                read_only: r.get(3),
                danger: r.get(4),
                requires_approval: r.get(5),
                server: r.get(6),
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
        let mut client = self.client().await?;
        let (tx, _) = Self::begin(&mut client, scope).await?;
        let stmt = tx
            .prepare_cached("SELECT ctxguard.complete_call($1, $2, $3)")
            .await
            .map_err(map_pg)?;
        let envelope: Value = tx
            .query_one(&stmt, &[&call_id, result, &is_error])
            .await
            .map_err(map_pg)?
            .get(0);
        tx.commit().await.map_err(map_pg)?;
        Ok(envelope)
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

    /// Record a server's discovered tools in the catalog (as the gateway's role, no context).
    pub async fn sync_mcp_tools(&self, server: &str, tools: &Value) -> Result<Value, ApiError> {
        let client = self.client().await?;
        Ok(client
            .query_one("SELECT ctxguard.sync_mcp_tools($1, $2)", &[&server, tools])
            .await
            .map_err(map_pg)?
            .get(0))
    }
}
