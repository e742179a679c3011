//! **Floor** (uses `db`, `error`): shared by `chat`, `tools`, `mcp`, `upstream` and `http`.
//!
//! Page views and their generations.
//!
//! A page view (a chat turn; an MCP user's current page; a run of `/internal/mcp/execute` calls)
//! works under a generation the database minted (`begin_generation`). The database refuses it once
//! the generation lifetime in force for the user's tenant has passed; that lifetime comes with the
//! generation (`ctxguard.effective_ttls()`, read in the same statement), so the gateway follows the
//! DBA's setting instead of guessing. It renews the generation (mints the next one) once three
//! quarters of its lifetime are over, and when the database refuses one anyway (a DBA shortened the
//! lifetime, a clock moved), it renews once and retries the step: a page view never stays failing
//! because its generation lapsed. Each generation keeps its own budgets, as before.

use std::future::Future;
use std::time::{Duration, Instant};

use uuid::Uuid;

use crate::db::{Db, Scope};
use crate::error::ApiError;

/// A generation and when to renew it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lease {
    pub id: Uuid,
    renew_at: Instant,
}

impl Lease {
    /// A generation minted no earlier than `minted`, which the database keeps for `ttl`.
    pub fn new(id: Uuid, ttl: Duration, minted: Instant) -> Lease {
        Lease {
            id,
            renew_at: minted + ttl * 3 / 4,
        }
    }

    /// Time to mint the next one.
    pub fn due(&self) -> bool {
        Instant::now() >= self.renew_at
    }
}

/// Did the database refuse the scope's generation (unknown, foreign or expired: one message)?
pub fn generation_refused(e: &ApiError) -> bool {
    matches!(e, ApiError::Unauthorized(m) if m.contains("generation"))
}

/// What a page view's steps run under: its scope (token, page, trace id, generation) and the
/// conversation its generations are minted for.
pub struct View {
    pub scope: Scope,
    conversation: String,
    lease: Option<Lease>,
    /// Whether a refused generation may be replaced (not for a view that never had one).
    renewable: bool,
}

impl View {
    /// A view whose generation was minted with `lease`.
    pub fn leased(mut scope: Scope, conversation: &str, lease: Lease) -> View {
        scope.generation = Some(lease.id);
        View {
            scope,
            conversation: conversation.to_string(),
            lease: Some(lease),
            renewable: true,
        }
    }

    /// A view with a new generation.
    pub async fn fresh(db: &Db, scope: Scope, conversation: &str) -> Result<View, ApiError> {
        let mut view = View {
            scope,
            conversation: conversation.to_string(),
            lease: None,
            renewable: true,
        };
        view.renew(db).await?;
        Ok(view)
    }

    /// A view with the generation the client named (its lifetime unknown here): renewed only when
    /// the database refuses it.
    pub fn named(scope: Scope, conversation: &str) -> View {
        View {
            conversation: conversation.to_string(),
            lease: None,
            renewable: scope.generation.is_some(),
            scope,
        }
    }

    /// A view without a generation (e.g. approving a call): nothing to renew.
    pub fn without(scope: Scope) -> View {
        View {
            conversation: String::new(),
            lease: None,
            renewable: false,
            scope,
        }
    }

    pub fn generation(&self) -> Option<Uuid> {
        self.scope.generation
    }

    pub fn lease(&self) -> Option<Lease> {
        self.lease
    }

    /// Mint the next generation (for the same conversation).
    pub async fn renew(&mut self, db: &Db) -> Result<(), ApiError> {
        let mut fresh = self.scope.clone();
        fresh.generation = None;
        let started = Instant::now();
        let (id, ttl) = db.mint_generation(&fresh, &self.conversation).await?;
        self.scope.generation = Some(id);
        self.lease = Some(Lease::new(id, ttl, started));
        self.renewable = true;
        Ok(())
    }

    /// Run one database step under a live generation: renewed first when due, and once more (then
    /// the step retried) when the database refuses it. A refused `set_context` runs nothing, so
    /// the retry never repeats a call.
    pub async fn run<T, F, Fut>(&mut self, db: &Db, step: F) -> Result<T, ApiError>
    where
        F: Fn(Scope) -> Fut,
        Fut: Future<Output = Result<T, ApiError>>,
    {
        if self.lease.as_ref().is_some_and(Lease::due) {
            self.renew(db).await?;
        }
        match step(self.scope.clone()).await {
            Err(e) if self.renewable && generation_refused(&e) => {
                tracing::info!(
                    trace_id = %self.scope.trace_id,
                    "the database refused the page view's generation: renewed once"
                );
                self.renew(db).await?;
                step(self.scope.clone()).await
            }
            other => other,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_is_due_after_three_quarters_of_its_lifetime() {
        let now = Instant::now();
        let lease = Lease::new(Uuid::nil(), Duration::from_secs(3600), now);
        assert!(!lease.due());
        let old = Lease::new(Uuid::nil(), Duration::from_millis(40), now);
        std::thread::sleep(Duration::from_millis(35));
        assert!(old.due());
    }

    #[test]
    fn only_generation_refusals_are_renewed() {
        assert!(generation_refused(&ApiError::Unauthorized(
            "unknown, foreign or expired generation".into()
        )));
        assert!(!generation_refused(&ApiError::Unauthorized(
            "invalid context token: token has expired".into()
        )));
        assert!(!generation_refused(&ApiError::Unprocessable(
            "invalid page context: entity not found".into()
        )));
    }
}
