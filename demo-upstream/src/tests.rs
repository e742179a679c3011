//! The whole server on a loopback port, driven over HTTP as the gateway drives it: the sign-in
//! form, the token endpoint, and MCP through rmcp's Streamable HTTP client (the gateway's own).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use rmcp::model::CallToolRequestParams;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::ServiceExt;
use serde_json::Value;

use super::*;

const REDIRECT: &str = "http://127.0.0.1:9/v1/connections/callback";

async fn start() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let app = Arc::new(App {
        auth: Server::new(auth::Config {
            issuer: base.clone(),
            client_id: "ctxguard-demo".into(),
            redirect_uri: REDIRECT.into(),
            resource: format!("{base}/mcp"),
            access_ttl: Duration::from_secs(600),
            refresh_ttl: Duration::from_secs(3600),
            code_ttl: Duration::from_secs(60),
        }),
        resource_metadata: format!("{base}/.well-known/oauth-protected-resource/mcp"),
        csp: HeaderValue::from_static("default-src 'none'"),
    });
    tokio::spawn(async move { axum::serve(listener, router(app)).await });
    base
}

fn http() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `k=v&…`, form-encoded.
fn encoded<K: AsRef<str>, V: AsRef<str>>(pairs: &[(K, V)]) -> String {
    let mut out = url::form_urlencoded::Serializer::new(String::new());
    for (k, v) in pairs {
        out.append_pair(k.as_ref(), v.as_ref());
    }
    out.finish()
}

/// A form POST.
async fn post_form<K: AsRef<str>, V: AsRef<str>>(
    c: &reqwest::Client,
    url: &str,
    pairs: &[(K, V)],
) -> reqwest::Response {
    c.post(url)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(encoded(pairs))
        .send()
        .await
        .unwrap()
}

/// A GET with a query.
async fn get_query<K: AsRef<str>, V: AsRef<str>>(
    c: &reqwest::Client,
    url: &str,
    pairs: &[(K, V)],
) -> reqwest::Response {
    c.get(format!("{url}?{}", encoded(pairs)))
        .send()
        .await
        .unwrap()
}

fn query_of(location: &str) -> HashMap<String, String> {
    url::Url::parse(location)
        .unwrap()
        .query_pairs()
        .into_owned()
        .collect()
}

/// Sign in as `user` and allow: the access and refresh tokens the gateway would store.
async fn connect(base: &str, user: &str) -> (String, String) {
    let c = http();
    let meta: Value = c
        .get(format!("{base}/.well-known/oauth-authorization-server"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(meta["issuer"], base);
    assert_eq!(meta["code_challenge_methods_supported"][0], "S256");
    let verifier = auth::random_token();
    let mut params = vec![
        ("response_type", "code".to_string()),
        ("client_id", "ctxguard-demo".into()),
        ("redirect_uri", REDIRECT.into()),
        ("state", "state-123".into()),
        ("code_challenge", auth::s256(&verifier)),
        ("code_challenge_method", "S256".into()),
        ("scope", auth::SCOPE.into()),
        ("resource", format!("{base}/mcp")),
    ];
    let page = get_query(
        &c,
        meta["authorization_endpoint"].as_str().unwrap(),
        &params,
    )
    .await;
    assert_eq!(page.status(), 200);
    assert!(page.headers()[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .is_ok());
    let body = page.text().await.unwrap();
    assert!(body.contains("Sign in to Demo Notes as"), "{body}");
    assert!(body.contains("value=\"state-123\""), "{body}");
    params.push(("user", user.into()));
    params.push(("decision", "allow".into()));
    let back = post_form(&c, &format!("{base}/authorize"), &params).await;
    assert_eq!(back.status(), 303);
    let location = back.headers()[header::LOCATION]
        .to_str()
        .unwrap()
        .to_string();
    assert!(location.starts_with(REDIRECT), "{location}");
    let q = query_of(&location);
    assert_eq!(q["state"], "state-123");
    assert_eq!(q["iss"], base);
    let resource = format!("{base}/mcp");
    let form = [
        ("grant_type", "authorization_code"),
        ("code", &q["code"]),
        ("code_verifier", &verifier),
        ("redirect_uri", REDIRECT),
        ("client_id", "ctxguard-demo"),
        ("resource", &resource),
    ];
    let tokens: Value = post_form(&c, meta["token_endpoint"].as_str().unwrap(), &form)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(tokens["token_type"], "Bearer");
    assert_eq!(tokens["expires_in"], 600);
    (
        tokens["access_token"].as_str().unwrap().to_string(),
        tokens["refresh_token"].as_str().unwrap().to_string(),
    )
}

/// A tool's text through rmcp's client with `token` as the bearer token.
async fn call(base: &str, token: &str, tool: &str) -> Result<(String, Value), String> {
    let config =
        StreamableHttpClientTransportConfig::with_uri(format!("{base}/mcp")).auth_header(token);
    let client =
        ().serve(StreamableHttpClientTransport::from_config(config))
            .await
            .map_err(|e| e.to_string())?;
    let tools = client.list_all_tools().await.map_err(|e| e.to_string())?;
    assert_eq!(
        serde_json::to_value(&tools).unwrap(),
        serde_json::to_value(notes::tools()).unwrap(),
        "tools/list is what --print-tools prints"
    );
    let r = client
        .call_tool(CallToolRequestParams::new(tool.to_string()))
        .await
        .map_err(|e| e.to_string())?;
    let r = serde_json::to_value(r).unwrap();
    Ok((
        r["content"][0]["text"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        r,
    ))
}

#[tokio::test]
async fn each_token_gets_its_own_users_notes_and_nothing_without_one() {
    let base = start().await;
    let c = http();
    // No token, or one this server did not issue: 401 naming the resource metadata.
    for auth in [None, Some("Bearer not-a-token")] {
        let mut req = c
            .post(format!("{base}/mcp"))
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(r#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#);
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        let r = req.send().await.unwrap();
        assert_eq!(r.status(), 401);
        let challenge = r.headers()[header::WWW_AUTHENTICATE]
            .to_str()
            .unwrap()
            .to_string();
        assert!(
            challenge.contains(&format!(
                "resource_metadata=\"{base}/.well-known/oauth-protected-resource/mcp\""
            )),
            "{challenge}"
        );
    }
    let prm: Value = c
        .get(format!("{base}/.well-known/oauth-protected-resource/mcp"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(prm["authorization_servers"][0], base);
    assert_eq!(prm["resource"], format!("{base}/mcp"));

    let (alice, alice_refresh) = connect(&base, "alice").await;
    let (carol, _) = connect(&base, "carol").await;
    let (text, r) = call(&base, &alice, "my_notes").await.unwrap();
    assert!(
        text.starts_with("Notes of alice (3 in Demo Notes)"),
        "{text}"
    );
    assert!(
        text.contains("Contoso Paper") && !text.contains("Globex"),
        "{text}"
    );
    assert_eq!(r["structuredContent"]["user"], "alice");
    let (text, _) = call(&base, &carol, "my_notes").await.unwrap();
    assert!(
        text.contains("Globex offsite") && !text.contains("Contoso"),
        "{text}"
    );
    let (text, _) = call(&base, &carol, "whoami").await.unwrap();
    assert_eq!(text, "You are signed in to Demo Notes as carol (Carol).");

    // Revoking alice's refresh token ends her access token; carol's still works.
    let form = [
        ("token", alice_refresh.as_str()),
        ("token_type_hint", "refresh_token"),
        ("client_id", "ctxguard-demo"),
    ];
    let r = post_form(&c, &format!("{base}/revoke"), &form).await;
    assert_eq!(r.status(), 200);
    assert!(call(&base, &alice, "whoami").await.is_err());
    assert!(call(&base, &carol, "whoami").await.is_ok());
}

#[tokio::test]
async fn the_sign_in_page_refuses_other_redirect_uris_and_sends_denials_back() {
    let base = start().await;
    let c = http();
    let challenge = auth::s256(&auth::random_token());
    let mut params = vec![
        ("response_type", "code"),
        ("client_id", "ctxguard-demo"),
        ("redirect_uri", "http://127.0.0.1:9/elsewhere"),
        ("state", "s"),
        ("code_challenge", &challenge),
        ("code_challenge_method", "S256"),
    ];
    let r = get_query(&c, &format!("{base}/authorize"), &params).await;
    assert_eq!(r.status(), 400, "no redirect to an unregistered URI");
    assert!(r.headers().get(header::LOCATION).is_none());
    params[2].1 = REDIRECT;
    // Without PKCE: back to the client with the error and the state.
    let without: Vec<_> = params
        .iter()
        .filter(|(k, _)| !k.starts_with("code_challenge"))
        .copied()
        .collect();
    let r = get_query(&c, &format!("{base}/authorize"), &without).await;
    assert_eq!(r.status(), 303);
    let q = query_of(r.headers()[header::LOCATION].to_str().unwrap());
    assert_eq!(
        (q["error"].as_str(), q["state"].as_str()),
        ("invalid_request", "s")
    );
    // Deny.
    params.extend([("user", "alice"), ("decision", "deny")]);
    let r = post_form(&c, &format!("{base}/authorize"), &params).await;
    assert_eq!(r.status(), 303);
    let q = query_of(r.headers()[header::LOCATION].to_str().unwrap());
    assert_eq!(q["error"], "access_denied");
    assert!(!q.contains_key("code"));
    // The token endpoint's errors are OAuth's.
    let form = [
        ("grant_type", "authorization_code"),
        ("code", "nope"),
        ("code_verifier", "x"),
        ("client_id", "ctxguard-demo"),
    ];
    let r = post_form(&c, &format!("{base}/token"), &form).await;
    assert_eq!(r.status(), 400);
    assert_eq!(r.json::<Value>().await.unwrap()["error"], "invalid_grant");
}
