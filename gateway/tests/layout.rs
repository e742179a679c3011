//! The rooms of `gateway/src` stay as declared: every `crate::<module>` reference (also in a
//! grouped `use crate::{a, b::c}`, a `$crate::` in a macro, and `super::super::…` that leaves its
//! room) is mapped from the file's room to the room it names, and each such edge must be one that
//! [`FLOORS`] allows. A room may use only rooms declared below it, so the room graph has no circle;
//! the graph actually found is checked for circles too, and a failure names the offending
//! reference (`file:line`). No database needed.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The floors, bottom first: each room (a folder of `src/` or a floor file `src/<name>.rs`) and the
/// rooms it may use. A room may name only rooms declared above it in this table (lower floors).
/// `lib.rs` (module declarations) and `main.rs` (the binary) are not rooms.
const FLOORS: &[(&str, &[&str])] = &[
    // Leaves: no other room.
    ("error", &[]),
    ("metrics", &[]),
    ("secrets", &[]),
    ("seal", &[]),
    ("jwks_sync", &[]),
    ("bounded", &[]),
    // Settings and the values parsed from them.
    ("config", &["secrets"]),
    ("auth", &["error"]),
    ("limits", &["config", "metrics"]),
    // What a tool is, the tool budget, tool search.
    ("catalog", &["bounded", "config"]),
    ("llm", &["bounded", "catalog", "config"]),
    ("telemetry", &["llm"]),
    // The only SQL.
    ("db", &["catalog", "config", "error", "seal"]),
    ("pages", &["db", "error"]),
    // Upstream MCP servers and their credentials.
    (
        "upstream",
        &[
            "bounded",
            "config",
            "db",
            "error",
            "pages",
            "seal",
            "secrets",
            "telemetry",
        ],
    ),
    // What chat, tool calls and MCP share.
    (
        "services",
        &["catalog", "config", "db", "llm", "metrics", "upstream"],
    ),
    (
        "tools",
        &[
            "catalog",
            "db",
            "error",
            "pages",
            "services",
            "telemetry",
            "upstream",
        ],
    ),
    // The model loop.
    (
        "chat",
        &[
            "catalog",
            "config",
            "db",
            "error",
            "llm",
            "pages",
            "services",
            "telemetry",
            "tools",
            "upstream",
        ],
    ),
    // The MCP server.
    (
        "mcp",
        &[
            "auth",
            "catalog",
            "chat",
            "config",
            "db",
            "error",
            "limits",
            "metrics",
            "pages",
            "services",
            "telemetry",
            "tools",
            "upstream",
        ],
    ),
    // Where a request enters: the router, handlers and the state they share.
    (
        "http",
        &[
            "auth",
            "catalog",
            "chat",
            "config",
            "db",
            "error",
            "limits",
            "llm",
            "mcp",
            "metrics",
            "pages",
            "seal",
            "secrets",
            "services",
            "telemetry",
            "tools",
            "upstream",
        ],
    ),
];

/// Names at the crate root that are not modules, and the room that defines them.
const ROOT_ITEMS: &[(&str, &str)] = &[("otel_span", "telemetry")];

/// One reference from a file to another room.
#[derive(Debug, Clone)]
struct Reference {
    file: String,
    line: usize,
    text: String,
    from: String,
    to: String,
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let mut entries: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module path of a file under `src/` (`upstream/credentials/mod.rs` → `upstream::credentials`).
fn module_path(relative: &Path) -> Vec<String> {
    let mut parts: Vec<String> = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap_or_default();
    let stem = last.trim_end_matches(".rs");
    if stem != "mod" && stem != "lib" && stem != "main" {
        parts.push(stem.to_string());
    }
    parts
}

/// The source with comments and the contents of string and character literals blanked (lines
/// kept), so that only code is searched.
fn code_only(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
        } else if c == 'r'
            && (next == Some('"') || next == Some('#'))
            && (i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_'))
        {
            // A raw string: r"…", r#"…"#.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            out.push(' ');
            for _ in i + 1..=j {
                out.push(' ');
            }
            i = j + 1;
            while i < chars.len() {
                if chars[i] == '"' && (0..hashes).all(|k| chars.get(i + 1 + k) == Some(&'#')) {
                    for _ in 0..=hashes {
                        out.push(' ');
                    }
                    i += 1 + hashes;
                    break;
                }
                out.push(blank(chars[i]));
                i += 1;
            }
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                if chars[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < chars.len() {
                    out.push(blank(chars[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' {
            // A character literal ('x', '\n', '\u{1F600}'), else a lifetime or label.
            let close = if next == Some('\\') {
                (i + 2..chars.len().min(i + 12)).find(|&k| chars[k] == '\'')
            } else if chars.get(i + 2) == Some(&'\'') {
                Some(i + 2)
            } else {
                None
            };
            match close {
                Some(end) => {
                    for _ in i..=end {
                        out.push(' ');
                    }
                    i = end + 1;
                }
                None => {
                    out.push(c);
                    i += 1;
                }
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_at(code: &str, at: usize) -> &str {
    let rest = &code[at..];
    let end = rest
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    &rest[..end]
}

/// The first names of the paths of a `{…}` group starting at `open` (nested groups skipped).
fn group_heads(code: &str, open: usize) -> Vec<(usize, String)> {
    let bytes = code.as_bytes();
    let mut depth = 0;
    let mut heads = Vec::new();
    let mut expect_head = true;
    let mut i = open;
    while i < bytes.len() {
        match bytes[i] {
            b'{' => {
                depth += 1;
                expect_head = depth == 1;
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            b',' if depth == 1 => expect_head = true,
            c if expect_head && depth == 1 && (c.is_ascii_alphabetic() || c == b'_') => {
                heads.push((i, ident_at(code, i).to_string()));
                expect_head = false;
            }
            _ => {}
        }
        i += 1;
    }
    heads
}

/// How many inline modules (`mod name { … }`) enclose `at`.
fn inline_depth(code: &str, at: usize) -> usize {
    let bytes = code.as_bytes();
    let mut depth = 0;
    for (start, _) in code.match_indices("mod ") {
        if start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_') {
            continue;
        }
        let name = ident_at(code, start + 4);
        let rest = code[start + 4 + name.len()..].trim_start();
        if name.is_empty() || !rest.starts_with('{') || start > at {
            continue;
        }
        let open = code.len() - rest.len();
        let mut level = 0;
        let mut close = code.len();
        for (i, b) in bytes.iter().enumerate().skip(open) {
            match b {
                b'{' => level += 1,
                b'}' => {
                    level -= 1;
                    if level == 0 {
                        close = i;
                        break;
                    }
                }
                _ => {}
            }
        }
        if open < at && at < close {
            depth += 1;
        }
    }
    depth
}

fn line_of(code: &str, at: usize) -> usize {
    code[..at].matches('\n').count() + 1
}

fn line_text(source: &str, line: usize) -> String {
    source
        .lines()
        .nth(line - 1)
        .unwrap_or_default()
        .trim()
        .to_string()
}

/// The room a name at the crate root belongs to.
fn room_of_root(name: &str) -> String {
    ROOT_ITEMS
        .iter()
        .find(|(item, _)| *item == name)
        .map_or(name, |(_, room)| room)
        .to_string()
}

/// Every reference of `file` (under `src/`) to another room.
fn references(relative: &Path, source: &str) -> Vec<Reference> {
    let module = module_path(relative);
    let Some(room) = module.first().cloned() else {
        return Vec::new(); // lib.rs, main.rs
    };
    let file = format!("gateway/src/{}", relative.display());
    let code = code_only(source);
    let mut found: Vec<(usize, String)> = Vec::new();
    // `crate::x`, `$crate::x`, `crate::{x, y::z}`.
    for (at, _) in code.match_indices("crate::") {
        if at > 0 {
            let before = code.as_bytes()[at - 1];
            if before.is_ascii_alphanumeric() || before == b'_' {
                continue; // e.g. `ctxguard_gateway::` never, `my_crate::`
            }
        }
        let after = at + "crate::".len();
        if code[after..].starts_with('{') {
            found.extend(group_heads(&code, after));
        } else {
            found.push((after, ident_at(&code, after).to_string()));
        }
    }
    // `super::super::x` leaving the room.
    for (at, _) in code.match_indices("super::") {
        if at > 0 && code[..at].ends_with("super::") {
            continue; // counted from the first `super`
        }
        if at > 0 {
            let before = code.as_bytes()[at - 1];
            if before.is_ascii_alphanumeric() || before == b'_' {
                continue;
            }
        }
        let mut ups = 0;
        let mut i = at;
        while code[i..].starts_with("super::") {
            ups += 1;
            i += "super::".len();
        }
        // A reference leaves the room only if it climbs to the crate root (inline modules such
        // as `mod tests { … }` count as one level each).
        if ups < module.len() + inline_depth(&code, at) {
            continue;
        }
        if code[i..].starts_with('{') {
            found.extend(group_heads(&code, i));
        } else {
            found.push((i, ident_at(&code, i).to_string()));
        }
    }
    found
        .into_iter()
        .filter(|(_, name)| !name.is_empty() && name != "self")
        .map(|(at, name)| {
            let line = line_of(&code, at);
            Reference {
                file: file.clone(),
                line,
                text: line_text(source, line),
                from: room.clone(),
                to: room_of_root(&name),
            }
        })
        .filter(|r| r.to != r.from)
        .collect()
}

fn all_references() -> (BTreeSet<String>, Vec<Reference>) {
    let root = src();
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    assert!(files.len() > 20, "no sources under {}", root.display());
    let mut rooms = BTreeSet::new();
    let mut refs = Vec::new();
    for path in files {
        let relative = path.strip_prefix(&root).unwrap().to_path_buf();
        if let Some(room) = module_path(&relative).first() {
            rooms.insert(room.clone());
        }
        let source = std::fs::read_to_string(&path).unwrap();
        refs.extend(references(&relative, &source));
    }
    (rooms, refs)
}

/// A circle in `graph`, if any, as the rooms along it.
fn find_cycle(graph: &BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &BTreeMap<String, BTreeSet<String>>,
        state: &mut BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()).copied().unwrap_or(0) {
                1 => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                0 => {
                    if let Some(c) = visit(next, graph, state, stack) {
                        return Some(c);
                    }
                }
                _ => {}
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = BTreeMap::new();
    for node in graph.keys() {
        if state.get(node.as_str()).copied().unwrap_or(0) == 0 {
            let mut stack = Vec::new();
            if let Some(c) = visit(node, graph, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

#[test]
fn the_floor_table_only_looks_down() {
    let mut below: BTreeSet<&str> = BTreeSet::new();
    for (room, uses) in FLOORS {
        for used in *uses {
            assert!(
                below.contains(used),
                "FLOORS: `{room}` may use `{used}`, which is not declared below it"
            );
        }
        assert!(below.insert(room), "FLOORS: `{room}` is declared twice");
    }
}

#[test]
fn every_room_is_declared() {
    let (rooms, _) = all_references();
    let declared: BTreeSet<String> = FLOORS.iter().map(|(r, _)| r.to_string()).collect();
    let undeclared: Vec<_> = rooms.difference(&declared).collect();
    assert!(
        undeclared.is_empty(),
        "gateway/src has rooms the floor table (gateway/tests/layout.rs FLOORS) does not \
         declare: {undeclared:?}"
    );
    let gone: Vec<_> = declared.difference(&rooms).collect();
    assert!(
        gone.is_empty(),
        "FLOORS declares rooms gateway/src no longer has: {gone:?}"
    );
}

#[test]
fn rooms_use_only_the_floors_below_them() {
    let (_, refs) = all_references();
    let allowed: BTreeMap<&str, &[&str]> = FLOORS.iter().copied().collect();
    let wrong: Vec<String> = refs
        .iter()
        .filter(|r| {
            !allowed
                .get(r.from.as_str())
                .is_some_and(|uses| uses.contains(&r.to.as_str()))
        })
        .map(|r| {
            format!(
                "{}:{}: room `{}` uses `{}`, which FLOORS does not allow it (may use: {:?}): {}",
                r.file,
                r.line,
                r.from,
                r.to,
                allowed.get(r.from.as_str()).copied().unwrap_or_default(),
                r.text
            )
        })
        .collect();
    assert!(
        wrong.is_empty(),
        "references between rooms that the floors do not allow (move the shared piece down a \
         floor, or change FLOORS in gateway/tests/layout.rs if the design changed):\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_room_graph_has_no_circle() {
    let (_, refs) = all_references();
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for r in &refs {
        graph
            .entry(r.from.clone())
            .or_default()
            .insert(r.to.clone());
    }
    if let Some(cycle) = find_cycle(&graph) {
        let evidence: Vec<String> = cycle
            .windows(2)
            .filter_map(|pair| {
                refs.iter()
                    .find(|r| r.from == pair[0] && r.to == pair[1])
                    .map(|r| format!("{} → {}: {}:{}: {}", r.from, r.to, r.file, r.line, r.text))
            })
            .collect();
        panic!(
            "the rooms form a circle: {}\n{}",
            cycle.join(" → "),
            evidence.join("\n")
        );
    }
}

#[test]
fn the_scanner_sees_grouped_super_and_dollar_crate_references() {
    let source = "use crate::{db::Db, chat, config::{Config, hosts}};\n\
                  // crate::mcp in a comment\n\
                  let s = \"crate::http in a string\";\n\
                  let u = super::super::tools::call;\n\
                  let t = $crate::telemetry::TARGET;\n\
                  mod tests { use super::*; use super::super::Deps; }\n";
    let refs = references(Path::new("upstream/credentials/mod.rs"), source);
    let to: BTreeSet<&str> = refs.iter().map(|r| r.to.as_str()).collect();
    assert_eq!(
        to,
        BTreeSet::from(["chat", "config", "db", "telemetry", "tools"]),
        "{refs:?}"
    );
    assert!(refs.iter().all(|r| r.from == "upstream"));
    assert_eq!(refs.iter().find(|r| r.to == "tools").unwrap().line, 4);
}
