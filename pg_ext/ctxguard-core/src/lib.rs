//! Pure ctxguard logic, free of Postgres so it can be unit-tested and fuzzed alone.
//!
//! The extension crate (`pg_ext/ctxguard`) is a thin adapter: it reads settings and catalog rows,
//! calls into these modules, and maps their errors onto SQLSTATEs and envelope codes.
//!
//! - [`names`]: identifier and entity-id rules shared by every input.
//! - [`token`]: JWT verification (HS256 secret, JWKS keys, Ed25519 key) into an [`token::Identity`].
//! - [`jwks`]: JWKS documents parsed and checked once into usable keys.
//! - [`json`]: strict JSON (repeated members and deep nesting refused) for tokens, JWKS and
//!   page contexts read from text.
//! - [`claims`]: claim paths (`realm_access.roles`, `"https://acme.example/roles"`).
//! - [`page`]: the seed-000 page-context contract, validated against the page-type catalog.
//! - [`policy`]: tool policies (parse + contradiction checks) and their evaluation (Gate A/B).
//! - [`binding`]: entity binding of tool arguments and schema stripping.
//! - [`args`]: argument shape limits and JSON Schema validation with value-free messages.
//! - [`codes`]: the stable envelope error codes.
//! - [`ranking`]: which visible tools fill the model's top-k (the page's own first, upstream
//!   servers sharing what is left).
//! - [`namespaces`]: a tool's namespace, namespace names, `find_tools`' request limits.
//! - [`ledger`]: UTC days, keys, coverage bitmaps, slot tables and the audit chain of the ledger.
//! - [`tsrank`]: `ts_rank_cd` of a page for a query of words, from the datums, without the
//!   memory PostgreSQL zeroes per ranked page.

pub mod args;
pub mod binding;
pub mod claims;
pub mod codes;
pub mod docs;
pub mod json;
pub mod jwks;
pub mod ledger;
pub mod mask;
pub mod mcp;
pub mod names;
pub mod namespaces;
pub mod page;
pub mod policy;
pub mod ranking;
pub mod redact;
pub mod token;
pub mod tsrank;

pub use codes::Code;

/// `bytes` in lowercase hex (the audit chain's and the arguments' SHA-256, as PostgreSQL's
/// `encode(..., 'hex')` writes them).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(2 * bytes.len());
    for &b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    #[test]
    fn hex_is_lowercase_two_digits_a_byte() {
        assert_eq!(super::hex(&[0x00, 0x0f, 0xa5, 0xff]), "000fa5ff");
        assert_eq!(super::hex(&[]), "");
    }
}
