//! `cargo run -p ctxguard-embed --example embed -- MODEL_DIR TEXT...`: each text's token ids and
//! its cosine to the first text, with the time per embedding (a check by hand of a model dir).

use std::time::Instant;

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(dir) = args.next() else {
        eprintln!("usage: embed MODEL_DIR TEXT...");
        std::process::exit(2);
    };
    let t = Instant::now();
    let e = match ctxguard_embed::Embedder::load(dir.as_ref()) {
        Ok(e) => e,
        Err(err) => {
            eprintln!("embed: {err}");
            std::process::exit(1);
        }
    };
    println!("loaded in {:?}", t.elapsed());
    let texts: Vec<String> = args.collect();
    let mut first: Option<Vec<f32>> = None;
    for text in &texts {
        let t = Instant::now();
        let v = e.embed(text);
        let took = t.elapsed();
        let cos = first
            .as_ref()
            .map_or(1.0, |f| ctxguard_embed::cosine(f, &v));
        println!(
            "{cos:.4}  {took:?}  {:?}  {text}  [{:.5} {:.5} {:.5}]",
            e.tokens(text),
            v[0],
            v[1],
            v[2]
        );
        first.get_or_insert(v);
    }
}
