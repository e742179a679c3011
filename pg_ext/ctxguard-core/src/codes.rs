//! Stable error codes returned in `call_tool` envelopes. One table; never renumbered or renamed.

use std::fmt;

/// Envelope error codes of Gate B (`ctxguard.call_tool`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// No verified context is set in this transaction.
    ContextMissing,
    /// The tool does not exist or has no policy (indistinguishable on purpose).
    ToolNotFound,
    /// The tool exists but the current context does not allow it.
    ToolNotVisible,
    /// Arguments are malformed, oversize, or fail the tool's JSON Schema.
    InvalidArgument,
    /// The bound entity argument differs from the context entity.
    EntityMismatch,
    /// The tool needs a human approval; a pending approval was recorded.
    ApprovalRequired,
    /// The handler raised an error; its effects were rolled back.
    ToolError,
    /// `approve_call` found no pending, unexpired approval for this user (unknown, used or foreign).
    ApprovalInvalid,
    /// A document (or other object) does not exist *or* is not visible here (indistinguishable).
    NotFound,
    /// The document exists but is still processing (or failed processing).
    DocumentNotReady,
    /// A budget or limit would be exceeded; the message names the limit. Nothing was read.
    RateLimitExceeded,
    /// The result holds more text than masking may process (`ctxguard.max_mask_bytes`): refused,
    /// never returned unmasked. The message names the limit.
    ResultTooLarge,
    /// The call cannot be audited now (no audit writer, its queue or the shared-memory ledger is
    /// full): refused before any handler ran. Retry later.
    AuditUnavailable,
    /// The tenant or user holds its share of a ledger table that every tenant shares
    /// (`ctxguard.ledger_tenant_share`, `ctxguard.ledger_user_share`), or the table is full:
    /// refused, nothing was read or run. The message names the table's setting. Other tenants
    /// are not affected; retry once entries expire.
    CapacityExceeded,
    /// A condition of the tool's policy (`when`, or an `approval_when` that could not be
    /// evaluated) refused the call; the message names the condition, never argument values.
    PolicyDenied,
    /// The upstream server needs the user's own connection (`user_oauth`) and the user has none,
    /// or it was revoked or could not be refreshed: connect, then retry. Nothing was forwarded.
    ConnectionRequired,
}

impl Code {
    pub const ALL: [Code; 16] = [
        Code::ContextMissing,
        Code::ToolNotFound,
        Code::ToolNotVisible,
        Code::InvalidArgument,
        Code::EntityMismatch,
        Code::ApprovalRequired,
        Code::ToolError,
        Code::ApprovalInvalid,
        Code::NotFound,
        Code::DocumentNotReady,
        Code::RateLimitExceeded,
        Code::ResultTooLarge,
        Code::AuditUnavailable,
        Code::CapacityExceeded,
        Code::PolicyDenied,
        Code::ConnectionRequired,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Code::ContextMissing => "CONTEXT_MISSING",
            Code::ToolNotFound => "TOOL_NOT_FOUND",
            Code::ToolNotVisible => "TOOL_NOT_VISIBLE",
            Code::InvalidArgument => "INVALID_ARGUMENT",
            Code::EntityMismatch => "ENTITY_MISMATCH",
            Code::ApprovalRequired => "APPROVAL_REQUIRED",
            Code::ToolError => "TOOL_ERROR",
            Code::ApprovalInvalid => "APPROVAL_INVALID",
            Code::NotFound => "NOT_FOUND",
            Code::DocumentNotReady => "DOCUMENT_NOT_READY",
            Code::RateLimitExceeded => "RATE_LIMIT_EXCEEDED",
            Code::ResultTooLarge => "RESULT_TOO_LARGE",
            Code::AuditUnavailable => "AUDIT_UNAVAILABLE",
            Code::CapacityExceeded => "CAPACITY_EXCEEDED",
            Code::PolicyDenied => "POLICY_DENIED",
            Code::ConnectionRequired => "CONNECTION_REQUIRED",
        }
    }
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_screaming_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for c in Code::ALL {
            assert!(seen.insert(c.as_str()));
            assert!(c
                .as_str()
                .chars()
                .all(|ch| ch.is_ascii_uppercase() || ch == '_'));
        }
    }
}
