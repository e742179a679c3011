//! MCP sessions (the session-based protocol revisions, 2024-11-05 … 2025-11-25): each belongs to the
//! (tenant, user) that initialized it, may have a page of its own, and lives while it is used.
//!
//! - [`SessionStore`] holds the records: owner, own page, last use, open event streams. It is the
//!   one place a session's state lives, behind `get`/`insert`/`remove`/`touch` (and the two page and
//!   stream updates), so that it can move into the database without touching its users.
//! - [`BoundSessions`] is the session manager rmcp runs on: it wraps rmcp's in-memory manager,
//!   records the owner at `initialize` (from the verified caller), hands each message the session's
//!   key ([`SessionKey`]) and keeps the store in step. The id clients see is not the one rmcp knows
//!   (and logs): a fresh 256-bit random id maps to rmcp's, so session ids never reach the logs; ours
//!   log rmcp's id, which no request can use.
//! - Expiry: rmcp's own idle timeout is off (it ended sessions whose GET stream was open but quiet);
//!   a reaper ends a session once it has no open stream and no request for
//!   `CTXGUARD_MCP_SESSION_IDLE_TIMEOUT_MS`. Its id then gets 404, and the client initializes again.
//!
//! Another user's session id is answered exactly like an unknown one (404, nothing touched): the
//! check is in `mcp::authenticate`, which knows the caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use prometheus::{IntCounter, IntGauge};
use rmcp::model::ClientJsonRpcMessage;
use rmcp::transport::streamable_http_server::session::local::{
    EventId, LocalSessionHandle, LocalSessionManager, LocalSessionManagerError, SessionConfig,
};
use rmcp::transport::streamable_http_server::session::{
    RestoreOutcome, ServerSseMessage, SessionId, SessionManager,
};
use serde_json::Value;
use tokio_stream::wrappers::ReceiverStream;

/// (tenant, user): who a session or a page belongs to.
pub type Who = (String, String);

/// The client-facing id of a session, handed to the handler with each of the session's messages.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SessionKey(pub Arc<str>);

/// What is known of one session.
#[derive(Clone, Debug)]
pub struct SessionRecord {
    /// Who initialized it: the only caller it answers.
    pub who: Who,
    /// Its own page (from `X-Ctxguard-Page` on its requests); `None`: it follows the user's shared
    /// page (`PUT /v1/context`).
    pub page: Option<Value>,
    pub last_seen: Instant,
    /// Event streams open on it (its GET stream, streamed answers): while any is, it does not expire.
    pub open_streams: u32,
    /// The token it was initialized (or restored) with here: its database record is ended with it
    /// when the session expires.
    pub token: Option<String>,
}

impl SessionRecord {
    pub fn new(who: Who) -> SessionRecord {
        SessionRecord {
            who,
            page: None,
            last_seen: Instant::now(),
            open_streams: 0,
            token: None,
        }
    }
}

/// The session records (in memory for now).
#[derive(Default)]
pub struct SessionStore {
    records: Mutex<HashMap<Arc<str>, SessionRecord>>,
}

impl SessionStore {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Arc<str>, SessionRecord>> {
        self.records.lock().expect("session store lock")
    }

    pub fn get(&self, id: &str) -> Option<SessionRecord> {
        self.lock().get(id).cloned()
    }

    pub fn insert(&self, id: Arc<str>, record: SessionRecord) {
        self.lock().insert(id, record);
    }

    pub fn remove(&self, id: &str) -> Option<SessionRecord> {
        self.lock().remove(id)
    }

    /// Mark the session used now; false if there is no such session.
    pub fn touch(&self, id: &str) -> bool {
        self.lock()
            .get_mut(id)
            .map(|r| r.last_seen = Instant::now())
            .is_some()
    }

    /// Set the session's own page; returns the one it had.
    pub fn set_page(&self, id: &str, page: Value) -> Option<Value> {
        self.lock().get_mut(id).and_then(|r| r.page.replace(page))
    }

    /// A stream opened (`+1`) or closed (`-1`) on the session (closing also counts as use).
    pub fn streams(&self, id: &str, delta: i32) {
        if let Some(r) = self.lock().get_mut(id) {
            r.open_streams = r.open_streams.saturating_add_signed(delta);
            r.last_seen = Instant::now();
        }
    }

    /// Sessions with no open stream and no use for `idle`.
    pub fn idle(&self, idle: Duration) -> Vec<Arc<str>> {
        let now = Instant::now();
        self.lock()
            .iter()
            .filter(|(_, r)| r.open_streams == 0 && now.duration_since(r.last_seen) >= idle)
            .map(|(id, _)| id.clone())
            .collect()
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Why a session operation failed (never naming a session id: rmcp logs these).
#[derive(Debug, thiserror::Error)]
pub enum BoundError {
    #[error("no such session")]
    NotFound,
    #[error("the session was not initialized by an authenticated caller")]
    NoCaller,
    #[error("{0}")]
    Local(#[from] LocalSessionManagerError),
}

/// Session metrics.
#[derive(Clone)]
pub struct SessionMetrics {
    pub open: IntGauge,
    pub expired: IntCounter,
}

impl SessionMetrics {
    pub fn new(metrics: &crate::metrics::Metrics) -> SessionMetrics {
        let open = IntGauge::new("ctxguard_mcp_sessions", "MCP sessions open").expect("metric");
        let expired = IntCounter::new(
            "ctxguard_mcp_sessions_expired_total",
            "MCP sessions ended by the idle timeout",
        )
        .expect("metric");
        metrics.register(Box::new(open.clone()));
        metrics.register(Box::new(expired.clone()));
        SessionMetrics { open, expired }
    }
}

/// Ends a session's database record (its id, the token it was opened with).
pub type Expire =
    Box<dyn Fn(Arc<str>, String) -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// rmcp's in-memory session manager, bound to the store.
pub struct BoundSessions {
    /// Ends an expired session's record in the database, so that no gateway restores it.
    expire: Option<Expire>,
    inner: LocalSessionManager,
    store: Arc<SessionStore>,
    /// Client-facing id → rmcp's id.
    routes: Mutex<HashMap<Arc<str>, SessionId>>,
    /// Told when a session ends (its listeners are dropped).
    on_close: Box<dyn Fn(&SessionKey) + Send + Sync>,
    metrics: SessionMetrics,
}

/// A new client-facing session id: 256 random bits, hex.
fn new_session_id() -> Arc<str> {
    let a = uuid::Uuid::new_v4().simple().to_string();
    let b = uuid::Uuid::new_v4().simple().to_string();
    format!("{a}{b}").into()
}

impl BoundSessions {
    pub fn new(
        store: Arc<SessionStore>,
        metrics: SessionMetrics,
        on_close: impl Fn(&SessionKey) + Send + Sync + 'static,
    ) -> BoundSessions {
        let mut config = SessionConfig::default();
        // Expiry is ours (the reaper): rmcp's ends a session whose stream is open but quiet.
        config.keep_alive = None;
        let mut inner = LocalSessionManager::default();
        inner.session_config = config;
        BoundSessions {
            expire: None,
            inner,
            store,
            routes: Mutex::default(),
            on_close: Box::new(on_close),
            metrics,
        }
    }

    /// End expired sessions' database records with `expire` too.
    pub fn with_expiry(mut self, expire: Expire) -> BoundSessions {
        self.expire = Some(expire);
        self
    }

    fn internal(&self, id: &SessionId) -> Result<SessionId, BoundError> {
        self.routes
            .lock()
            .expect("session routes lock")
            .get(id)
            .cloned()
            .ok_or(BoundError::NotFound)
    }

    /// rmcp's handle of the session.
    async fn handle(&self, id: &SessionId) -> Result<LocalSessionHandle, BoundError> {
        let internal = self.internal(id)?;
        self.inner
            .sessions
            .read()
            .await
            .get(&internal)
            .cloned()
            .ok_or(BoundError::NotFound)
    }

    /// Hand the handler the session's key with the message, and count it as use.
    fn forward(&self, id: &SessionId, message: &mut ClientJsonRpcMessage) {
        self.store.touch(id);
        message.insert_extension(SessionKey(id.clone()));
    }

    /// Count a stream as open on the session until it is dropped.
    fn tracked<S: Stream<Item = ServerSseMessage> + Send + Sync + 'static>(
        &self,
        id: &SessionId,
        stream: S,
    ) -> impl Stream<Item = ServerSseMessage> + Send + Sync + 'static + use<S> {
        let open = OpenStream::new(self.store.clone(), id.clone());
        stream.map(move |m| {
            let _ = &open;
            m
        })
    }

    /// End the sessions idle for `idle`; returns how many.
    pub async fn reap(&self, idle: Duration) -> usize {
        let ids = self.store.idle(idle);
        for id in &ids {
            tracing::info!(session = %self.internal(id).map(|i| i.to_string()).unwrap_or_default(), "MCP session expired (idle)");
            let token = self.store.get(id).and_then(|r| r.token);
            if let (Some(expire), Some(token)) = (&self.expire, token) {
                expire(id.clone(), token).await;
            }
            let _ = self.close_session(id).await;
            self.metrics.expired.inc();
        }
        ids.len()
    }

    /// Run the reaper until the manager is dropped.
    pub fn spawn_reaper(this: &Arc<BoundSessions>, idle: Duration) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let weak: Weak<BoundSessions> = Arc::downgrade(this);
        let tick = (idle / 4).clamp(Duration::from_millis(50), Duration::from_secs(30));
        runtime.spawn(async move {
            let mut interval = tokio::time::interval(tick);
            interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                interval.tick().await;
                let Some(this) = weak.upgrade() else { break };
                this.reap(idle).await;
            }
        });
    }
}

/// An open stream on a session: counted in the store until dropped.
struct OpenStream {
    store: Arc<SessionStore>,
    id: SessionId,
}

impl OpenStream {
    fn new(store: Arc<SessionStore>, id: SessionId) -> OpenStream {
        store.streams(&id, 1);
        OpenStream { store, id }
    }
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.store.streams(&self.id, -1);
    }
}

impl SessionManager for BoundSessions {
    type Error = BoundError;
    type Transport = <LocalSessionManager as SessionManager>::Transport;

    async fn create_session(&self) -> Result<(SessionId, Self::Transport), Self::Error> {
        let (internal, transport) = self.inner.create_session().await?;
        let id = new_session_id();
        self.routes
            .lock()
            .expect("session routes lock")
            .insert(id.clone(), internal);
        Ok((id, transport))
    }

    async fn initialize_session(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<rmcp::model::ServerJsonRpcMessage, Self::Error> {
        let internal = self.internal(id)?;
        let caller = match &message {
            ClientJsonRpcMessage::Request(r) => {
                use rmcp::model::GetExtensions;
                r.request
                    .extensions()
                    .get::<axum::http::request::Parts>()
                    .and_then(|p| p.extensions.get::<crate::mcp::Caller>())
                    .map(|c| (c.who.clone(), c.token.clone()))
            }
            _ => None,
        };
        let Some((who, token)) = caller else {
            let _ = self.inner.close_session(&internal).await;
            self.routes.lock().expect("session routes lock").remove(id);
            return Err(BoundError::NoCaller);
        };
        let mut record = SessionRecord::new(who);
        record.token = Some(token);
        self.store.insert(id.clone(), record);
        self.metrics.open.set(self.store.len() as i64);
        tracing::info!(session = %internal, "MCP session opened");
        self.forward(id, &mut message);
        Ok(self.inner.initialize_session(&internal, message).await?)
    }

    async fn has_session(&self, id: &SessionId) -> Result<bool, Self::Error> {
        let Ok(internal) = self.internal(id) else {
            return Ok(false);
        };
        Ok(self.store.get(id).is_some() && self.inner.has_session(&internal).await?)
    }

    async fn close_session(&self, id: &SessionId) -> Result<(), Self::Error> {
        let internal = self.routes.lock().expect("session routes lock").remove(id);
        let record = self.store.remove(id);
        self.metrics.open.set(self.store.len() as i64);
        if record.is_some() {
            (self.on_close)(&SessionKey(id.clone()));
        }
        if let Some(internal) = internal {
            // Errors are logged here, by rmcp's id, and not returned: rmcp would log the client's.
            if let Err(e) = self.inner.close_session(&internal).await {
                tracing::warn!(session = %internal, error = %e, "closing an MCP session failed");
            }
        }
        Ok(())
    }

    /// A session recorded in the database (opened through another gateway, or before a restart):
    /// a fresh rmcp session behind the same client-facing id; rmcp then replays its `initialize`
    /// (through `initialize_session`, which records the owner as for a new one).
    async fn restore_session(
        &self,
        id: SessionId,
    ) -> Result<RestoreOutcome<Self::Transport>, Self::Error> {
        if self
            .routes
            .lock()
            .expect("session routes lock")
            .contains_key(&id)
        {
            return Ok(RestoreOutcome::AlreadyPresent);
        }
        let (internal, transport) = self.inner.create_session().await?;
        self.routes
            .lock()
            .expect("session routes lock")
            .insert(id, internal);
        Ok(RestoreOutcome::Restored(transport))
    }

    async fn create_stream(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self.handle(id).await?;
        self.forward(id, &mut message);
        // As rmcp's manager does, on its session handle (whose streams own their data).
        let receiver = handle
            .establish_request_wise_channel()
            .await
            .map_err(LocalSessionManagerError::from)?;
        handle
            .push_message(message, receiver.http_request_id)
            .await
            .map_err(LocalSessionManagerError::from)?;
        Ok(self.tracked(id, ReceiverStream::new(receiver.inner)))
    }

    async fn accept_message(
        &self,
        id: &SessionId,
        mut message: ClientJsonRpcMessage,
    ) -> Result<(), Self::Error> {
        let internal = self.internal(id)?;
        self.forward(id, &mut message);
        Ok(self.inner.accept_message(&internal, message).await?)
    }

    async fn create_standalone_stream(
        &self,
        id: &SessionId,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self.handle(id).await?;
        self.store.touch(id);
        let receiver = handle
            .establish_common_channel()
            .await
            .map_err(LocalSessionManagerError::from)?;
        Ok(self.tracked(id, ReceiverStream::new(receiver.inner)))
    }

    async fn resume(
        &self,
        id: &SessionId,
        last_event_id: String,
    ) -> Result<impl Stream<Item = ServerSseMessage> + Send + Sync + 'static, Self::Error> {
        let handle = self.handle(id).await?;
        self.store.touch(id);
        let event_id: EventId = last_event_id
            .parse()
            .map_err(LocalSessionManagerError::from)?;
        let receiver = handle
            .resume(event_id)
            .await
            .map_err(LocalSessionManagerError::from)?;
        Ok(self.tracked(id, ReceiverStream::new(receiver.inner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(u: &str) -> Who {
        ("acme".into(), u.into())
    }

    #[test]
    fn only_sessions_without_streams_idle_past_the_timeout_are_due() {
        let store = SessionStore::default();
        store.insert("a".into(), SessionRecord::new(who("alice")));
        store.insert("b".into(), SessionRecord::new(who("alice")));
        store.streams("b", 1);
        assert!(store.idle(Duration::from_secs(3600)).is_empty());
        let due = store.idle(Duration::ZERO);
        assert_eq!(due, vec![Arc::<str>::from("a")], "b has an open stream");
        store.streams("b", -1);
        assert_eq!(store.idle(Duration::ZERO).len(), 2);
        assert!(store.touch("a"));
        assert!(!store.touch("nope"));
        assert_eq!(store.set_page("a", serde_json::json!({"p": 1})), None);
        assert_eq!(
            store.set_page("a", serde_json::json!({"p": 2})),
            Some(serde_json::json!({"p": 1}))
        );
        assert!(store.remove("a").is_some() && store.get("a").is_none());
    }

    #[test]
    fn client_session_ids_are_long_random_and_printable() {
        let a = new_session_id();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_session_id());
    }
}
