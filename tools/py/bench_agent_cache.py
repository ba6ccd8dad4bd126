"""What an agent waits for a long prefix it sent before, `make bench`'s part on the prompt cache.

An agent-style prompt (a system prompt, a tool list and a file read, about --tokens tokens) goes
through Anthropic's /v1/messages, streamed, as Claude Code sends it, and the time to the first
text is measured:

1. cold: a new server with an empty cache (and, for the disk tier's own cost, the same prompt
   on a server with the disk tier off, in interleaved pairs: on/off should be >= 0.97x);
2. after a restart of the server (same data directory);
3. after the model is unloaded and loaded again (the reload's own time printed apart);
4. after switching to another model (--switch) and back, the first one unloaded meanwhile as a
   memory budget for one model would do;
5. two agents with different prefixes taking turns, a side request between turns, with a RAM
   tier too small for both (--prefix-cache-mb 64), so the disk tier serves; what their
   prefixes take on disk, where the blocks of the system prompt and tools they share are kept
   once;
6. bytes on disk per cached token, f16 and q8_0 KV.

Each figure is printed against the cold one; the target is <= 5% of cold. With --llama-server,
llama-server runs the same sequence (its restart and reload are cold again: it keeps nothing).
Figures, never assertions."""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
import urllib.error
import urllib.request

from bench_server import Server, free_port, scratch, shoal_cmd


def filler_file(tag: str, lines: int) -> str:
    """A source file the agent read: plausible Python, distinct per `tag`."""
    out = [f"# {tag}: inventory sync service", "import json", "import logging", ""]
    for i in range(lines):
        out.append(
            f"def sync_item_{tag}_{i}(store, item_id={i}, retries={i % 5}):\n"
            f"    \"\"\"Pulls item {i} from the warehouse and pushes it to shelf {i % 23}.\"\"\"\n"
            f"    record = store.fetch(item_id)\n"
            f"    if record is None or record.get('qty', 0) < {i % 7}:\n"
            f"        logging.warning('item %s short at shelf {i % 23}', item_id)\n"
            f"        return False\n"
            f"    return store.push(record, shelf={i % 23}, attempts=retries)\n"
        )
    return "\n".join(out)


SYSTEM = (
    "You are a coding agent working in a repository. Read files with the tools, make minimal, "
    "correct edits, explain each change in one sentence, and never invent APIs. "
) * 12

TOOLS = [
    {
        "name": name,
        "description": f"{name.replace('_', ' ')} in the workspace; paths are relative to its root.",
        "input_schema": {
            "type": "object",
            "properties": {
                "path": {"type": "string", "description": "a file path"},
                "content": {"type": "string", "description": "text to write or search for"},
            },
            "required": ["path"],
        },
    }
    for name in ["read_file", "write_file", "list_dir", "grep", "run_tests", "apply_patch"]
]


def agent_body(model: str, tag: str, lines: int, question: str) -> dict:
    return {
        "model": model,
        "max_tokens": 8,
        "stream": True,
        "temperature": 0,
        "system": SYSTEM,
        "tools": TOOLS,
        "messages": [
            {
                "role": "user",
                "content": f"Here is sync.py:\n```python\n{filler_file(tag, lines)}\n```\n\n{question}",
            }
        ],
    }


def stream(url: str, body: dict) -> tuple[float, dict]:
    """(seconds to the first event with output, the final usage) of a streamed /v1/messages."""
    req = urllib.request.Request(
        f"{url}/v1/messages",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json", "anthropic-version": "2023-06-01"},
    )
    start = time.perf_counter()
    first, usage = None, {}
    try:
        r = urllib.request.urlopen(req, timeout=3600)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{body['model']}: {e.code} {e.read().decode()[:300]}") from None
    with r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            ev = json.loads(line[6:])
            if first is None and ev.get("type") == "content_block_delta":
                first = time.perf_counter() - start
            if ev.get("type") == "message_start":
                usage.update(ev["message"].get("usage", {}))
            if ev.get("type") == "message_delta":
                usage.update(ev.get("usage", {}))
    return (first if first is not None else time.perf_counter() - start), usage


def get(url: str, path: str, method: str = "GET") -> dict:
    req = urllib.request.Request(f"{url}{path}", method=method)
    with urllib.request.urlopen(req, timeout=3600) as r:
        return json.load(r)


def pct(x: float, cold: float) -> str:
    return f"{x * 1e3:9.0f} ms  {100 * x / cold:6.1f}% of cold"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shoal", required=True)
    ap.add_argument("--model", required=True, help="the agent's model (a GGUF)")
    ap.add_argument("--switch", help="another GGUF to switch to and back")
    ap.add_argument("--llama-server")
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--lines", type=int, default=110, help="functions in the file read (~70 tokens each)")
    ap.add_argument("--pairs", type=int, default=3, help="interleaved pairs for the disk tier's cold cost")
    a = ap.parse_args()
    with scratch("shoal-bench-cache-") as data:
        # A model library of the bench's own, holding the model to switch to.
        os.environ["HF_HOME"] = os.path.join(data, "hf")
        if a.switch:
            repo = os.path.join(data, "hf", "hub", "models--local--switch")
            os.makedirs(os.path.join(repo, "snapshots", "0"), exist_ok=True)
            os.makedirs(os.path.join(repo, "refs"), exist_ok=True)
            with open(os.path.join(repo, "refs", "main"), "w") as f:
                f.write("0")
            os.symlink(os.path.realpath(a.switch), os.path.join(repo, "snapshots", "0", os.path.basename(a.switch)))

        def shoal(db: str, *extra: str) -> Server:
            port = free_port()
            return Server(shoal_cmd(a.shoal, a.model, port, db, a.threads, *extra), port)

        db = os.path.join(data, "store.sqlite")
        s = shoal(db)
        m = s.model()
        cold, u = stream(s.url, agent_body(m, "a", a.lines, "What does sync_item_a_3 do?"))
        tokens = u.get("input_tokens", 0) + u.get("cache_read_input_tokens", 0) + u.get("cache_creation_input_tokens", 0)
        print(f"\nthe prompt cache on {os.path.basename(a.model)}: an agent's {tokens}-token prompt through"
              f" /v1/messages (system, {len(TOOLS)} tools, a file), time to first token")
        print(f"  cold (empty cache)                 {cold * 1e3:9.0f} ms")
        s.stop()

        s = shoal(db)
        t, u = stream(s.url, agent_body(m, "a", a.lines, "What does sync_item_a_3 do?"))
        print(f"  after a restart                    {pct(t, cold)}  ({u.get('cache_read_input_tokens')} read from cache)")

        get(s.url, f"/v1/models/{m}/unload", "POST")
        t0 = time.perf_counter()
        get(s.url, f"/v1/models/{m}/load", "POST")
        reload = time.perf_counter() - t0
        t, u = stream(s.url, agent_body(m, "a", a.lines, "What does sync_item_a_3 do?"))
        print(f"  after unload + reload              {pct(t, cold)}  (the reload itself: {reload * 1e3:.0f} ms)")

        if a.switch:
            # The other model, in the server's model library (the hub cache layout): the
            # agent's model is unloaded first, as a memory budget for one model would.
            get(s.url, f"/v1/models/{m}/unload", "POST")
            # A raw completion: the switch model may be a base model with no chat template.
            req = urllib.request.Request(
                f"{s.url}/v1/completions",
                data=json.dumps({"model": "local/switch", "prompt": "Once upon a time", "max_tokens": 4}).encode(),
                headers={"content-type": "application/json"},
            )
            with urllib.request.urlopen(req, timeout=600) as r:
                r.read()
            get(s.url, "/v1/models/local/switch/unload", "POST")
            t, u = stream(s.url, agent_body(m, "a", a.lines, "What does sync_item_a_3 do?"))
            print(f"  after {'another model':20s} and back {pct(t, cold)}  ({os.path.basename(a.switch)})")
        s.stop()

        # Two agents with a RAM tier too small for both prefixes, a side request between turns.
        s = shoal(db, "--prefix-cache-mb", "64")
        turns = []
        for turn in range(3):
            for agent in ("a", "b"):
                t, u = stream(s.url, agent_body(m, agent, a.lines, f"What does sync_item_{agent}_{turn} do?"))
                if turn > 0:
                    turns.append(t)
                stream(s.url, {"model": m, "max_tokens": 4, "stream": True,
                               "messages": [{"role": "user", "content": f"Side question {turn}{agent}: say hi."}]})
        print(f"  two agents taking turns (median)   {pct(statistics.median(turns), cold)}"
              f"  (worst {100 * max(turns) / cold:.1f}%)")
        cache = get(s.url, "/v1/cache")
        entries = cache["entries"]
        s.stop()
        # The two agents share the system prompt and tool list: kept once, in blocks both hold.
        listed = sum(e["bytes"] for e in entries)
        print(f"  two agents' prefixes on disk       {cache['disk']['bytes'] / 2**20:9.1f} MiB in"
              f" {cache['disk']['blocks']} blocks, for {len(entries)} entries listing"
              f" {listed / 2**20:.1f} MiB (shared blocks counted in each)")
        per = [e["bytes"] / e["tokens"] for e in entries if e["tokens"]]
        if per:
            print(f"  bytes on disk per cached token     {statistics.median(per):9.0f} (f16 KV)")
        # A data directory of its own, so its disk tier holds only the q8_0 entry.
        os.makedirs(os.path.join(data, "q8"))
        q8db = os.path.join(data, "q8", "store.sqlite")
        s = shoal(q8db, "--kv-cache-type", "q8_0")
        stream(s.url, agent_body(m, "a", a.lines, "What does sync_item_a_3 do?"))
        s.stop()
        s = shoal(q8db, "--kv-cache-type", "q8_0")
        entries = get(s.url, "/v1/cache")["entries"]
        s.stop()
        per = [e["bytes"] / e["tokens"] for e in entries if e["tokens"]]
        if per:
            print(f"  bytes on disk per cached token     {statistics.median(per):9.0f} (q8_0 KV)")

        # The disk tier's cost to a cold request: on against off, interleaved, new prefixes each time.
        ratios = []
        for r in range(a.pairs):
            order = ["on", "off"] if r % 2 == 0 else ["off", "on"]
            got = {}
            for which in order:
                os.makedirs(os.path.join(data, f"pair-{r}-{which}"))
                d = os.path.join(data, f"pair-{r}-{which}", "store.sqlite")
                s = shoal(d, *([] if which == "on" else ["--cache-disk-mb", "off"]))
                got[which], _ = stream(s.url, agent_body(m, f"p{r}{which}", a.lines, "What does sync_item_3 do?"))
                s.stop()
            ratios.append(got["off"] / got["on"])
        print(f"  cold TTFT, disk tier on vs off     {statistics.median(ratios):9.2f}x"
              f" (off/on, {a.pairs} interleaved pairs; >= 0.97x means writing costs a cold request nothing)")

        if a.llama_server:
            lport = free_port()
            cmd = [a.llama_server, "-m", a.model, "-c", "32768", "--host", "127.0.0.1", "--port", str(lport)]
            if a.threads:
                cmd += ["-t", str(a.threads)]
            l = Server(cmd, lport)
            lm = l.model()
            lcold, _ = stream(l.url, agent_body(lm, "a", a.lines, "What does sync_item_a_3 do?"))
            again, _ = stream(l.url, agent_body(lm, "a", a.lines, "What does sync_item_a_3 do?"))
            l.stop()
            l = Server(cmd, lport)
            restart, _ = stream(l.url, agent_body(lm, "a", a.lines, "What does sync_item_a_3 do?"))
            l.stop()
            print(f"  llama-server, same sequence: cold {lcold * 1e3:.0f} ms, same prompt again"
                  f" {100 * again / lcold:.1f}%, after a restart {100 * restart / lcold:.1f}% of its cold"
                  f" (its cold over Shoal's: {lcold / cold:.2f}x, one unpaired sample; above 1, Shoal is sooner)")


if __name__ == "__main__":
    main()
