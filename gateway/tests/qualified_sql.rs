//! Every SQL text the gateway sends (`ctxguard_gateway::db::sql::all_statements`) names every type,
//! function, operator, table and collation by schema, checked with PostgreSQL's own parser
//! (libpg_query, the `pg_query` crate).
//!
//! Why: on a pooled server connection the previous client may have left `pg_temp` objects, and
//! `pg_temp` is searched first for types and relations (`CREATE DOMAIN pg_temp.text …` would make
//! an unqualified `::text` run the client's CHECK function on the next caller's values). Functions
//! and operators are never looked up in `pg_temp`, but any other schema on a `search_path` a client
//! set (or a role default) would be: so those are qualified too, and constructs that look up an
//! operator by its bare name (`IN`, `BETWEEN`, `LIKE`, `IS DISTINCT FROM`, `NULLIF`, a simple
//! `CASE`, `JOIN … USING`, `NATURAL JOIN`, `ORDER BY … USING`, `= ANY`) are refused.

use serde_json::Value;

/// The names in a `names`/`funcname`-style list of String nodes.
fn names(list: &Value) -> Vec<String> {
    list.as_array()
        .map(|a| {
            a.iter()
                .map(|n| {
                    n.pointer("/node/String/sval")
                        .and_then(Value::as_str)
                        .unwrap_or("?")
                        .to_string()
                })
                .collect()
        })
        .unwrap_or_default()
}

fn nonempty(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null) => false,
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Bool(b)) => *b,
        Some(_) => true,
    }
}

/// Walk a parse tree (its serde form) and describe every name that is looked up through the
/// search path.
fn walk(v: &Value, found: &mut Vec<String>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| walk(x, found)),
        Value::Object(o) => {
            // A TypeName (as a node or as a field): `names` and `type_oid`.
            if o.contains_key("type_oid") && o.contains_key("names") {
                let n = names(&o["names"]);
                if n.len() < 2 {
                    found.push(format!("type {}", n.join(".")));
                }
            }
            // A RangeVar: a table, view or sequence.
            if o.contains_key("relname")
                && o.get("schemaname")
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .is_empty()
            {
                found.push(format!("table {}", o["relname"].as_str().unwrap_or("?")));
            }
            for (key, val) in o {
                match key.as_str() {
                    "FuncCall" => {
                        let n = names(&val["funcname"]);
                        if n.len() < 2 {
                            found.push(format!("function {}", n.join(".")));
                        }
                    }
                    "AExpr" => {
                        let n = names(&val["name"]);
                        if n.len() < 2 {
                            found.push(format!(
                                "operator {} (A_Expr kind {})",
                                n.join("."),
                                val["kind"]
                            ));
                        }
                    }
                    "SubLink" if nonempty(val.get("oper_name")) => {
                        let n = names(&val["oper_name"]);
                        if n.len() < 2 {
                            found.push(format!("operator {} (subquery comparison)", n.join(".")));
                        }
                    }
                    "SortBy" if nonempty(val.get("use_op")) => {
                        let n = names(&val["use_op"]);
                        if n.len() < 2 {
                            found.push(format!("operator {} (ORDER BY … USING)", n.join(".")));
                        }
                    }
                    "CollateClause" => {
                        let n = names(&val["collname"]);
                        if n.len() < 2 {
                            found.push(format!("collation {}", n.join(".")));
                        }
                    }
                    "CaseExpr" if nonempty(val.get("arg")) => {
                        found.push("operator = (CASE x WHEN …)".to_string());
                    }
                    "JoinExpr"
                        if nonempty(val.get("using_clause")) || nonempty(val.get("is_natural")) =>
                    {
                        found.push("operator = (JOIN USING / NATURAL JOIN)".to_string());
                    }
                    _ => {}
                }
                walk(val, found);
            }
        }
        _ => {}
    }
}

/// Every unqualified name in `sql` (or the parse error).
fn unqualified(sql: &str) -> Result<Vec<String>, String> {
    let parsed = pg_query::parse(sql, 0).map_err(|e| e.to_string())?;
    let tree = serde_json::to_value(&parsed.protobuf).map_err(|e| e.to_string())?;
    let mut found = Vec::new();
    walk(&tree, &mut found);
    Ok(found)
}

#[test]
fn every_statement_the_gateway_sends_is_schema_qualified() {
    let all = ctxguard_gateway::db::sql::all_statements();
    assert!(all.len() > 25, "{} statements", all.len());
    let mut bad = Vec::new();
    for (name, sql) in &all {
        match unqualified(sql) {
            Ok(found) if found.is_empty() => {}
            Ok(found) => bad.push(format!("{name}: {}", found.join(", "))),
            Err(e) => bad.push(format!("{name}: does not parse: {e}")),
        }
    }
    assert!(
        bad.is_empty(),
        "unqualified names in the gateway's SQL:\n{}",
        bad.join("\n")
    );
}

#[test]
fn every_transaction_frame_pins_its_settings_and_nothing_else() {
    for (name, sql) in ctxguard_gateway::db::sql::all_statements() {
        if !name.starts_with("begin(") {
            continue;
        }
        let parsed = pg_query::parse(&sql, 0).unwrap();
        let tree = serde_json::to_value(&parsed.protobuf).unwrap();
        let stmts = tree["stmts"].as_array().unwrap();
        // BEGIN, SET LOCAL statement_timeout, SET LOCAL ROLE NONE, and one SELECT of
        // ctxguard.pin_settings for the rest.
        assert_eq!(stmts.len(), 4, "{name}");
        let begin = &stmts[0]["stmt"]["node"]["TransactionStmt"];
        assert!(begin.is_object(), "{name} starts with BEGIN: {}", stmts[0]);
        let set = &stmts[1]["stmt"]["node"]["VariableSetStmt"];
        assert_eq!(set["is_local"], true, "{name}: {}", stmts[1]);
        assert_eq!(
            set["name"], "statement_timeout",
            "{name}: the timeout first"
        );
        let role = &stmts[2]["stmt"]["node"]["VariableSetStmt"];
        assert_eq!(role["is_local"], true, "{name}: {}", stmts[2]);
        assert_eq!(role["name"], "role", "{name}: {}", stmts[2]);
        assert!(
            role["args"].to_string().contains("none"),
            "{name}: {}",
            stmts[2]
        );
        let select = &stmts[3]["stmt"]["node"]["SelectStmt"];
        let call = &select["target_list"][0]["node"]["ResTarget"]["val"]["node"]["FuncCall"];
        assert_eq!(
            call["funcname"].to_string(),
            r#"[{"node":{"String":{"sval":"ctxguard"}}},{"node":{"String":{"sval":"pin_settings"}}}]"#,
            "{name}: {select}"
        );
        // Its one argument: a constant text[] of every other pin, name then value.
        let cast = &call["args"][0]["node"]["TypeCast"];
        let pins = cast["arg"]["node"]["AConst"]["val"]["Sval"]["sval"]
            .as_str()
            .unwrap_or_else(|| panic!("{name}: {select}"));
        assert_eq!(
            cast["type_name"]["names"].to_string(),
            r#"[{"node":{"String":{"sval":"pg_catalog"}}},{"node":{"String":{"sval":"text"}}}]"#,
            "{name}"
        );
        for (pin, _, _) in ctxguard_gateway::db::sql::PINS.iter().skip(1) {
            assert!(
                *pin == "role" || pins.contains(&format!("\"{pin}\",")),
                "{name}: {pin} is pinned"
            );
        }
    }
}

/// The checker itself finds each kind of unqualified name.
#[test]
fn the_checker_finds_what_it_is_for() {
    let cases = [
        ("SELECT $1::text", "type text"),
        ("SELECT $1::text[]", "type text"),
        ("SELECT CAST($1 AS jsonb)", "type jsonb"),
        ("SELECT now()", "function now"),
        ("SELECT 1 = 1", "operator ="),
        ("SELECT 1 WHERE 1 IN (1, 2)", "operator ="),
        ("SELECT 1 WHERE 1 BETWEEN 0 AND 2", "operator BETWEEN"),
        ("SELECT 1 WHERE 'a' LIKE 'b'", "operator ~~"),
        ("SELECT 1 WHERE 1 IS DISTINCT FROM 2", "operator ="),
        ("SELECT NULLIF(1, 2)", "operator ="),
        ("SELECT 1 WHERE 1 = ANY ($1)", "operator ="),
        ("SELECT 1 WHERE 1 = ANY (SELECT 1)", "operator ="),
        ("SELECT CASE 1 WHEN 1 THEN 2 END", "CASE x WHEN"),
        ("SELECT * FROM tools", "table tools"),
        (
            "SELECT 1 FROM pg_catalog.pg_class a JOIN pg_catalog.pg_class b USING (oid)",
            "JOIN USING",
        ),
        (
            "SELECT 1 FROM pg_catalog.pg_class ORDER BY 1 USING <",
            "ORDER BY",
        ),
        ("SELECT 'a' COLLATE \"C\"", "collation C"),
        (
            "SELECT ctxguard.mcp_session_open($1, $2, $3, $4)::text",
            "type text",
        ),
    ];
    for (sql, want) in cases {
        let found = unqualified(sql).unwrap();
        assert!(
            found.iter().any(|f| f.contains(want)),
            "{sql}: expected {want:?}, found {found:?}"
        );
    }
    for ok in [
        "SELECT $1::pg_catalog.text[] IS NULL",
        "SELECT 1 OPERATOR(pg_catalog.=) 1",
        "SELECT x.a FROM ctxguard.tools x WHERE x.a OPERATOR(pg_catalog.=) ANY ($1)",
        "SELECT coalesce(pg_catalog.jsonb_agg(1 ORDER BY 1), '[]')",
        "SELECT $1::int",
        "SET LOCAL search_path TO pg_catalog, pg_temp",
    ] {
        assert_eq!(unqualified(ok).unwrap(), Vec::<String>::new(), "{ok}");
    }
}
