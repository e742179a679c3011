//! Count the tokens of files with OpenAI's o200k_base tokenizer (bench/mcp_tokens.sh).
//!
//! `count_tokens FILE...` prints `tokens<TAB>file` per file.

use std::process::ExitCode;

fn main() -> ExitCode {
    let bpe = match tiktoken_rs::o200k_base() {
        Ok(b) => b,
        Err(e) => {
            eprintln!("count_tokens: {e}");
            return ExitCode::FAILURE;
        }
    };
    for path in std::env::args().skip(1) {
        match std::fs::read_to_string(&path) {
            Ok(text) => println!("{}\t{path}", bpe.encode_with_special_tokens(&text).len()),
            Err(e) => {
                eprintln!("count_tokens: {path}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    ExitCode::SUCCESS
}
