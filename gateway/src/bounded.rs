//! Bounded reads of HTTP bodies from peers the gateway does not control (model endpoints,
//! embedding endpoints, authorization servers): a body past its limit is refused without being
//! buffered, whether its length is declared or it only streams.
//!
//! A floor file: it uses no other room; `llm`, `catalog` and `upstream` read their peers' bodies
//! through it.

use futures::StreamExt;

/// Why a body was not read.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the response is too large")]
    TooLarge,
    #[error("the response could not be read")]
    Transport,
    #[error("the response did not arrive in time")]
    Timeout,
}

/// `resp`'s body, at most `max` bytes: a declared length past it is refused before any byte is
/// read, and a streamed body as soon as it passes it.
pub async fn body(resp: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    if resp
        .content_length()
        .is_some_and(|n| usize::try_from(n).map_or(true, |n| n > max))
    {
        return Err(BodyError::TooLarge);
    }
    let mut body = Vec::new();
    let mut chunks = std::pin::pin!(resp.bytes_stream());
    while let Some(chunk) = chunks.next().await {
        let chunk = chunk.map_err(|e| {
            if e.is_timeout() {
                BodyError::Timeout
            } else {
                BodyError::Transport
            }
        })?;
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}
