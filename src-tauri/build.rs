/// Where the Linux package puts MLX's shared library (see `make desktop`).
const PACKAGED_MLX_LIB: &str = "/usr/lib/shoal/mlx/lib";

fn main() {
    // The build machine's libmlx is found through the rpath the MLX setup
    // adds; an installed package finds its own copy here.
    if std::env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        println!("cargo:rustc-link-arg-bins=-Wl,-rpath,{PACKAGED_MLX_LIB}");
    }
    tauri_build::build()
}
