//! One login role per gateway instance (docs/deploy.md, issue 29): `ctxguard_gateway` and
//! `ctxguard_gateway_b`, members of the NOLOGIN group `ctxguard_gateways` (sql/demo/schema.sql).
//! PostgreSQL lets a role cancel and terminate the backends of roles it has the privileges of, its
//! own included: so a gateway can signal its own backends, and with a role of its own per instance,
//! never another gateway's.

mod support;

use support::*;

fn url_as(role: &str) -> String {
    env("CTXGUARD_TEST_DATABASE_URL").replace("user=ctxguard_gateway", &format!("user={role}"))
}

async fn pid(c: &tokio_postgres::Client) -> i32 {
    c.query_one("SELECT pg_catalog.pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0)
}

/// `SELECT pg_catalog.<f>(pid)` as `c`: Ok(true) when signalled, else the SQLSTATE.
async fn signal(c: &tokio_postgres::Client, f: &str, pid: i32) -> Result<bool, String> {
    c.query_one(&format!("SELECT pg_catalog.{f}($1)"), &[&pid])
        .await
        .map(|r| r.get(0))
        .map_err(|e| {
            e.as_db_error()
                .map(|d| format!("{} {}", d.code().code(), d.message()))
                .unwrap_or_else(|| e.to_string())
        })
}

async fn alive(pid: i32) -> bool {
    admin()
        .await
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_stat_activity WHERE pid = $1",
            &[&pid],
        )
        .await
        .unwrap()
        .get::<_, i64>(0)
        == 1
}

#[tokio::test]
async fn the_gateway_roles_are_members_of_one_group_and_log_in_on_their_own() {
    let rows = admin()
        .await
        .query(
            "SELECT r.rolname, r.rolcanlogin, r.rolsuper, r.rolbypassrls,
                    pg_catalog.pg_has_role(r.oid, 'ctxguard_gateways', 'MEMBER'),
                    pg_catalog.pg_has_role(r.oid, 'pg_signal_backend', 'MEMBER')
               FROM pg_catalog.pg_roles r
              WHERE r.rolname IN ('ctxguard_gateway', 'ctxguard_gateway_b', 'ctxguard_gateways')
              ORDER BY r.rolname",
            &[],
        )
        .await
        .unwrap();
    let got: Vec<(String, bool, bool, bool, bool, bool)> = rows
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4), r.get(5)))
        .collect();
    assert_eq!(
        got,
        vec![
            ("ctxguard_gateway".into(), true, false, false, true, false),
            ("ctxguard_gateway_b".into(), true, false, false, true, false),
            ("ctxguard_gateways".into(), false, false, false, true, false),
        ]
    );
}

#[tokio::test]
async fn a_gateway_role_can_signal_its_own_backends_and_not_another_gateways() {
    let a1 = connect_as(&url_as("ctxguard_gateway")).await;
    let a2 = connect_as(&url_as("ctxguard_gateway")).await;
    let b1 = connect_as(&url_as("ctxguard_gateway_b")).await;
    let b2 = connect_as(&url_as("ctxguard_gateway_b")).await;
    let (pa2, pb1, pb2) = (pid(&a2).await, pid(&b1).await, pid(&b2).await);

    // Another gateway's backends: refused both ways, also after SET ROLE to the shared group.
    for (c, target) in [(&a1, pb1), (&b1, pa2)] {
        for f in ["pg_cancel_backend", "pg_terminate_backend"] {
            let r = signal(c, f, target).await;
            assert!(
                matches!(&r, Err(e) if e.starts_with("42501")),
                "{f}({target}) from another gateway's role: {r:?}"
            );
        }
    }
    a1.batch_execute("SET ROLE ctxguard_gateways")
        .await
        .unwrap();
    for f in ["pg_cancel_backend", "pg_terminate_backend"] {
        let r = signal(&a1, f, pb1).await;
        assert!(
            matches!(&r, Err(e) if e.starts_with("42501")),
            "{f} as the group: {r:?}"
        );
    }
    a1.batch_execute("RESET ROLE").await.unwrap();
    assert!(alive(pb1).await && alive(pa2).await);

    // Its own role's backends: allowed (which is why the roles must be one per gateway).
    assert_eq!(signal(&a1, "pg_cancel_backend", pa2).await, Ok(true));
    assert_eq!(signal(&b1, "pg_cancel_backend", pb2).await, Ok(true));
    assert_eq!(signal(&a1, "pg_terminate_backend", pa2).await, Ok(true));
    assert_eq!(signal(&b1, "pg_terminate_backend", pb2).await, Ok(true));
    for _ in 0..50 {
        if !alive(pa2).await && !alive(pb2).await {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(!alive(pa2).await, "its own backend was terminated");
    assert!(!alive(pb2).await);
    assert!(alive(pid(&a1).await).await && alive(pb1).await);
}
