# Sourced by run-ui.sh and run-sdk.sh: start_hub_fixture DIR starts the hub
# fixture (HUB_FIXTURE_BIN) serving the default model's GGUF (MODEL_GGUF) as
# the repo test/SmolLM2-GGUF on loopback, with its files under DIR; sets
# HUB_PID and HUB_URL, or returns non-zero with the fixture's errors printed.
start_hub_fixture() {
  local dir="$1"
  mkdir -p "$dir/hub/SmolLM2-GGUF"
  ln -sf "$(realpath "$MODEL_GGUF")" "$dir/hub/SmolLM2-GGUF/$(basename "$MODEL_GGUF")"
  "$HUB_FIXTURE_BIN" "test/SmolLM2-GGUF=$dir/hub/SmolLM2-GGUF" >"$dir/hub.out" 2>"$dir/hub.err" &
  HUB_PID=$!
  HUB_URL=""
  for _ in $(seq 300); do
    HUB_URL="$(sed -nE 's/^hub fixture listening on (http:\/\/[^ ]+)$/\1/p' "$dir/hub.out" | head -n 1)"
    [[ -n "$HUB_URL" ]] && return 0
    kill -0 "$HUB_PID" 2>/dev/null || break
    sleep 0.1
  done
  cat "$dir/hub.err" >&2
  return 1
}
