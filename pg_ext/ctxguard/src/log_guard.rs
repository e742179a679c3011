//! What reaches the server log (SECURITY_MATRIX M.72). An `emit_log_hook`:
//! - redacts every token-shaped run from each message's text (message, detail, hint, context,
//!   internal query), whatever wrote it: PostgreSQL's bind-parameter context
//!   (`log_parameter_max_length_on_error`, which any session may set), a handler's error, ours;
//! - in a transaction where ctxguard saw a token, hides the context and the statement of every
//!   line it writes to the log (an error's, and a `LOG` line's too, such as ctxguard's own
//!   refusal lines, which `log_min_error_statement` ranks above `ERROR`) altogether: they may hold
//!   a page context or other caller text, whatever the session or its role's defaults set. The
//!   client still gets them.
//!
//! Installed only when preloaded (a library loaded later has no hook before its first call).

use std::cell::Cell;

use ctxguard_core::redact::{has_token, redact_tokens};
use pgrx::pg_sys;
use pgrx::prelude::*;

thread_local! {
    /// ctxguard handled a token in this transaction (cleared at its end).
    static SAW_TOKEN: Cell<bool> = const { Cell::new(false) };
}

static mut PREV_EMIT: pg_sys::emit_log_hook_type = None;

pub fn init() {
    unsafe {
        PREV_EMIT = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(emit);
        pg_sys::RegisterXactCallback(Some(at_transaction_end), std::ptr::null_mut());
    }
}

/// A function is about to handle a token (and maybe a page): errors of this transaction keep
/// their context and statement out of the log.
pub fn saw_token() {
    SAW_TOKEN.with(|s| s.set(true));
}

unsafe extern "C-unwind" fn at_transaction_end(
    event: pg_sys::XactEvent::Type,
    _arg: *mut std::ffi::c_void,
) {
    // PREPARE TRANSACTION ends the transaction in this backend as a commit does.
    if event == pg_sys::XactEvent::XACT_EVENT_COMMIT
        || event == pg_sys::XactEvent::XACT_EVENT_ABORT
        || event == pg_sys::XactEvent::XACT_EVENT_PREPARE
    {
        SAW_TOKEN.with(|s| s.set(false));
        crate::context::forget_parsed();
    }
}

/// Replace the palloc'd string `*field` with its redaction, if it holds a token.
unsafe fn redact(field: *mut *mut std::ffi::c_char) {
    unsafe {
        if (*field).is_null() {
            return;
        }
        let text = std::ffi::CStr::from_ptr(*field).to_string_lossy();
        if !has_token(&text) {
            return;
        }
        let clean = redact_tokens(&text).replace('\0', "");
        let c = std::ffi::CString::new(clean).unwrap_or_default();
        // In ErrorContext, where the other fields live; the old string is freed with it.
        let p = pg_sys::MemoryContextStrdup(pg_sys::ErrorContext, c.as_ptr());
        *field = p;
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn emit(edata: *mut pg_sys::ErrorData) {
    unsafe {
        let e = &mut *edata;
        if e.output_to_server {
            if SAW_TOKEN.with(Cell::get) {
                e.hide_ctx = true;
                e.hide_stmt = true;
            }
            for field in [
                &raw mut e.message,
                &raw mut e.detail,
                &raw mut e.detail_log,
                &raw mut e.hint,
                &raw mut e.context,
                &raw mut e.internalquery,
            ] {
                redact(field);
            }
            // The statement line prints the query text itself: hide it when it holds a token.
            let q = pg_sys::debug_query_string;
            if !q.is_null() && has_token(&std::ffi::CStr::from_ptr(q).to_string_lossy()) {
                e.hide_stmt = true;
            }
        }
        if let Some(prev) = PREV_EMIT {
            prev(edata);
        }
    }
}
