"""Claude Code itself, run twice with a server restart between: `make bench`'s real-agent run.

Claude Code (`claude -p`, print mode, unchanged; `tools/claude-code.sh` installs the pinned
version) talks to Shoal's /v1/messages on the agent's model. The server is stopped (SIGTERM)
and started again on the same data directory, and Claude Code runs again. The ledger
(`/v1/usage`) then says, for each run's requests, how many prompt tokens were read from the
cache and from disk, and each request's time to first token. The target is that the second
run's first request reads >= 90% of its prompt from the cache. Figures, never assertions."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
import urllib.request

from bench_server import Server, free_port, scratch, shoal_cmd

TASK = "Reply with the single word: ready"


def ledger(url: str) -> list[dict]:
    """The server's ledger rows, oldest first."""
    with urllib.request.urlopen(f"{url}/v1/usage?limit=1000", timeout=60) as r:
        return list(reversed(json.load(r)["data"]))


def run_claude(claude: str, url: str, model: str, work: str, home: str) -> float:
    """Seconds Claude Code took for TASK, start to exit."""
    env = {
        **os.environ,
        "HOME": home,
        "ANTHROPIC_BASE_URL": url,
        "ANTHROPIC_API_KEY": "sk-local",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
    }
    start = time.perf_counter()
    out = subprocess.run([claude, "-p", TASK, "--model", model], cwd=work, env=env,
                         capture_output=True, text=True, timeout=3600)
    took = time.perf_counter() - start
    if out.returncode != 0:
        raise RuntimeError(f"claude exited {out.returncode}: {out.stderr[-500:]}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--claude", required=True, help="the `claude` command (tools/claude-code.sh)")
    ap.add_argument("--model", required=True, help="the agent's model (a GGUF)")
    ap.add_argument("--threads", type=int, default=0)
    a = ap.parse_args()
    with scratch("shoal-bench-claude-") as data:
        work, home = os.path.join(data, "work"), os.path.join(data, "home")
        os.makedirs(work)
        os.makedirs(home)
        db = os.path.join(data, "store.sqlite")
        port = free_port()
        cmd = shoal_cmd(a.shoal, a.model, port, db, a.threads)
        s = Server(cmd, port)
        model = s.model()
        first_run = run_claude(a.claude, s.url, model, work, home)
        before = len(ledger(s.url))
        s.stop()
        s = Server(cmd, port)
        second_run = run_claude(a.claude, s.url, model, work, home)
        rows = ledger(s.url)
        s.stop()
        print(f"\nClaude Code (claude -p) on {os.path.basename(a.model)}, twice, the server restarted between")
        for label, part, took in (("first run", rows[:before], first_run), ("after a restart", rows[before:], second_run)):
            print(f"  {label}: {len(part)} request(s), {took:.1f} s in all")
            for i, r in enumerate(part):
                t = r["tokens"]
                share = 100 * t["cached"] / t["prompt"] if t["prompt"] else 0
                print(f"    request {i + 1}: {t['prompt']:6d} prompt tokens, {t['cached']:6d} cached"
                      f" ({share:5.1f}%, {t['cached_disk']} from disk), first token after {r['ttft_ms']:9.0f} ms")
        if rows[:before] and rows[before:]:
            cold, warm = rows[0], rows[before]
            t = warm["tokens"]
            print(f"  second run's first request: {100 * t['cached'] / max(t['prompt'], 1):.1f}% of its prompt from the"
                  f" cache (target >= 90%), time to first token {100 * warm['ttft_ms'] / cold['ttft_ms']:.2f}% of cold")


if __name__ == "__main__":
    main()
