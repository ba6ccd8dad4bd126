// Cargo only resolves `[build-dependencies]` for a package with a build script; this
// one does nothing, so that the hack's build dependencies unify features on the host too.
fn main() {}
