#!/usr/bin/env bash
# `make desktop` after its installs: lint and unit-test the desktop crate,
# bundle the app as a .deb with the Tauri CLI, then run the smoke test
# (smoke/smoke.mjs) on the bundled binary under Xvfb and a D-Bus session.
# Prints each step's time; the last line is the smoke test's tally.
#
# usage: desktop.sh TAURI_DRIVER OUT_DIR   (SHOAL_MODEL names the model)
set -euo pipefail
cd "$(dirname "$0")/.."
driver=$1
out=$2
mkdir -p "$out"

steps=()
step() {
  local name=$1
  shift
  local t0=$SECONDS rc=0
  echo "[desktop] $name: $*"
  # A subshell with errexit of its own: under `"$@" || rc=$?` bash would
  # ignore `set -e` inside a step function, and only its last line would count.
  set +e
  (set -e; "$@")
  rc=$?
  set -e
  steps+=("$(printf '%-28s %4ds%s' "$name" $((SECONDS - t0)) "$([ $rc = 0 ] || echo " (failed: $rc)")")")
  return $rc
}

# MLX's shared library and the libraries it links, taken from the wheel the
# build linked against, go into the package beside the binary's rpath
# (/usr/lib/shoal/mlx/lib, see build.rs), keeping the wheel's layout that
# libmlx's own $ORIGIN runpath expects.
bundle_config() {
  local site
  site=$(sed -n 's/^SHOAL_MLX_SITE = "\(.*\)"$/\1/p' .cargo/config.toml)
  [ -d "$site/mlx/lib" ] || { echo "no MLX wheel found (run make mlx)" >&2; return 1; }
  node - "$site" "$out/bundle.json" <<'EOF'
const fs = require('node:fs');
const path = require('node:path');
const [site, dest] = process.argv.slice(2);
const files = {};
for (const dir of ['mlx/lib', 'mlx_cpu.libs']) {
  const full = path.join(site, dir);
  if (!fs.existsSync(full)) continue;
  for (const f of fs.readdirSync(full)) {
    if (f.includes('.so')) files[`/usr/lib/shoal/${dir}/${f}`] = path.join(full, f);
  }
}
fs.writeFileSync(dest, JSON.stringify({ bundle: { linux: { deb: { files } } } }, null, 2));
console.log(Object.keys(files).join('\n'));
EOF
}

step "fmt (shoal-desktop)" cargo fmt -p shoal-desktop -- --check
step "clippy (shoal-desktop)" cargo clippy --release -p shoal-desktop --all-targets -- -D warnings
step "unit tests (shoal-desktop)" cargo test --release -p shoal-desktop
step "deb contents" bundle_config
step "tauri build --bundles deb" bash -c "cd src-tauri && npx --no-install tauri build --bundles deb --ci --config '$out/bundle.json'"

deb=$(ls -t target/release/bundle/deb/*.deb | head -1)

# The binary is linked with the build machine's MLX folder first in its
# runpath, so it also runs from target/; the package's copy must look only
# in its own library folder. Rewritten with patchelf, and the package built
# again with its checksums.
package_runpath() {
  local root="$out/repack"
  rm -rf "$root" && mkdir -p "$root"
  dpkg-deb -R "$deb" "$root"
  patchelf --set-rpath /usr/lib/shoal/mlx/lib "$root/usr/bin/shoal-desktop"
  if [ -f "$root/DEBIAN/md5sums" ]; then
    (cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | sort -z | xargs -0 md5sum) > "$root/DEBIAN/md5sums"
  fi
  dpkg-deb --root-owner-group -Zgzip -b "$root" "$deb" >/dev/null
}
step "package runpath" package_runpath

check_deb() {
  dpkg-deb -I "$deb" | sed -n 's/^ \(Package\|Version\|Depends\):/  \1:/p'
  dpkg-deb -c "$deb" | awk '{print "  " $NF}' | grep -E 'usr/bin/|\.desktop$|/icons/.*32x32|libmlx'
  # The packaged libmlx must find its own BLAS/LAPACK inside the package.
  rm -rf "$out/deb-root" && dpkg-deb -x "$deb" "$out/deb-root"
  local lib="$out/deb-root/usr/lib/shoal/mlx/lib/libmlx.so"
  if ldd "$lib" | grep -q 'not found'; then
    ldd "$lib"
    return 1
  fi
  ldd "$lib" | grep -E 'blas|lapack' | sed "s|$out/deb-root||; s/^\s*/  /"
  # Every runpath in the package stays inside it: the app's library folder or
  # a library's own $ORIGIN, never a folder of the machine that built it.
  local f rp p bad=0
  while IFS= read -r -d '' f; do
    rp=$(readelf -d "$f" 2>/dev/null | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]/\2/p')
    [ -n "$rp" ] || continue
    echo "  runpath ${f#"$out/deb-root"}: $rp"
    for p in ${rp//:/ }; do
      case "$p" in
        /usr/lib/shoal/* | '$ORIGIN' | '$ORIGIN'/*) ;;
        *) echo "  build path in the package's runpath: $p" >&2; bad=1 ;;
      esac
    done
  done < <(find "$out/deb-root" -type f \( -name '*.so*' -o -path '*/usr/bin/*' \) -print0)
  return $bad
}
step "check .deb" check_deb

# The smoke test's peer node (cluster split with the app): the shoal binary exactly as
# `make test` builds it (the workspace with its tests, whose dev-dependencies turn on
# features of shared crates), so after `make test` nothing compiles again; a plain
# `cargo build -p shoal` would rebuild the whole stack with other features.
step "shoal CLI (peer node)" cargo test --release --workspace --exclude shoal-desktop --no-run

# The smoke test on each backend: the default GGUF on MLX, then on llama.cpp
# (where a pipeline split is refused and the model is placed whole).
status=0
smoke() {
  local backend=$1 dir="$out/$1"
  mkdir -p "$dir"
  # The app's conversation store for this run, not the user's.
  export SHOAL_DB="$dir/conversations.sqlite"
  rm -f "$SHOAL_DB" "$SHOAL_DB-wal" "$SHOAL_DB-shm"
  # Its MCP servers' file too (the smoke test writes it through the app).
  export SHOAL_MCP_FILE="$dir/mcp.json"
  rm -f "$SHOAL_MCP_FILE"
  SHOAL_BACKEND=$backend xvfb-run -a dbus-run-session -- \
    node src-tauri/smoke/smoke.mjs target/release/shoal-desktop "$driver" "$dir" \
    > >(tee "$dir/smoke.log" | grep -E '^(ok|FAIL|     |desktop:)') 2> "$dir/smoke-stderr.log"
}
for backend in mlx llama; do
  step "smoke test on $backend (xvfb, dbus)" smoke "$backend" || status=$?
  sleep 1
done
echo "[desktop] package: $deb ($(du -h "$deb" | cut -f1))"
echo "[desktop] screenshots: $out/{mlx,llama}/{chat,mcp}.png; logs: $out/{mlx,llama}/smoke.log, smoke-stderr.log"
echo "[desktop] step times:"
printf '  %s\n' "${steps[@]}"
for backend in mlx llama; do
  echo "[desktop] on $backend: $(grep -E '^desktop: [0-9]+ passed, [0-9]+ failed' "$out/$backend/smoke.log" 2>/dev/null | tail -1 || echo "desktop: 0 passed, 1 failed")"
done
exit $status
