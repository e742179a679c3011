//! The masker alone over bench/mask_bench.sh's texts (the same generators, in Rust), for profiling:
//! `cargo run --release -p ctxguard-core --example mask_speed [MB] [reps]`. Prints MB/s per text;
//! no assertion on time (bench/mask_bench.sh measures against md5 in the database).
//! `MASK_SPEED_PER_RULE=1`: each built-in rule alone; `MASK_SPEED_SET=1`: the `RegexSet` of all
//! rules over the whole text and in chunks of 256 bytes to 16 KiB (the masker's prefilter).
//! `MASK_SPEED_ONLY=emails` (or `prose`, `mixed`): that text alone (for `perf` or callgrind).

use std::time::Instant;

use ctxguard_core::mask::{default_rules, MaskCounts, Masker, Scan};

fn prose(i: usize) -> String {
    match i % 4 {
        0 => format!("To configure node srv-{}, set quota_mb to {} and restart the orion-api service; verify with orion status.", i % 40, i % 997),
        1 => format!("Настройка узла srv-{}: установите quota_mb в {} и перезапустите службу orion-api.", i % 40, i % 997),
        2 => format!("Invoice ACME-2026-{} totals {}.00 EUR, due 2026-10-04; see section 4.2.1 on page 17.", i % 9000, i % 5000),
        _ => format!("ノード srv-{} の設定: quota_mb を {} にしてから orion-api を再起動します。", i % 40, i % 997),
    }
}

fn secret(i: usize) -> String {
    match (i / 8) % 8 {
        0 => format!("Contact ivan.petrov{i}@example.com for access to the staging cluster."),
        1 => "The card 4111 1111 1111 1111 was charged for the annual support plan.".into(),
        2 => "Refunds go to IBAN DE89 3704 0044 0532 0130 00 at the end of the month.".into(),
        3 => format!("Call the hotline on +49 30 1234 {} during business hours.", 1000 + i % 9000),
        4 => format!("Never paste sk-proj-abcdefghijklmnop{i} into a ticket."),
        5 => "The AWS key AKIAIOSFODNN7EXAMPLE was rotated after the incident.".into(),
        6 => "Session eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U expired.".into(),
        _ => "Obfuscated ｉｖａｎ＠ｅｘａｍｐｌｅ．ｃｏｍ, header Authorization: Bearer abcdefghijklmnop1234567890.".into(),
    }
}

fn text_of(lines: impl Iterator<Item = String>, bytes: usize) -> String {
    let mut t = String::new();
    for l in lines {
        if t.len() + l.len() + 1 > bytes + 1 {
            break;
        }
        if !t.is_empty() {
            t.push('\n');
        }
        t.push_str(&l);
    }
    t
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let mb: usize = args.get(1).and_then(|a| a.parse().ok()).unwrap_or(8);
    let reps: usize = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(5);
    let bytes = mb * 1_000_000;
    let texts = [
        ("prose", text_of((1..).map(prose), bytes)),
        (
            "mixed",
            text_of(
                (1..).map(|i| if i % 8 == 7 { secret(i) } else { prose(i) }),
                bytes,
            ),
        ),
        (
            "emails",
            text_of(
                (1..).map(|i| format!("user{i}@mail{}.example.com", i % 97)),
                bytes,
            ),
        ),
    ];
    let only = std::env::var("MASK_SPEED_ONLY").ok();
    let texts: Vec<_> = texts
        .into_iter()
        .filter(|(name, _)| only.as_deref().is_none_or(|o| o == *name))
        .collect();
    let m = Masker::new(&default_rules()).unwrap();
    if std::env::var_os("MASK_SPEED_SET").is_some() {
        let set = regex::RegexSet::new(default_rules().iter().map(|r| r.pattern.as_str())).unwrap();
        for (name, t) in &texts {
            let t0 = Instant::now();
            let hits = set.matches(t).iter().count();
            let s = t0.elapsed().as_secs_f64();
            println!(
                "set whole {name:7} {hits} {:6.0} MB/s",
                t.len() as f64 / 1e6 / s
            );
            for chunk in [256usize, 1024, 4096, 16384] {
                let t0 = Instant::now();
                let mut pos = 0;
                let mut n = 0usize;
                let b = t.as_bytes();
                while pos < b.len() {
                    let from = (pos + chunk).min(b.len());
                    let end = b[from..]
                        .iter()
                        .position(|&c| c == b'\n')
                        .map_or(b.len(), |i| from + i);
                    n += set.matches_at(&t[..end], pos).iter().count();
                    pos = end;
                }
                let s = t0.elapsed().as_secs_f64();
                println!(
                    "set chunk {chunk:6} {name:7} {n} {:6.0} MB/s",
                    t.len() as f64 / 1e6 / s
                );
            }
        }
    }
    if std::env::var_os("MASK_SPEED_PER_RULE").is_some() {
        for spec in default_rules() {
            let one = Masker::new(std::slice::from_ref(&spec)).unwrap();
            for (name, t) in &texts {
                let t0 = Instant::now();
                let out = one
                    .mask_str(t, &mut MaskCounts::new(), &mut Scan::unlimited())
                    .unwrap();
                std::hint::black_box(out);
                let s = t0.elapsed().as_secs_f64();
                println!(
                    "rule {:15} {name:7} {:6.0} MB/s",
                    spec.name,
                    t.len() as f64 / 1e6 / s
                );
            }
        }
    }
    for (name, t) in &texts {
        let mut best = f64::MAX;
        let mut masked = 0;
        for _ in 0..reps {
            let mut c = MaskCounts::new();
            let t0 = Instant::now();
            let out = m.mask_str(t, &mut c, &mut Scan::unlimited()).unwrap();
            let s = t0.elapsed().as_secs_f64();
            best = best.min(s);
            masked = c.values().sum::<u32>();
            std::hint::black_box(out);
        }
        println!(
            "{name:7} {:5.1} MB  {masked:7} masked  best {:7.1} ms  {:6.0} MB/s",
            t.len() as f64 / 1e6,
            best * 1e3,
            t.len() as f64 / 1e6 / best
        );
    }
}
