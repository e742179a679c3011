//! MCP sessions (the session-based protocol revisions, 2024-11-05 … 2025-11-25): each belongs to the
//! (tenant, user) that initialized it, may have a page of its own, and lives while it is used.
//!
//! - [`SessionStore`] holds what this gateway knows of each session: owner, own page, last use
//!   here, open event streams, the caller's latest token. The database holds the truth every
//!   gateway shares (`ctxguard.mcp_sessions`: owner, own page, last use through any gateway,
//!   expiry), reached through `mod.rs`.
//! - [`BoundSessions`] is the session manager rmcp runs on: it wraps rmcp's in-memory manager,
//!   records the owner at `initialize` (from the verified caller), hands each message the session's
//!   key ([`SessionKey`]) and keeps the store in step. The id clients see is not the one rmcp knows
//!   (and logs): a fresh 256-bit random id maps to rmcp's, so session ids never reach the logs; ours
//!   log rmcp's id, which no request can use.
//! - Expiry: rmcp's own idle timeout is off (it ended sessions whose GET stream was open but quiet);
//!   a reaper ends a session once no gateway used it for `CTXGUARD_MCP_SESSION_IDLE_TIMEOUT_MS`.
//!   Its id then gets 404 on every gateway, and the client initializes again. Use is recorded in the
//!   database ([`SessionRecords`]): each request (throttled: at most once per [`touch_after`]), and
//!   each tick of the reaper for the sessions with an open event stream here. A session idle here is
//!   ended only if it is idle in the database too; one used through another gateway lives on
//!   (here it is due again when it would be idle there).
//!
//! Another user's session id is answered exactly like an unknown one (404, nothing touched): the
//! check is in `mcp::authenticate`, which knows the caller.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use async_trait::async_trait;

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
    /// The latest token its caller sent here (at first the one it was initialized or restored
    /// with): its database record is kept with it (use by open streams, expiry).
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

/// What this gateway knows of the sessions it serves (in memory; the shared record is in the database).
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

    /// The session was last used `ago` (through any gateway, as the database says).
    pub fn used_ago(&self, id: &str, ago: Duration) {
        if let Some(r) = self.lock().get_mut(id) {
            r.last_seen = Instant::now().checked_sub(ago).unwrap_or(r.last_seen);
        }
    }

    /// The session's caller's latest token (kept for its record's upkeep: a fresher one verifies
    /// longer).
    pub fn set_token(&self, id: &str, token: &str) {
        if let Some(r) = self.lock().get_mut(id) {
            if r.token.as_deref() != Some(token) {
                r.token = Some(token.to_string());
            }
        }
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

    /// Sessions with an open stream here, with their token: in use.
    pub fn streamed(&self) -> Vec<(Arc<str>, String)> {
        self.lock()
            .iter()
            .filter(|(_, r)| r.open_streams > 0)
            .filter_map(|(id, r)| Some((id.clone(), r.token.clone()?)))
            .collect()
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

/// How often a use of a session is recorded in the database: at most once per a quarter of the
/// idle timeout (each request, each reaper tick for open streams).
pub fn touch_after(idle: Duration) -> Duration {
    idle / 4
}

/// How long the database must have seen no use of a session before it ends: the idle timeout plus
/// [`touch_after`] (a use may be recorded that much late), so that no session used within the idle
/// timeout ends.
pub fn expire_after(idle: Duration) -> Duration {
    idle + touch_after(idle)
}

/// What the database did with a session idle here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expiry {
    /// It was idle there too: ended for every gateway.
    Ended,
    /// It no longer exists (ended through another gateway, or expired).
    Gone,
    /// It was used (through another gateway) this long ago: it lives on.
    Used(Duration),
    /// The token kept for it no longer verifies: it cannot be ended with it (a fresher token, a
    /// later request or its expiry will).
    Unverified,
    /// The database did not answer: try again later.
    Unavailable,
}

/// The sessions' records in the database (`ctxguard.mcp_sessions`), as the reaper keeps them.
#[async_trait]
pub trait SessionRecords: Send + Sync {
    /// End the session's record if no gateway used it for `idle`.
    async fn expire(&self, id: &str, token: &str, idle: Duration) -> Expiry;
    /// Record a use of these sessions (their id, their token), unless one was recorded within
    /// `touch_after`. Returns those that are gone (ended through another gateway, or expired).
    async fn touch(&self, sessions: &[(Arc<str>, String)], touch_after: Duration) -> Vec<Arc<str>>;
}

/// rmcp's in-memory session manager, bound to the store.
pub struct BoundSessions {
    /// The sessions' records in the database: a session ends only when it is idle there too, and
    /// then for every gateway.
    records: Option<Arc<dyn SessionRecords>>,
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
            records: None,
            inner,
            store,
            routes: Mutex::default(),
            on_close: Box::new(on_close),
            metrics,
        }
    }

    /// Keep the sessions' records in the database (their use, their expiry).
    pub fn with_records(mut self, records: Arc<dyn SessionRecords>) -> BoundSessions {
        self.records = Some(records);
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

    /// rmcp's id of a session, for the logs.
    fn log_id(&self, id: &str) -> String {
        self.internal(&Arc::from(id))
            .map(|i| i.to_string())
            .unwrap_or_default()
    }

    /// One tick of the reaper: record the use of sessions with an open stream here (closing those
    /// ended through another gateway meanwhile: their streams end), then end the sessions idle for
    /// `idle` here and in the database; returns how many ended for idleness.
    pub async fn reap(&self, idle: Duration) -> usize {
        if let Some(records) = &self.records {
            let streamed = self.store.streamed();
            if !streamed.is_empty() {
                for id in records.touch(&streamed, touch_after(idle)).await {
                    let session = self.log_id(&id);
                    tracing::info!(%session, "MCP session ended elsewhere: its streams here close");
                    let _ = self.close_session(&id).await;
                }
            }
        }
        let mut ended = 0;
        for id in self.store.idle(idle) {
            let token = self.store.get(&id).and_then(|r| r.token);
            let expiry = match (&self.records, token) {
                (Some(records), Some(token)) => {
                    records.expire(&id, &token, expire_after(idle)).await
                }
                // No record in the database to consult: idle here is idle.
                _ => Expiry::Ended,
            };
            let session = self.log_id(&id);
            match expiry {
                Expiry::Ended => {
                    tracing::info!(%session, "MCP session expired (idle)");
                    self.metrics.expired.inc();
                    ended += 1;
                }
                Expiry::Gone => tracing::info!(%session, "MCP session ended elsewhere"),
                Expiry::Unverified => tracing::info!(
                    %session,
                    "MCP session idle here; its token no longer verifies: dropped here only"
                ),
                Expiry::Used(ago) => {
                    // Used through another gateway: due again when it would be idle there too.
                    self.store.used_ago(&id, ago);
                    continue;
                }
                Expiry::Unavailable => continue,
            }
            let _ = self.close_session(&id).await;
        }
        ended
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
    fn streamed_sessions_are_listed_with_their_latest_token_and_use_can_be_adopted() {
        let store = SessionStore::default();
        let mut a = SessionRecord::new(who("alice"));
        a.token = Some("t1".into());
        store.insert("a".into(), a);
        store.insert("b".into(), SessionRecord::new(who("alice")));
        assert!(store.streamed().is_empty());
        store.streams("a", 1);
        store.streams("b", 1);
        store.set_token("a", "t2");
        // A session without a token (none verified here yet) cannot be kept alive in the database.
        assert_eq!(
            store.streamed(),
            vec![(Arc::<str>::from("a"), "t2".to_string())]
        );
        store.streams("a", -1);
        store.used_ago("a", Duration::from_secs(5));
        assert!(store
            .idle(Duration::from_secs(4))
            .contains(&Arc::<str>::from("a")));
        assert!(store.idle(Duration::from_secs(6)).is_empty());
        assert_eq!(touch_after(Duration::from_secs(4)), Duration::from_secs(1));
        assert_eq!(expire_after(Duration::from_secs(4)), Duration::from_secs(5));
    }

    /// One touch: the sessions and the throttle.
    type Touched = (Vec<(Arc<str>, String)>, Duration);

    /// The database's side of the reaper, as a test sets it.
    #[derive(Default)]
    struct FakeRecords {
        answers: Mutex<HashMap<String, Expiry>>,
        expired: Mutex<Vec<(String, String, Duration)>>,
        touched: Mutex<Vec<Touched>>,
        /// Streamed sessions the database says are gone.
        gone: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl SessionRecords for FakeRecords {
        async fn expire(&self, id: &str, token: &str, idle: Duration) -> Expiry {
            self.expired
                .lock()
                .unwrap()
                .push((id.into(), token.into(), idle));
            self.answers.lock().unwrap()[id].clone()
        }
        async fn touch(
            &self,
            sessions: &[(Arc<str>, String)],
            touch_after: Duration,
        ) -> Vec<Arc<str>> {
            self.touched
                .lock()
                .unwrap()
                .push((sessions.to_vec(), touch_after));
            let gone = self.gone.lock().unwrap();
            sessions
                .iter()
                .filter(|(id, _)| gone.iter().any(|g| g == &**id))
                .map(|(id, _)| id.clone())
                .collect()
        }
    }

    #[tokio::test]
    async fn the_reaper_ends_only_what_the_database_ended_and_keeps_streamed_sessions_alive() {
        let store = Arc::new(SessionStore::default());
        let metrics = SessionMetrics::new(&crate::metrics::Metrics::new());
        let fake = Arc::new(FakeRecords::default());
        let sessions =
            BoundSessions::new(store.clone(), metrics.clone(), |_| {}).with_records(fake.clone());
        let answers = [
            ("ended", Expiry::Ended),
            ("gone", Expiry::Gone),
            ("used", Expiry::Used(Duration::from_millis(10))),
            ("unverified", Expiry::Unverified),
            ("unavailable", Expiry::Unavailable),
            ("streamed", Expiry::Ended),
        ];
        for (id, answer) in answers {
            let mut r = SessionRecord::new(who("alice"));
            r.token = Some(format!("tok-{id}"));
            store.insert(id.into(), r);
            fake.answers.lock().unwrap().insert(id.into(), answer);
        }
        store.streams("streamed", 1);
        let idle = Duration::from_millis(40);
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert_eq!(sessions.reap(idle).await, 1);

        let touched = fake.touched.lock().unwrap().clone();
        assert_eq!(
            touched,
            vec![(
                vec![(Arc::<str>::from("streamed"), "tok-streamed".to_string())],
                Duration::from_millis(10)
            )]
        );
        let mut asked: Vec<_> = fake.expired.lock().unwrap().clone();
        asked.sort();
        assert_eq!(asked.len(), 5, "{asked:?}");
        assert!(asked
            .iter()
            .all(|(id, tok, after)| *tok == format!("tok-{id}")
                && *after == Duration::from_millis(50)));
        // Ended, gone and unverifiable sessions are dropped here; one used elsewhere and one the
        // database could not decide on stay, as does the streamed one.
        let mut left: Vec<_> = [
            "ended",
            "gone",
            "used",
            "unverified",
            "unavailable",
            "streamed",
        ]
        .into_iter()
        .filter(|id| store.get(id).is_some())
        .collect();
        left.sort();
        assert_eq!(left, vec!["streamed", "unavailable", "used"]);
        assert_eq!(metrics.expired.get(), 1, "only the one the database ended");
        // The one used elsewhere is due again only when it would be idle there.
        assert!(!store.idle(idle).contains(&Arc::<str>::from("used")));
    }

    #[tokio::test]
    async fn a_streamed_session_ended_elsewhere_is_closed_here_and_the_others_stay() {
        let store = Arc::new(SessionStore::default());
        let metrics = SessionMetrics::new(&crate::metrics::Metrics::new());
        let fake = Arc::new(FakeRecords::default());
        let closed = Arc::new(Mutex::new(Vec::new()));
        let seen = closed.clone();
        let sessions = BoundSessions::new(store.clone(), metrics.clone(), move |k| {
            seen.lock().unwrap().push(k.0.to_string())
        })
        .with_records(fake.clone());
        for id in ["kept", "ended-elsewhere"] {
            let mut r = SessionRecord::new(who("alice"));
            r.token = Some(format!("tok-{id}"));
            store.insert(id.into(), r);
            store.streams(id, 1);
        }
        fake.gone.lock().unwrap().push("ended-elsewhere".into());
        // Streamed sessions are never idle: nothing ends for idleness.
        assert_eq!(sessions.reap(Duration::from_secs(60)).await, 0);
        assert_eq!(*closed.lock().unwrap(), vec!["ended-elsewhere".to_string()]);
        assert!(store.get("ended-elsewhere").is_none());
        assert!(store.get("kept").is_some());
        assert_eq!(metrics.expired.get(), 0, "not an expiry here");
    }

    #[test]
    fn client_session_ids_are_long_random_and_printable() {
        let a = new_session_id();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, new_session_id());
    }
}
