//! Usage: mlx-bindgen MLX_C_SRC OUT_FILE [CLANG_ARG]...
//!
//! Produces the `bindings.rs` that mlx-sys `include!`s from `OUT_DIR`, with the
//! same inputs as mlx-sys's own build: every `mlx/c/*.h` in sorted order, Rust
//! target 1.73, `malloc`/`realloc` left out. Extra clang args carry the
//! platform-specific include paths and defines.
use std::path::{Path, PathBuf};
use std::process::ExitCode;

fn headers(root: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(root.join("mlx/c"))? {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "h") {
            found.push(path);
        }
    }
    found.sort();
    Ok(found)
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [root, out, extra @ ..] = args.as_slice() else {
        eprintln!("usage: mlx-bindgen MLX_C_SRC OUT_FILE [CLANG_ARG]...");
        return ExitCode::from(2);
    };
    let root = PathBuf::from(root);
    let headers = match headers(&root) {
        Ok(h) if !h.is_empty() => h,
        Ok(_) => {
            eprintln!("no headers under {}/mlx/c", root.display());
            return ExitCode::FAILURE;
        }
        Err(e) => {
            eprintln!("reading {}/mlx/c: {e}", root.display());
            return ExitCode::FAILURE;
        }
    };
    let target = match "1.73.0".parse() {
        Ok(t) => t,
        Err(e) => {
            eprintln!("rust target: {e}");
            return ExitCode::FAILURE;
        }
    };
    let builder = headers.iter().fold(
        bindgen::Builder::default()
            .rust_target(target)
            .clang_arg(format!("-I{}", root.display()))
            .clang_args(extra)
            .blocklist_function("malloc")
            .blocklist_function("realloc"),
        |b, h| b.header(h.to_string_lossy()),
    );
    match builder.generate() {
        Ok(bindings) => match bindings.write_to_file(out) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("writing {out}: {e}");
                ExitCode::FAILURE
            }
        },
        Err(e) => {
            eprintln!("bindgen: {e}");
            ExitCode::FAILURE
        }
    }
}
