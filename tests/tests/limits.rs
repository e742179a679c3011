//! HTTP limits against the real gateway on a real socket: slow-header, slow-body and idle clients
//! are cut off within the configured timeouts while normal requests are served; connections beyond
//! the cap are refused at once; one user's open event streams are capped. All counted in /metrics.

mod support;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use serde_json::json;
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Send `bytes` one at a time, `every` apart, until the gateway closes the connection. Returns how
/// long the connection lasted, or `None` if everything was sent and the gateway did not close it.
async fn trickle(addr: SocketAddr, bytes: &[u8], every: Duration) -> Option<Duration> {
    let stream = TcpStream::connect(addr).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let started = Instant::now();
    let closed = tokio::spawn(async move {
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => return started.elapsed(),
                Ok(_) => {}
            }
        }
    });
    for b in bytes {
        if closed.is_finished() || wr.write_all(&[*b]).await.is_err() {
            break;
        }
        tokio::time::sleep(every).await;
    }
    match tokio::time::timeout(Duration::from_secs(5), closed).await {
        Ok(Ok(lasted)) => Some(lasted),
        _ => None,
    }
}

async fn metric(addr: SocketAddr, line_start: &str) -> u64 {
    let text = http()
        .get(format!("http://{addr}/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(line_start))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {line_start} in /metrics"))
}

/// Normal requests, one every 100 ms for `how_long`: each must succeed.
async fn keep_serving(addr: SocketAddr, how_long: Duration) -> usize {
    let until = Instant::now() + how_long;
    let mut served = 0;
    while Instant::now() < until {
        let r = http()
            .get(format!("http://{addr}/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        served += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    served
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trickles_its_headers_is_cut_off_while_others_are_served() {
    let gw = gateway(&[
        "--http-header-timeout-ms",
        "800",
        "--http-idle-timeout-ms",
        "5000",
    ])
    .await;
    // One header byte every 150 ms: the head would take 5 s; the gateway allows 0.8 s.
    let head = b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: yes\r\n\r\n";
    let slow = tokio::spawn(trickle(gw, head, Duration::from_millis(150)));
    // Normal requests are served while the slow client is still connected (an event, not a count
    // per time window: a loaded machine serves fewer, but it must serve them).
    let mut served_meanwhile = 0;
    while !slow.is_finished() {
        let r = http()
            .get(format!("http://{gw}/health"))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        if !slow.is_finished() {
            served_meanwhile += 1;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let lasted = slow
        .await
        .unwrap()
        .expect("the slow client was never cut off");
    assert!(
        lasted >= Duration::from_millis(500) && lasted < Duration::from_millis(2500),
        "{lasted:?}"
    );
    assert!(
        served_meanwhile >= 1,
        "normal requests were served while the slow client was connected"
    );
    // A client that sends nothing at all is held no longer.
    let lasted = trickle(gw, b"", Duration::ZERO).await.expect("never cut");
    assert!(lasted < Duration::from_millis(2500), "{lasted:?}");
    assert!(metric(gw, "ctxguard_http_timeouts_total{phase=\"header\"}").await >= 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_trickles_its_body_is_cut_off() {
    let gw = gateway(&["--http-body-timeout-ms", "800"]).await;
    let mut request = b"POST /v1/tools HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n".to_vec();
    let head_len = request.len();
    request.extend(std::iter::repeat_n(b' ', 200));
    // The head goes at once; then one body byte every 100 ms (20 s for the body).
    let stream = TcpStream::connect(gw).await.unwrap();
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(&request[..head_len]).await.unwrap();
    let started = Instant::now();
    let writer = tokio::spawn(async move {
        for b in &request[head_len..] {
            if wr.write_all(&[*b]).await.is_err() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
    let mut buf = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), rd.read_to_end(&mut buf)).await;
    let lasted = started.elapsed();
    writer.abort();
    assert!(
        lasted >= Duration::from_millis(600) && lasted < Duration::from_millis(2500),
        "{lasted:?}"
    );
    assert!(
        !String::from_utf8_lossy(&buf).contains("200 OK"),
        "no answer for a body that never came"
    );
    let served = keep_serving(gw, Duration::from_millis(300)).await;
    assert!(served >= 1);
    assert!(metric(gw, "ctxguard_http_timeouts_total{phase=\"body\"}").await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_kept_alive_connection_is_closed() {
    let gw = gateway(&["--http-idle-timeout-ms", "700"]).await;
    let mut stream = TcpStream::connect(gw).await.unwrap();
    stream
        .write_all(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 1024];
    let n = stream.read(&mut buf).await.unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    // The response is complete; the connection is kept alive, then closed once idle too long.
    let started = Instant::now();
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf))
        .await
        .expect("the idle connection was never closed")
        .unwrap_or(0);
    assert_eq!(n, 0);
    let lasted = started.elapsed();
    assert!(
        lasted >= Duration::from_millis(600) && lasted < Duration::from_millis(2000),
        "{lasted:?}"
    );
    assert!(metric(gw, "ctxguard_http_timeouts_total{phase=\"idle\"}").await >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_refused_at_once() {
    let gw = gateway(&["--http-max-connections", "3"]).await;
    let held: Vec<TcpStream> = futures::future::join_all((0..3).map(|_| TcpStream::connect(gw)))
        .await
        .into_iter()
        .map(Result::unwrap)
        .collect();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let mut extra = TcpStream::connect(gw).await.unwrap();
    let mut buf = Vec::new();
    // "At once" means before any of the gateway's timeouts (the header timeout is 10 s here): a
    // bound far from the machine's speed, so a loaded machine cannot make this flaky.
    let _ = tokio::time::timeout(Duration::from_secs(8), extra.read_to_end(&mut buf)).await;
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refused at once, not after a timeout: {:?}",
        started.elapsed()
    );
    let text = String::from_utf8_lossy(&buf);
    assert!(
        text.is_empty()
            || (text.starts_with("HTTP/1.1 503") && text.contains("TOO_MANY_CONNECTIONS")),
        "{text}"
    );
    // Once one closes, the gateway serves again, and it counted the refusal.
    drop(held);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(
        metric(
            gw,
            "ctxguard_http_refused_total{reason=\"max_connections\"}"
        )
        .await
            >= 1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_user_holds_at_most_the_configured_event_streams() {
    // The first streamed turn waits on the model for 2 s; meanwhile the same user's second
    // stream is refused, another user's is not, and once the first ends the user may stream again.
    let mock = Mock::new(vec![Step::Sleep(Duration::from_secs(2))]);
    let gw = openai_gateway(&mock, &["--http-max-streams-per-user", "1"]).await;
    let stream_chat = |sub: &'static str| async move {
        http()
            .post(format!("http://{gw}/v1/chat"))
            .bearer_auth(token(sub, "acme", &["ap_clerk"]))
            .header("accept", "text/event-stream")
            .json(&json!({"message": "list vendors", "pageContext": {"pageType": "vendor_table"}}))
            .send()
            .await
            .unwrap()
    };
    let first = stream_chat("alice").await;
    assert_eq!(first.status(), 200);
    let second = stream_chat("alice").await;
    assert_eq!(second.status(), 429);
    let body: serde_json::Value = second.json().await.unwrap();
    assert_eq!(body["error"]["code"], "TOO_MANY_STREAMS");
    let other = stream_chat("bob").await;
    assert_eq!(other.status(), 200, "streams are counted per user");
    let _ = first.text().await.unwrap();
    let _ = other.text().await.unwrap();
    let again = stream_chat("alice").await;
    assert_eq!(again.status(), 200, "a finished stream frees its slot");
    let _ = again.text().await.unwrap();
    assert!(
        metric(
            gw,
            "ctxguard_http_refused_total{reason=\"streams_per_user\"}"
        )
        .await
            >= 1
    );
}
