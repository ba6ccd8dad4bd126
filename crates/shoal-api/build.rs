//! Rebuilds when the web UI is rebuilt, so the embedded copy is never stale.
fn main() {
    println!("cargo:rerun-if-changed=../../ui/dist");
    println!("cargo:rerun-if-changed=../../ui/dist/index.html");
    println!("cargo:rerun-if-changed=../../ui/dist/assets");
}
