"""Shoal's llama.cpp backend against llama.cpp's own tools built with llama.cpp's default
options (tools/llama-server.sh), on the same files and threads, in interleaved pairs:

1. pp512 and tg128 (after a short prompt): `shoal bench` against `llama-bench`.
2. Time to first token for a ~4k-token prompt (and ~8k and ~16k, agent sizes, on Qwen2.5-Coder)
   through Anthropic's /v1/messages, streamed: `shoal serve` against `llama-server` (one slot),
   both with a window of 32768 positions. Each request opens with its own line, so neither
   server's prompt cache serves it.
3. Speculative decoding on Qwen2.5-Coder: a code edit (the function in
   crates/shoal/bench/sync_inventory.py handed back with one line changed) and an open chat,
   through /v1/chat/completions, greedy: Shoal with prompt lookup, Shoal without, llama-server
   without and with its own n-gram drafting (`--spec-type ngram-simple`). Decode speed is taken
   by the client alike for all four: completion tokens after the first over the time from the
   first to the last.

Prints the figures and the ratios; the targets are prefill and decode >= 0.97x llama-bench,
TTFT >= 1.0x llama-server, and drafting >= 2x plain decode on the edit, >= 0.97x on chat."""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

from bench_server import Server

EDIT = ("In the Python function below, change the line `    retries = 3` to `    retries = 5`. "
        "Reply with the whole updated function in one Python code block and nothing else.\n\n"
        "```python\n{function}```")
CHAT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def run(cmd, env=None):
    return subprocess.run(cmd, capture_output=True, text=True, check=True,
                          env={**os.environ, "SHOAL_LOG": "warn", **(env or {})}).stdout


def shoal_bench(a, model, p, g):
    return json.loads(run([a.shoal, "bench", "--backend", "llama", "--model", model, "--threads", str(a.threads),
                           "--prompt-tokens", str(p), "--gen-tokens", str(g), "--runs", "1", "--json"]))


def llama_bench(a, model, test):
    """One llama-bench figure: `test` is ("pp", 512) or ("tg", 128)."""
    kind, n = test
    p, g = (n, 0) if kind == "pp" else (0, n)
    out = json.loads(run([a.llama_bench, "-m", model, "-t", str(a.threads), "-p", str(p), "-n", str(g),
                          "-r", "1", "-o", "json"]))
    return next(r["avg_ts"] for r in out if r["n_prompt"] == p and r["n_gen"] == g)


def ours(a, model, test):
    """Shoal's figure for the same test: prefill of the prompt, or decode after an 8-token one."""
    kind, n = test
    if kind == "pp":
        return shoal_bench(a, model, n, 2)["prefill_tok_s"]
    return shoal_bench(a, model, 8, n)["decode_tok_s"]


def ratio_cell(pairs):
    mine = statistics.median(x for x, _ in pairs)
    theirs = statistics.median(y for _, y in pairs)
    ratios = [x / y for x, y in pairs]
    spread = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else [ratios[0]] * 3
    return (f"{mine:7.1f}/{theirs:7.1f} {statistics.median(ratios):5.2f}x"
            f" [{spread[0]:4.2f}-{spread[2]:4.2f}]")


def part1(a):
    """Each pair is one figure from each side back to back, the order alternating, so a drift
    on this shared host falls on both; a single pair's ratio swings by 10-20% here, so a cell
    is the median of many pairs, with the middle half of the pairs' ratios in brackets."""
    pairs = max(a.runs * 3, 9)
    print(f"llama.cpp backend vs llama-bench (llama.cpp's default options), {a.threads} threads,"
          f" {pairs} interleaved pairs per cell; shoal/llama-bench tok/s, median ratio [quartiles]")
    print(f"{'model':40s} {'pp512':>34s} {'tg128':>34s}")
    tg128 = {}
    for m in a.models:
        cells = {}
        for test in (("pp", 512), ("tg", 128)):
            got = []
            for r in range(pairs):
                if r % 2 == 0:
                    o = ours(a, m, test)
                    t = llama_bench(a, m, test)
                else:
                    t = llama_bench(a, m, test)
                    o = ours(a, m, test)
                got.append((o, t))
            cells[test[0]] = got
        tg128[m] = statistics.median(y for _, y in cells["tg"])
        print(f"{os.path.basename(m)[:40]:40s} {ratio_cell(cells['pp']):>34s} {ratio_cell(cells['tg']):>34s}",
              flush=True)
    return tg128


def stream(url, path, body):
    """(seconds to the first text, seconds to the end, usage and timings events) of a stream."""
    req = urllib.request.Request(f"{url}{path}", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json", "anthropic-version": "2023-06-01"})
    start = time.perf_counter()
    first, finals = None, []
    with urllib.request.urlopen(req, timeout=1200) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            ev = json.loads(line[6:])
            text = (ev.get("delta", {}).get("text")
                    or (ev.get("choices") or [{}])[0].get("delta", {}).get("content"))
            if text and first is None:
                first = time.perf_counter() - start
            if "usage" in ev or "timings" in ev or ev.get("type") == "message_delta":
                finals.append(ev)
    return first, time.perf_counter() - start, finals


# The window both servers get in part 2: room for a 16k-token agent prompt.
AGENT_WINDOW = 32768


def filler(tag, sentences):
    body = " ".join(f"Entry {i}: the ferry left pier {i % 17} at {i % 12 + 1} o'clock with {i * 3 % 50} "
                    f"passengers and a cargo of {['apples', 'timber', 'copper', 'wool'][i % 4]}."
                    for i in range(sentences))
    return f"Log {tag}. {body}\n\nIn one sentence, what does this log record?"


def part2(a, shoal_cmd, llama_cmd):
    print(f"\ntime to first token through /v1/messages (streamed), {a.runs} interleaved pairs, both servers"
          f" with a window of {AGENT_WINDOW} positions: a ~4k-token prompt on every model, ~8k and ~16k"
          f" (agent sizes) on the agent model, Qwen2.5-Coder")
    print(f"{'model':40s} {'prompt':>7s} {'shoal ms':>9s} {'llama-server ms':>16s} {'llama/shoal':>12s}")
    cases = [(m, 140) for m in a.models if 140 in a.sizes]
    cases += [(m, n) for m in a.models if "qwen" in os.path.basename(m).lower()
              for n in a.sizes if n != 140]
    for m, sentences in cases:
        s = Server(shoal_cmd(m, 18941, [], AGENT_WINDOW), 18941)
        l = Server(llama_cmd(m, 18942, [], AGENT_WINDOW), 18942)
        try:
            pairs, tokens = [], 0
            for r in range(a.runs):
                def ask(server, who):
                    body = {"model": server.model(), "max_tokens": 8, "stream": True,
                            "messages": [{"role": "user", "content": filler(f"{who}-{r}-{time.time_ns()}", sentences)}]}
                    first, _, finals = stream(server.url, "/v1/messages", body)
                    return first, finals
                order = [(s, "shoal"), (l, "llama")] if r % 2 == 0 else [(l, "llama"), (s, "shoal")]
                try:
                    got = {who: ask(server, who) for server, who in order}
                except urllib.error.HTTPError as e:
                    # A base model without a chat template has no /v1/messages.
                    print(f"{os.path.basename(m)[:40]:40s} refused: {e.code} {e.read().decode()[:120]}")
                    break
                for ev in got["shoal"][1]:
                    tokens = ev.get("usage", {}).get("input_tokens") or tokens
                pairs.append((got["shoal"][0] * 1e3, got["llama"][0] * 1e3))
            if not pairs:
                continue
            ours = statistics.median(x for x, _ in pairs)
            theirs = statistics.median(y for _, y in pairs)
            print(f"{os.path.basename(m)[:40]:40s} {tokens:7d} {ours:9.0f} {theirs:16.0f}"
                  f" {statistics.median(y / x for x, y in pairs):11.2f}x", flush=True)
        finally:
            s.stop()
            l.stop()


def part3(a, shoal_cmd, llama_cmd, qwen, tg128):
    function = open(a.edit_file).read()
    print(f"\nspeculative decoding on {os.path.basename(qwen)}, greedy through /v1/chat/completions,"
          f" {a.runs} rounds (the order rotating); decode tok/s as the client sees it")
    servers = {
        "shoal drafts": Server(shoal_cmd(qwen, 18951, []), 18951),
        "shoal plain": Server(shoal_cmd(qwen, 18952, ["--draft", "off"]), 18952),
        "llama-server": Server(llama_cmd(qwen, 18953, []), 18953),
        "llama-server ngram": Server(llama_cmd(qwen, 18954, ["--spec-type", "ngram-simple",
                                                              "--spec-draft-n-max", "16"]), 18954),
    }
    try:
        for task, user, limit in (("code edit", EDIT.format(function=function), 640), ("open chat", CHAT, 256)):
            rates = {k: [] for k in servers}
            info = {}
            names = list(servers)
            for r in range(a.runs):
                for k in names[r % len(names):] + names[:r % len(names)]:
                    body = {"model": servers[k].model(), "messages": [{"role": "user", "content": user}], "max_tokens": limit,
                            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
                    first, end, finals = stream(servers[k].url, "/v1/chat/completions", body)
                    n = next((e["usage"]["completion_tokens"] for e in reversed(finals) if e.get("usage")), 0)
                    t = next((e["timings"] for e in reversed(finals) if e.get("timings")), {})
                    rates[k].append((n - 1) / (end - first) if first and n > 1 else 0.0)
                    info[k] = (n, t)
            med = {k: statistics.median(v) for k, v in rates.items()}
            with urllib.request.urlopen(f"{servers['shoal drafts'].url}/v1/usage?limit=1") as resp:
                led = json.load(resp)["data"][0]
            print(f"  {task}: {info['shoal drafts'][0]} tokens; Shoal kept {led['draft_accepted']} of"
                  f" {led['draft_tokens']} drafts; llama-server ngram kept"
                  f" {info['llama-server ngram'][1].get('draft_n_accepted', '?')} of"
                  f" {info['llama-server ngram'][1].get('draft_n', '?')}")
            print("    " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
            plain = med["shoal plain"] or 1.0
            print(f"    shoal drafts / shoal plain {med['shoal drafts'] / plain:.2f}x,"
                  f" / llama-bench tg128 ({tg128:.1f}) {med['shoal drafts'] / tg128:.2f}x,"
                  f" / llama-server ngram {med['shoal drafts'] / (med['llama-server ngram'] or 1.0):.2f}x,"
                  f" / llama-server {med['shoal drafts'] / (med['llama-server'] or 1.0):.2f}x", flush=True)
    finally:
        for s in servers.values():
            s.stop()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--llama-bench", required=True)
    ap.add_argument("--llama-server", required=True)
    ap.add_argument("--threads", type=int, required=True)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--edit-file", required=True)
    ap.add_argument("--parts", default="123")
    ap.add_argument("--sizes", default="140,280,560",
                    help="part 2's prompts in filler sentences (~28 tokens each): 140 on every model,"
                         " the others on Qwen2.5-Coder only")
    ap.add_argument("models", nargs="+")
    a = ap.parse_args()
    a.sizes = [int(x) for x in a.sizes.split(",") if x]
    a.models = [m for m in a.models if os.path.isfile(m)]
    qwen = next((m for m in a.models if "qwen" in os.path.basename(m).lower()), None)

    # Each Shoal server keeps its own store, so one's usage ledger holds only its own replies.
    stores_dir = tempfile.TemporaryDirectory(prefix="shoal-bench-")
    stores = stores_dir.name

    def shoal_cmd(m, port, extra, window=8192):
        return [a.shoal, "serve", "--backend", "llama", "--threads", str(a.threads), "--kv-cache-tokens", str(window),
                "--model", m, "--port", str(port), "--db", os.path.join(stores, f"{port}.sqlite"), *extra]

    def llama_cmd(m, port, extra, window=8192):
        return [a.llama_server, "-m", m, "-t", str(a.threads), "-c", str(window), "--parallel", "1",
                "--host", "127.0.0.1", "--port", str(port), *extra]

    tg128 = {}
    if "1" in a.parts:
        tg128 = part1(a)
    if "2" in a.parts:
        part2(a, shoal_cmd, llama_cmd)
    if "3" in a.parts and qwen:
        if qwen not in tg128:
            tg128[qwen] = llama_bench(a, qwen, ("tg", 128))
        part3(a, shoal_cmd, llama_cmd, qwen, tg128[qwen])


if __name__ == "__main__":
    sys.exit(main())
