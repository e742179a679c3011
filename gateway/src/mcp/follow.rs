//! Page changes made through other gateways: one listening connection (`LISTEN ctxguard_pages`),
//! reconnecting, whose notifications tell this gateway's MCP listeners ([`PageHub`]) to re-list.

use std::sync::Arc;
use std::time::Duration;

use super::PageHub;
use crate::services::Services;

/// `LISTEN` (`sql::LISTEN_PAGES`), in a pinned transaction like everything the gateway sends (it
/// takes effect at its commit).
fn listen_statement() -> String {
    format!(
        "{}; {}; {}",
        crate::db::sql::begin(
            crate::db::sql::Access::ReadWrite,
            crate::config::database::Commit::Durable,
            &crate::config::database::Limits::default()
        ),
        crate::db::sql::LISTEN_PAGES,
        crate::db::sql::COMMIT
    )
}

/// Where the gateway's one listening connection goes: `CTXGUARD_NOTIFY_DATABASE_URL`, else the
/// database URL when it reaches PostgreSQL itself. Never through a transaction-mode pooler: a
/// `LISTEN` there stays on a server connection that other clients then get.
pub async fn notify_url(state: &Services) -> Option<String> {
    if let Some(url) = state.config.notify_url() {
        return Some(url.to_string());
    }
    if state.db.unnamed().await {
        tracing::warn!(
            "the database URL does not reach PostgreSQL directly (a pooler?): set \
             CTXGUARD_NOTIFY_DATABASE_URL so that page changes made through other gateways reach \
             this one's MCP sessions"
        );
        return None;
    }
    Some(state.config.database_url.clone())
}

/// Follow page changes of every gateway (started by `serve` once the first MCP session or
/// subscription registers): `LISTEN ctxguard_pages` on a connection of its own,
/// reconnecting (100 ms doubling to 2 s) when it is lost. After a reconnect every local listener
/// is told to re-list (a change made while nobody listened is not missed; the pages themselves are
/// read from the database on every request, so nothing cached goes stale).
pub async fn follow(url: String, hub: Arc<PageHub>) {
    let mut connected_before = false;
    let mut backoff = Duration::from_millis(100);
    loop {
        match listen_once(&url, &hub, &mut connected_before).await {
            Ok(()) => backoff = Duration::from_millis(100),
            Err(e) => tracing::warn!(error = %e, "page notifications: connection lost or refused"),
        }
        hub.set_following(false);
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(Duration::from_secs(2));
    }
}

async fn listen_once(
    url: &str,
    hub: &Arc<PageHub>,
    connected_before: &mut bool,
) -> Result<(), String> {
    use futures::StreamExt;
    let (client, mut conn) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| e.to_string())?;
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let driver = tokio::spawn(async move {
        let mut messages = futures::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(m) = messages.next().await {
            match m {
                Ok(tokio_postgres::AsyncMessage::Notification(n)) => {
                    if tx.send(n.payload().to_string()).is_err() {
                        break;
                    }
                }
                Ok(_) => {}
                Err(e) => return Err(e.to_string()),
            }
        }
        Ok(())
    });
    client
        .batch_execute(&listen_statement())
        .await
        .map_err(|e| e.to_string())?;
    hub.set_following(true);
    if *connected_before {
        tracing::info!("page notifications: listening again; every MCP session is told to re-list");
        hub.resync();
    }
    *connected_before = true;
    while let Some(key) = rx.recv().await {
        hub.changed(&key);
    }
    drop(client);
    driver
        .await
        .map_err(|e| e.to_string())?
        .and(Err("the listening connection ended".to_string()))
}
