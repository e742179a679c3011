//! The ledger writer brings counters it persisted ahead of their calls (large quotas' windows, users'
//! days) down to their exact counts; each table on its own (issue 34). A table the writer cannot
//! update that way (here a DBA's trigger refusing to lower a user's day) keeps its own rows ahead
//! (they refuse early, never late) and must not hold back the other table's exact counts.
//!
//! Needs `CTXGUARD_TEST_DATABASE_URL`, `CTXGUARD_TEST_ADMIN_URL` and `CTXGUARD_TEST_JWT_SECRET`
//! (`scripts/test.sh` provides them) and the fixtures' `quota_lab` page. Its own binary: the trigger
//! it adds for a while sends every user's day through the writer's statement.

mod support;

use std::thread;
use std::time::{Duration, Instant};

use postgres::{Client, NoTls};
use serde_json::{json, Value};
use support::{env, token};

fn call(c: &mut Client, tok: &str, tool: &str) -> Value {
    support::call_in_transaction(c, tok, &json!({"pageType": "quota_lab"}), tool, true)
}

#[test]
fn a_day_the_writer_cannot_lower_does_not_hold_back_a_quotas_exact_count() {
    let mut a = Client::connect(&env("CTXGUARD_TEST_ADMIN_URL"), NoTls).unwrap();
    let tenant = format!("flush-{}", &uuid::Uuid::new_v4().simple().to_string()[..12]);
    a.batch_execute(&format!(
        "SELECT ctxguard.register_tool('flush.large', 'Ping, with a large quota.', '{{\"type\": \"object\"}}',
                't.quota_ping(jsonb)',
                '{{\"page_types\": [\"quota_lab\"], \"run_as\": \"ctxguard_tools\", \"rate_limit\": {{\"per\": \"user\", \"calls\": 6400, \"window\": \"1h\"}}}}');
         CREATE OR REPLACE FUNCTION public.flush_refuse_lowering() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
             IF NEW.bytes < OLD.bytes THEN RAISE EXCEPTION 'a DBA refuses to lower a day'; END IF;
             RETURN NEW;
         END $$;
         CREATE TRIGGER flush_refuse_lowering BEFORE UPDATE ON ctxguard.user_day_usage
             FOR EACH ROW WHEN (OLD.tenant_id = '{tenant}') EXECUTE FUNCTION public.flush_refuse_lowering();"
    ))
    .unwrap();
    let mut c = Client::connect(&env("CTXGUARD_TEST_DATABASE_URL"), NoTls).unwrap();
    let tok = token("flush-user", &tenant, &[]);
    for _ in 0..3 {
        let v = call(&mut c, &tok, "flush.large");
        assert_eq!(v["status"], "ok", "{v}");
    }
    let read = |a: &mut Client| -> (i32, i64, i64) {
        let r = a
            .query_one(
                "SELECT (SELECT coalesce(max(calls), 0) FROM ctxguard.quota_usage
                          WHERE tenant_id = $1 AND tool = 'flush.large'),
                        (SELECT coalesce(sum(bytes), 0)::int8 FROM ctxguard.user_day_usage WHERE tenant_id = $1),
                        (SELECT coalesce(sum(result_bytes), 0)::int8 FROM ctxguard.audit_log WHERE tenant_id = $1)",
                &[&tenant],
            )
            .unwrap();
        (r.get(0), r.get(1), r.get(2))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    let (quota, day, audited) = loop {
        let (quota, day, audited) = read(&mut a);
        if quota == 3 || Instant::now() >= deadline {
            break (quota, day, audited);
        }
        thread::sleep(Duration::from_millis(50));
    };
    a.batch_execute(
        "DROP TRIGGER flush_refuse_lowering ON ctxguard.user_day_usage;
         DROP FUNCTION public.flush_refuse_lowering();",
    )
    .unwrap();
    assert_eq!(
        quota, 3,
        "the quota's exact count follows though the day's cannot be written"
    );
    assert!(
        day > audited,
        "the day the writer cannot lower stays ahead ({day} bytes for {audited} audited): it refuses early, never late"
    );
}
