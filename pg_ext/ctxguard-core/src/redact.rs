//! Bearer tokens out of the server log. PostgreSQL itself writes a statement's text and bind
//! parameters to the log on some paths a session controls (`log_parameter_max_length_on_error`,
//! role defaults); the extension's `emit_log_hook` passes every message's text through
//! [`redact_tokens`] so that no compact JWS or JWE (`eyJ…` segments joined by dots) survives.

use std::borrow::Cow;
use std::sync::LazyLock;

use regex::Regex;

/// A compact JWS (3 segments) or JWE (5): the first segment is base64url of a JSON object, so it
/// starts `eyJ` (`{"`); the others may be empty (unsigned, or JWE's empty key). Also a token cut
/// short (`log_parameter_max_length_on_error` keeps a parameter's first bytes): its header, or its
/// header and part of its claims, with fewer dots; so any `eyJ` run of at least 8 more characters,
/// with whatever segments follow it.
static TOKEN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"eyJ(?:[A-Za-z0-9_-]{8,}(?:\.[A-Za-z0-9_-]*){0,4}|[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*){2,4})")
        .expect("token pattern")
});

/// What replaces a token in the log.
pub const REDACTED: &str = "[token redacted by ctxguard]";

/// `text` with every token-shaped run replaced by [`REDACTED`] (borrowed when there is none).
pub fn redact_tokens(text: &str) -> Cow<'_, str> {
    if !text.contains("eyJ") {
        return Cow::Borrowed(text);
    }
    TOKEN.replace_all(text, REDACTED)
}

/// Does `text` hold a token?
pub fn has_token(text: &str) -> bool {
    text.contains("eyJ") && TOKEN.is_match(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_in_log_lines_are_redacted() {
        let jws = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2lnbmF0dXJl";
        let line = format!("extended query \"x\" with parameters: $1 = '{jws}', $2 = '{{}}'");
        let out = redact_tokens(&line);
        assert!(!out.contains("eyJ"), "{out}");
        assert!(out.contains(REDACTED) && out.contains("$2 = '{}'"));
        // Unsigned (empty signature), JWE (five segments), several in one line.
        for t in [
            "eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0.",
            "eyJhbGciOiJSU0EtT0FFUCJ9.a.b.c.d",
            "eyJ9.eyJ9.x and eyJ9.eyJ9.y",
        ] {
            assert!(!redact_tokens(t).contains("eyJ"), "{t}");
            assert!(has_token(t));
        }
        // A token cut short: its header, or its header and part of its claims.
        for t in [
            "$1 = 'eyJhbGciOiJIUzI1NiJ9...'",
            "$1 = 'eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSIsInRlbmFu...'",
        ] {
            assert!(!redact_tokens(t).contains("eyJ"), "{t}");
            assert!(has_token(t));
        }
        // Text without a token is left as it is, and not copied.
        assert!(matches!(redact_tokens("SELECT 1"), Cow::Borrowed(_)));
        assert!(!has_token("eyJ alone, no dots"));
    }
}
