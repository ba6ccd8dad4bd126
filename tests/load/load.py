#!/usr/bin/env python3
"""Load test for `shoal serve`: many concurrent streaming clients over the three
chat dialects, with clients hanging up mid-stream, checked against the server's
own usage ledger.

    python tests/load/load.py [--seconds 60] [--clients 64] [--bin target/release/shoal]

What it does:
  1. Starts its own `shoal serve --port 0 --db <tmp> --queue 16 --max-batch 8
     --prefix-cache-mb 256`
     (HF_HOME an empty temp dir, loopback only; the model is whatever the
     server loads, i.e. $SHOAL_MODEL or its default) and always stops it.
  2. Warms up (a few requests, one by one and then a batch at once), fills
     the prefix cache to its budget with distinct long prompts (a bounded
     store that fills by design, so it is full on both sides of the
     comparison), then reads the server's RSS (/proc/<pid>/status VmRSS) as
     the baseline.
  3. Runs N concurrent streaming clients for a bounded time, spread evenly over
     OpenAI Chat (stream_options.include_usage), OpenAI Responses and Anthropic
     Messages. Each loops: a short prompt, random max_tokens in 8..64, and in
     30% of the requests a planned hang-up after a random number of SSE data
     events. Queue overflows (429 / 529) are retried after `retry-after`.
  4. Checks: well-formed streams whose usage equals the ledger entry for their
     response id; planned hang-ups recorded as `cancelled` (or finished before
     the hang-up); no 5xx; 429/529 only with retry-after on the right routes;
     raw RSS back within 10% of the baseline once the server is idle.
  5. Prints a summary and a final `load: PASS` or `load: FAIL (reasons)`;
     exits 1 on failure.

SSE is parsed by hand over streaming HTTP (httpx, or the httpx2 fork the test
venv ships), so the script decides exactly when a connection is closed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

try:
    import httpx
except ImportError:  # the project venv ships the maintained fork under this name
    import httpx2 as httpx  # type: ignore[no-redef]

REPO = Path(__file__).resolve().parents[2]
LISTEN_RE = re.compile(r"shoal listening on (http://\S+) \(model (.+)\)")
STARTUP_TIMEOUT_S = 180.0
MIB = 1024 * 1024

DIALECTS = ("chat", "responses", "messages")
LEDGER_DIALECT = {"chat": "openai.chat", "responses": "openai.responses", "messages": "anthropic.messages"}
PATHS = {"chat": "/v1/chat/completions", "responses": "/v1/responses", "messages": "/v1/messages"}
# Overload status per dialect (OpenAI routes 429, Anthropic 529).
OVERLOAD_STATUS = {"chat": 429, "responses": 429, "messages": 529}
# Data events each dialect sends before its first content delta; a planned
# hang-up happens after PREAMBLE + randint(0, max_tokens - 1) data events.
PREAMBLE = {"chat": 1, "responses": 4, "messages": 3}

PROMPTS = [
    "Write a short story about a dragon who learns to bake bread.",
    "Explain how a bicycle works.",
    "Describe a walk along the sea at dawn.",
    "Write a poem about autumn leaves.",
    "Tell me about the history of the printing press.",
    "Give me some tips for learning to cook.",
    "Describe your favourite city and why you like it.",
    "Explain why the sky is blue.",
    "Write a letter to a friend about a summer holiday.",
    "List some fun things to do on a rainy day.",
]


# --------------------------------------------------------------------------- server


class Server:
    """`shoal serve` on loopback, with a temporary store and an empty HF_HOME."""

    def __init__(self, binary: Path, extra: list[str]):
        self.tmp = Path(tempfile.mkdtemp(prefix="shoal-load-"))
        hf_home = self.tmp / "hf-home"
        hf_home.mkdir()
        self.log_path = self.tmp / "server.log"
        env = {**os.environ, "HF_HOME": str(hf_home)}
        # Never a proxy: the test talks to loopback only.
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"):
            env.pop(k, None)
        cmd = [str(binary), "serve", "--host", "127.0.0.1", "--port", "0",
               "--db", str(self.tmp / "conversations.sqlite"), *extra]
        self.cmd = cmd
        log_fh = open(self.log_path, "wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=log_fh,
                                     stdin=subprocess.DEVNULL)
        log_fh.close()
        self.url = ""
        self.model = ""
        ready = threading.Event()

        def pump() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:  # keeps draining so the pipe never fills
                m = LISTEN_RE.search(raw.decode(errors="replace"))
                if m and not ready.is_set():
                    self.url, self.model = m.group(1), m.group(2)
                    ready.set()
            ready.set()

        threading.Thread(target=pump, daemon=True).start()
        ready.wait(STARTUP_TIMEOUT_S)
        if not self.url:
            tail = self.log_tail()
            self.stop()
            self.cleanup(keep=False)
            raise RuntimeError(f"shoal serve did not report its address (exit {self.proc.returncode}); "
                               f"log tail:\n{tail}")
        if not re.match(r"http://(127\.\d+\.\d+\.\d+|\[::1\]|localhost):\d+$", self.url):
            self.stop()
            self.cleanup(keep=False)
            raise RuntimeError(f"server is not on loopback: {self.url}")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_kb(self) -> int:
        with open(f"/proc/{self.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
        raise RuntimeError("no VmRSS in /proc status")

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)

    def cleanup(self, keep: bool) -> None:
        if not keep:
            shutil.rmtree(self.tmp, ignore_errors=True)


# --------------------------------------------------------------------------- one request


@dataclass
class Rec:
    """One HTTP attempt."""
    client: int
    dialect: str
    max_tokens: int
    disconnect_after: int | None  # planned hang-up after this many data events
    t_send: float = 0.0  # wall clock
    t_end: float = 0.0
    status: int | None = None
    retry_after: str | None = None
    error_body: str = ""
    ttft: float | None = None  # seconds to the first content delta
    id: str | None = None
    usage: dict | None = None
    finish: str | None = None  # the stream's own stop reason / status
    complete: bool = False  # saw the dialect's terminal event
    hung_up: bool = False  # the client closed the connection before the end
    t_close: float | None = None  # wall clock of the hang-up
    data_events: int = 0
    content_deltas: int = 0
    problems: list[str] = field(default_factory=list)  # malformed stream
    exc: str | None = None  # transport error on an unplanned path

    @property
    def planned(self) -> bool:
        return self.disconnect_after is not None


def request_body(dialect: str, model: str, prompt: str, max_tokens: int) -> dict:
    msgs = [{"role": "user", "content": prompt}]
    if dialect == "chat":
        return {"model": model, "messages": msgs, "max_tokens": max_tokens, "stream": True,
                "stream_options": {"include_usage": True}}
    if dialect == "responses":
        return {"model": model, "input": prompt, "max_output_tokens": max_tokens, "stream": True}
    return {"model": model, "messages": msgs, "max_tokens": max_tokens, "stream": True}


class StreamChecker:
    """Follows one dialect's event sequence and notes anything out of order."""

    def __init__(self, rec: Rec, t0: float):
        self.rec = rec
        self.t0 = t0
        self.events: list[tuple[str | None, str]] = []
        self.after_end = False
        # chat
        self.finish_seen = False
        self.usage_seen = False
        # responses
        self.seq = 0
        self.text = ""
        # messages
        self.state = "start"

    def bad(self, msg: str) -> None:
        if len(self.rec.problems) < 5:
            self.rec.problems.append(msg)

    def content(self) -> None:
        self.rec.content_deltas += 1
        if self.rec.ttft is None:
            self.rec.ttft = time.monotonic() - self.t0

    def feed(self, event: str | None, data: str) -> None:
        r = self.rec
        r.data_events += 1
        if self.after_end:
            self.bad(f"data after the end of the stream: {data[:80]!r}")
            return
        if r.dialect == "chat":
            self.feed_chat(event, data)
        elif r.dialect == "responses":
            self.feed_responses(event, data)
        else:
            self.feed_messages(event, data)

    def parse(self, data: str) -> Any:
        try:
            return json.loads(data)
        except ValueError:
            self.bad(f"data is not JSON: {data[:80]!r}")
            return None

    # OpenAI Chat: chunks (role first), one finish_reason, a usage chunk, [DONE].
    def feed_chat(self, event: str | None, data: str) -> None:
        r = self.rec
        if data == "[DONE]":
            if not self.finish_seen:
                self.bad("[DONE] before a finish_reason")
            if not self.usage_seen:
                self.bad("[DONE] without a usage chunk")
            self.after_end = True
            r.complete = True
            return
        c = self.parse(data)
        if not isinstance(c, dict):
            return
        if c.get("object") != "chat.completion.chunk":
            self.bad(f"object is {c.get('object')!r}")
        if "error" in c:
            self.bad(f"error chunk: {data[:200]}")
        cid = c.get("id")
        if r.id is None:
            r.id = cid
        elif cid != r.id:
            self.bad(f"chunk id changed {r.id} -> {cid}")
        if self.usage_seen:
            self.bad("chunk after the usage chunk")
        choices = c.get("choices")
        if choices == [] and isinstance(c.get("usage"), dict):
            if not self.finish_seen:
                self.bad("usage chunk before finish_reason")
            self.usage_seen = True
            r.usage = c["usage"]
            return
        if c.get("usage") is not None:
            self.bad(f"usage on a content chunk: {c.get('usage')}")
        if not isinstance(choices, list) or len(choices) != 1:
            self.bad(f"choices: {choices!r}")
            return
        ch = choices[0]
        delta = ch.get("delta") or {}
        if r.data_events == 1 and delta.get("role") != "assistant":
            self.bad("first chunk has no assistant role")
        if self.finish_seen:
            self.bad("chunk after finish_reason")
        if delta.get("content"):
            self.content()
        if ch.get("finish_reason") is not None:
            self.finish_seen = True
            r.finish = ch["finish_reason"]

    # OpenAI Responses: created, in_progress, ..., completed/incomplete with usage.
    def feed_responses(self, event: str | None, data: str) -> None:
        r = self.rec
        d = self.parse(data)
        if not isinstance(d, dict):
            return
        typ = d.get("type")
        if event is not None and event != typ:
            self.bad(f"event {event!r} carries type {typ!r}")
        if d.get("sequence_number") != self.seq:
            self.bad(f"sequence_number {d.get('sequence_number')} where {self.seq} was due")
        self.seq += 1
        if self.seq == 1:
            if typ != "response.created":
                self.bad(f"first event is {typ!r}")
            r.id = (d.get("response") or {}).get("id")
            return
        if typ == "response.output_text.delta":
            self.text += d.get("delta") or ""
            self.content()
        elif typ == "response.output_text.done":
            if d.get("text") != self.text:
                self.bad("output_text.done text differs from the deltas")
        elif typ in ("response.completed", "response.incomplete"):
            resp = d.get("response") or {}
            if resp.get("id") != r.id:
                self.bad(f"final response id {resp.get('id')} != {r.id}")
            if not isinstance(resp.get("usage"), dict):
                self.bad(f"{typ} without usage")
            r.usage = resp.get("usage")
            r.finish = resp.get("status")
            if resp.get("status") == "incomplete":
                r.finish = "incomplete:" + str((resp.get("incomplete_details") or {}).get("reason"))
            self.after_end = True
            r.complete = True
        elif typ in ("response.failed", "error"):
            self.bad(f"{typ}: {data[:200]}")
            self.after_end = True

    # Anthropic: message_start, content blocks, message_delta (usage), message_stop.
    def feed_messages(self, event: str | None, data: str) -> None:
        r = self.rec
        d = self.parse(data)
        if not isinstance(d, dict):
            return
        typ = d.get("type")
        if event is not None and event != typ:
            self.bad(f"event {event!r} carries type {typ!r}")
        if typ == "ping":
            return
        if typ == "error":
            self.bad(f"error event: {data[:200]}")
            self.after_end = True
            return
        st = self.state
        if typ == "message_start":
            if st != "start":
                self.bad("message_start twice")
            r.id = (d.get("message") or {}).get("id")
            self.state = "message"
        elif typ == "content_block_start":
            if st != "message":
                self.bad(f"content_block_start in state {st}")
            self.state = "block"
        elif typ == "content_block_delta":
            if st != "block":
                self.bad(f"content_block_delta in state {st}")
            delta = d.get("delta") or {}
            if delta.get("type") == "text_delta" and delta.get("text"):
                self.content()
        elif typ == "content_block_stop":
            if st != "block":
                self.bad(f"content_block_stop in state {st}")
            self.state = "message"
        elif typ == "message_delta":
            if st != "message":
                self.bad(f"message_delta in state {st}")
            if not isinstance(d.get("usage"), dict):
                self.bad("message_delta without usage")
            r.usage = d.get("usage")
            r.finish = (d.get("delta") or {}).get("stop_reason")
            self.state = "delta"
        elif typ == "message_stop":
            if st != "delta":
                self.bad(f"message_stop in state {st} (no message_delta before it)")
            self.state = "stopped"
            self.after_end = True
            r.complete = True
        else:
            self.bad(f"unexpected event type {typ!r}")


async def one_request(http: httpx.AsyncClient, base: str, model: str, rec: Rec, prompt: str) -> None:
    body = request_body(rec.dialect, model, prompt, rec.max_tokens)
    headers = {"content-type": "application/json"}
    if rec.dialect == "messages":
        headers["anthropic-version"] = "2023-06-01"
        headers["x-api-key"] = "shoal-load"
    else:
        headers["authorization"] = "Bearer shoal-load"
    rec.t_send = time.time()
    t0 = time.monotonic()
    chk = StreamChecker(rec, t0)
    try:
        async with http.stream("POST", base + PATHS[rec.dialect], json=body, headers=headers) as resp:
            rec.status = resp.status_code
            if resp.status_code != 200:
                rec.retry_after = resp.headers.get("retry-after")
                rec.error_body = (await resp.aread()).decode(errors="replace")[:300]
                return
            ctype = resp.headers.get("content-type", "")
            if not ctype.startswith("text/event-stream"):
                rec.problems.append(f"content-type {ctype!r}")
            event: str | None = None
            data: list[str] = []
            async for line in resp.aiter_lines():
                if line == "":
                    if data:
                        chk.feed(event, "\n".join(data))
                        if rec.planned and not chk.after_end and rec.data_events >= rec.disconnect_after:
                            # Hang up: leaving the block with the body unread closes the
                            # connection (it cannot go back to the pool).
                            rec.hung_up = True
                            rec.t_close = time.time()
                            break
                    event, data = None, []
                elif line.startswith(":"):
                    continue  # keep-alive comment
                elif line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    data.append(line[5:].lstrip(" "))
            if not rec.hung_up and data:
                chk.feed(event, "\n".join(data))
            if not rec.hung_up and not rec.complete:
                rec.problems.append("stream ended without the dialect's final event")
    except (httpx.HTTPError, OSError) as e:
        rec.exc = f"{type(e).__name__}: {e}"
    finally:
        rec.t_end = time.time()


# --------------------------------------------------------------------------- run


def parse_retry_after(v: str | None) -> float | None:
    if v is None:
        return None
    try:
        s = float(v)
        return s if s >= 0 and math.isfinite(s) else None
    except ValueError:
        pass
    try:
        from email.utils import parsedate_to_datetime
        return max(0.0, parsedate_to_datetime(v).timestamp() - time.time())
    except (TypeError, ValueError):
        return None


class Run:
    def __init__(self, args: argparse.Namespace, srv: Server):
        self.args = args
        self.srv = srv
        self.recs: list[Rec] = []
        self.ledger: dict[str, dict] = {}
        self.ledger_dupes: set[str] = set()
        self.rng = random.Random(args.seed)
        self.retry_waits: list[float] = []
        self.gave_up_at_deadline = 0

    async def poll_ledger(self, http: httpx.AsyncClient) -> None:
        r = await http.get(self.srv.url + "/v1/usage?limit=1000", timeout=30)
        r.raise_for_status()
        ids = Counter()
        for e in r.json()["data"]:
            ids[e["id"]] += 1
            self.ledger[e["id"]] = e
        self.ledger_dupes.update(i for i, n in ids.items() if n > 1)

    async def ledger_poller(self, http: httpx.AsyncClient, stop: asyncio.Event) -> None:
        # The ledger is a ring; reading it as we go keeps every entry even if it wraps.
        while not stop.is_set():
            try:
                await self.poll_ledger(http)
            except (httpx.HTTPError, OSError, ValueError):
                pass
            try:
                await asyncio.wait_for(stop.wait(), 2.0)
            except asyncio.TimeoutError:
                pass

    async def client(self, http: httpx.AsyncClient, idx: int, dialect: str, deadline: float) -> None:
        rng = random.Random(self.rng.random())
        while time.monotonic() < deadline:
            prompt = rng.choice(PROMPTS)
            max_tokens = rng.randint(8, 64)
            planned = rng.random() < self.args.disconnect_rate
            after = PREAMBLE[dialect] + rng.randint(0, max_tokens - 1) if planned else None
            while True:  # retries of the same request after an overload
                rec = Rec(idx, dialect, max_tokens, after)
                self.recs.append(rec)
                await one_request(http, self.srv.url, self.srv.model, rec, prompt)
                if rec.status in (429, 529):  # overloaded (checked per route in the report)
                    wait = parse_retry_after(rec.retry_after)
                    if wait is None:
                        wait = 1.0  # reported as a failure; back off anyway
                    # Honour retry-after, with a little jitter so the herd spreads out.
                    wait += rng.uniform(0, 0.25)
                    self.retry_waits.append(wait)
                    if time.monotonic() + wait >= deadline:
                        self.gave_up_at_deadline += 1
                        return
                    await asyncio.sleep(wait)
                    continue
                break
            if rec.status is None or rec.exc:
                await asyncio.sleep(0.2)  # transport error: do not spin

    async def warmup(self, http: httpx.AsyncClient) -> list[Rec]:
        recs = []
        for i, d in enumerate(DIALECTS):  # one by one
            rec = Rec(-1, d, 16, None)
            await one_request(http, self.srv.url, self.srv.model, rec, PROMPTS[i])
            recs.append(rec)
        batch = [Rec(-1, DIALECTS[i % 3], 24, None) for i in range(self.args.max_batch)]
        await asyncio.gather(*(one_request(http, self.srv.url, self.srv.model, r, PROMPTS[i % len(PROMPTS)])
                               for i, r in enumerate(batch)))
        recs += batch
        return recs

    async def fill_prefix_cache(self, http: httpx.AsyncClient) -> tuple[list[Rec], int]:
        """Sends distinct ~200-token prompts, four at a time, until /health shows
        the prefix cache within 90% of its budget (or 25 rounds). Returns the
        requests and the cache's bytes."""
        budget = self.args.prefix_cache_mb * MIB
        rng = random.Random(self.args.seed)
        words = "sea river stone cloud bread lamp garden window winter music paper road".split()
        recs: list[Rec] = []
        cached = 0
        for _ in range(25):
            _, state = await self.engine_idle(http)
            cached = int(state["engine"].get("prefix_cache_bytes", 0))
            if cached >= 0.9 * budget:
                break
            batch = []
            for j in range(len(recs), len(recs) + 4):
                text = f"Note {j}: " + " ".join(rng.choice(words) for _ in range(180))
                batch.append((Rec(-1, DIALECTS[j % 3], 4, None), text))
            await asyncio.gather(*(one_request(http, self.srv.url, self.srv.model, r, t) for r, t in batch))
            recs += [r for r, _ in batch]
        return recs, cached

    async def engine_idle(self, http: httpx.AsyncClient) -> tuple[bool, dict]:
        h = (await http.get(self.srv.url + "/health", timeout=10)).json()
        m = (await http.get(self.srv.url + "/metrics", timeout=10)).text
        gauges = {}
        for line in m.splitlines():
            for g in ("shoal_queue_depth", "shoal_requests_in_flight"):
                if line.startswith(g + " ") or line.startswith(g + "{"):
                    gauges[g] = gauges.get(g, 0) + float(line.split()[-1])
        idle = all(v == 0 for v in gauges.values()) and len(gauges) == 2
        return idle, {"engine": h.get("engine", {}), **gauges}

    async def main(self) -> int:
        a = self.args
        limits = httpx.Limits(max_connections=a.clients * 2 + 16, max_keepalive_connections=a.clients * 2)
        timeout = httpx.Timeout(connect=10, read=120, write=30, pool=60)
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http:
            # 2. warm up, baseline RSS
            warm = await self.warmup(http)
            filled, cached = await self.fill_prefix_cache(http)
            warm += filled
            print(f"load: prefix cache filled to {cached / MIB:.1f} of {a.prefix_cache_mb} MiB "
                  f"with {len(filled)} distinct prompts", flush=True)
            bad_warm = [r for r in warm if r.status != 200 or not r.complete or r.problems or r.exc]
            if bad_warm:
                r = bad_warm[0]
                print(f"load: warm-up request failed: {r.dialect} status={r.status} exc={r.exc} "
                      f"problems={r.problems} body={r.error_body}")
            for _ in range(40):
                idle, _ = await self.engine_idle(http)
                if idle:
                    break
                await asyncio.sleep(0.25)
            await asyncio.sleep(1.0)
            _, state = await self.engine_idle(http)
            self.rss_base = self.srv.rss_kb() * 1024
            self.health_base = state["engine"]
            self.cache_base = int(self.health_base.get("prefix_cache_bytes", 0))
            print(f"load: server pid {self.srv.pid} at {self.srv.url}, model {self.srv.model}; "
                  f"RSS baseline {self.rss_base / MIB:.1f} MiB (prefix cache {self.cache_base / MIB:.1f} MiB) "
                  f"after {len(warm)} warm-up requests", flush=True)

            # 3. the load
            print(f"load: {a.clients} streaming clients for {a.seconds:g} s "
                  f"({a.disconnect_rate:.0%} planned hang-ups) ...", flush=True)
            stop = asyncio.Event()
            poller = asyncio.create_task(self.ledger_poller(http, stop))
            t_start = time.monotonic()
            deadline = t_start + a.seconds
            tasks = [asyncio.create_task(self.client(http, i, DIALECTS[i % 3], deadline))
                     for i in range(a.clients)]
            progress = asyncio.create_task(self.progress(t_start, deadline))
            done, pending = await asyncio.wait(tasks, timeout=a.seconds + a.drain_seconds)
            for t in pending:
                t.cancel()
            self.stuck = len(pending)
            await asyncio.gather(*pending, return_exceptions=True)
            for t in done:
                if t.exception() is not None:
                    raise t.exception()
            self.elapsed = time.monotonic() - t_start
            progress.cancel()
            stop.set()
            await poller

            # 4. settle: engine idle, ledger complete, RSS steady
            t_settle = time.monotonic()
            self.idle = False
            last_engine = None
            self.idle_state: dict = {}
            while True:
                idle, state = await self.engine_idle(http)
                self.rss_after = self.srv.rss_kb() * 1024
                steady = state["engine"] == last_engine
                last_engine = state["engine"]
                self.idle_state = state
                self.cache_after = int(state["engine"].get("prefix_cache_bytes", 0))
                if idle and steady:
                    self.idle = True
                    # Settled once back within the limit; else keep waiting up to the settle time.
                    if self.rss_ok():
                        break
                if time.monotonic() - t_settle >= a.settle_seconds:
                    break
                await asyncio.sleep(0.5)
            self.settle_secs = time.monotonic() - t_settle
            await self.poll_ledger(http)
            self.health = self.idle_state.get("engine", {})
        return self.report(warm)

    def rss_ok(self) -> bool:
        """Raw RSS after the run within the tolerance of the baseline, which was
        taken with the prefix cache already full."""
        return self.rss_after <= self.rss_base * (1 + self.args.rss_tolerance)

    async def progress(self, t_start: float, deadline: float) -> None:
        while True:
            await asyncio.sleep(10)
            ok = sum(1 for r in self.recs if r.complete)
            hung = sum(1 for r in self.recs if r.hung_up)
            over = sum(1 for r in self.recs if r.status in (429, 529))
            print(f"load:   t={time.monotonic() - t_start:5.1f}s  completed {ok}  hung up {hung}  "
                  f"overloaded {over}  ledger {len(self.ledger)}", flush=True)

    # ----------------------------------------------------------------------- verdict

    def report(self, warm: list[Rec]) -> int:
        a = self.args
        recs = self.recs
        fails: list[str] = []
        # Everything seen, for a look afterwards (kept with --keep-tmp or on failure).
        try:
            from dataclasses import asdict
            (self.srv.tmp / "records.json").write_text(json.dumps(
                {"records": [asdict(r) for r in recs], "ledger": self.ledger}, indent=1))
        except OSError:
            pass
        lines: list[str] = []

        def check(name: str, ok: bool, detail: str, examples: list[str] | None = None) -> None:
            lines.append(f"  [{'ok' if ok else 'FAIL'}] {name}: {detail}")
            for ex in (examples or [])[:5]:
                lines.append(f"         - {ex}")
            if not ok:
                fails.append(name)

        def usage_tokens(u: dict | None) -> int:
            if not u:
                return 0
            return int(u.get("completion_tokens", u.get("output_tokens", 0)) or 0)

        def desc(r: Rec) -> str:
            return (f"{r.dialect} id={r.id} max_tokens={r.max_tokens} status={r.status} "
                    f"events={r.data_events} deltas={r.content_deltas}"
                    + (f" hang-up after {r.disconnect_after}" if r.planned else ""))

        started = [r for r in recs if r.status == 200]
        overloaded = [r for r in recs if r.status in (429, 529)]
        completed = [r for r in started if r.complete]
        hung = [r for r in started if r.hung_up]

        # -- well-formed streams, usage = ledger
        malformed = [r for r in started if r.problems]
        cut = [r for r in started if not r.complete and not r.hung_up]
        check("well-formed streams", not malformed and not cut,
              f"{len(completed)} completed, {len(malformed)} malformed, {len(cut)} cut off "
              f"(not by the client)",
              [f"{desc(r)}: {'; '.join(r.problems) or r.exc or 'no final event'}" for r in malformed + cut])
        missing, mismatched, wrong_meta = [], [], []
        for r in completed:
            e = self.ledger.get(r.id or "")
            if e is None:
                missing.append(desc(r))
            elif e.get("usage") != r.usage:
                mismatched.append(f"{desc(r)}: streamed {json.dumps(r.usage)} ledger {json.dumps(e.get('usage'))}")
            elif (e.get("dialect") != LEDGER_DIALECT[r.dialect] or e.get("stream") is not True
                  or e.get("finish_reasons") != [r.finish]):
                wrong_meta.append(f"{desc(r)}: streamed finish {r.finish!r}; ledger dialect "
                                  f"{e.get('dialect')} stream {e.get('stream')} finish {e.get('finish_reasons')}")
        check("streamed usage = ledger", not (missing or mismatched or wrong_meta),
              f"{len(completed) - len(missing) - len(mismatched) - len(wrong_meta)}/{len(completed)} match, "
              f"{len(missing)} missing from the ledger, {len(mismatched)} differ, {len(wrong_meta)} wrong "
              f"dialect/stream/finish",
              missing + mismatched + wrong_meta)
        check("ledger ids unique", not self.ledger_dupes, f"{len(self.ledger_dupes)} duplicated ids",
              sorted(self.ledger_dupes))

        # -- planned hang-ups
        cancelled, early, no_entry, late, bad_cancel = [], [], [], [], []
        for r in hung:
            e = self.ledger.get(r.id or "")
            if e is None:
                no_entry.append(desc(r))
                continue
            fr = e.get("finish_reasons") or []
            toks = usage_tokens(e.get("usage"))
            if fr == ["cancelled"]:
                cancelled.append(r)
                if toks < r.content_deltas:
                    bad_cancel.append(f"{desc(r)}: ledger says {toks} tokens, the client read "
                                      f"{r.content_deltas} content deltas")
                continue
            # Not cancelled: fine only if the generation had ended (everything was already
            # written) before the server could notice the hang-up, which it does on a failed
            # write, a token or two later. Estimate the generation's end from the ledger.
            rate = e.get("decode_tokens_per_s") or 0.0
            gen_end = r.t_send + (e.get("ttft_ms") or 0.0) / 1000 + (max(toks - 1, 0) / rate if rate > 0 else 0.0)
            per_token = 1 / rate if rate > 0 else 0.0
            slack = a.hangup_slack + 3 * per_token
            if gen_end <= r.t_close + slack:
                early.append(r)
            else:
                late.append(f"{desc(r)}: hung up at +{r.t_close - r.t_send:.2f}s, ledger finish {fr} "
                            f"with {toks} tokens; generation ended ~+{gen_end - r.t_send:.2f}s "
                            f"({gen_end - r.t_close:.2f}s after the hang-up)")
        check("hang-ups recorded as cancelled", not (no_entry or late or bad_cancel),
              f"{len(hung)} hang-ups: {len(cancelled)} cancelled, {len(early)} ended before the server could notice, "
              f"{len(no_entry)} missing from the ledger, {len(late)} not cancelled although still generating, "
              f"{len(bad_cancel)} with fewer tokens than delivered",
              no_entry + late + bad_cancel)

        # -- statuses
        fivexx = [r for r in recs if r.status is not None and r.status >= 500
                  and not (r.status == 529 and r.dialect == "messages")]
        check("no 5xx", not fivexx, f"{len(fivexx)} 5xx responses (529 on /v1/messages excluded)",
              [f"{desc(r)}: {r.error_body}" for r in fivexx])
        wrong_over, no_retry = [], []
        for r in overloaded:
            if r.status != OVERLOAD_STATUS[r.dialect]:
                wrong_over.append(f"{desc(r)}: expected {OVERLOAD_STATUS[r.dialect]}")
            if parse_retry_after(r.retry_after) is None:
                no_retry.append(f"{desc(r)}: retry-after {r.retry_after!r}")
            try:
                err = json.loads(r.error_body).get("error") or {}
                want = "rate_limit_error" if r.dialect != "messages" else "overloaded_error"
                if err.get("type") != want:
                    wrong_over.append(f"{desc(r)}: error type {err.get('type')!r}, expected {want}")
            except (ValueError, AttributeError):
                wrong_over.append(f"{desc(r)}: body is not a JSON error: {r.error_body[:100]!r}")
        n429 = sum(1 for r in overloaded if r.status == 429)
        n529 = sum(1 for r in overloaded if r.status == 529)
        check("overload answers", not (wrong_over or no_retry),
              f"{n429} x 429, {n529} x 529, {len(no_retry)} without a usable retry-after, "
              f"{len(wrong_over)} with the wrong status or body; retried after "
              f"{(statistics.mean(self.retry_waits) if self.retry_waits else 0):.2f} s on average",
              wrong_over + no_retry)
        other = [r for r in recs if r.status not in (None, 200, 429, 529) and r.status < 500]
        transport = [r for r in recs if r.status is None]
        check("no other errors", not other and not transport and not self.stuck,
              f"{len(other)} other 4xx, {len(transport)} transport errors before a status, "
              f"{self.stuck} clients still busy {a.drain_seconds:g} s after the end",
              [f"{desc(r)}: {r.error_body or r.exc}" for r in other + transport])

        # -- RSS
        growth = (self.rss_after - self.rss_base) / self.rss_base
        budget = a.prefix_cache_mb * MIB
        check("prefix cache full at the baseline", self.cache_base >= 0.9 * budget,
              f"{self.cache_base / MIB:.1f} of {a.prefix_cache_mb} MiB before the load (at least 90% "
              f"needed, or the cache filling up would count as growth)")
        check("idle after the run", self.idle,
              f"engine idle after {self.settle_secs:.1f} s: {self.idle} "
              f"(queue {self.idle_state.get('shoal_queue_depth')}, in flight "
              f"{self.idle_state.get('shoal_requests_in_flight')})")
        rss_detail = (f"RSS baseline {self.rss_base / MIB:.1f} MiB, after {self.rss_after / MIB:.1f} MiB "
                      f"({growth:+.1%}, limit +{a.rss_tolerance:.0%}); prefix cache "
                      f"{self.cache_base / MIB:.1f} / {self.cache_after / MIB:.1f} MiB")
        check("RSS back near baseline", self.rss_ok(), rss_detail)

        # -- summary
        out = ["", f"load: summary ({self.elapsed:.1f} s of load, {a.clients} clients, "
                   f"server --queue {a.queue} --max-batch {a.max_batch})"]
        out.append(f"  {'dialect':<10} {'attempts':>8} {'started':>8} {'completed':>9} {'cancelled':>9} "
                   f"{'early-end':>9} {'overload':>8} {'tokens':>7} {'TTFT p50':>9} {'TTFT p99':>9}")
        cancelled_ids = {id(r) for r in cancelled}
        early_ids = {id(r) for r in early}
        all_ttft = []
        total_tokens = 0
        for d in DIALECTS + ("all",):
            rs = [r for r in recs if d == "all" or r.dialect == d]
            st = [r for r in rs if r.status == 200]
            cp = [r for r in st if r.complete]
            tt = sorted(r.ttft for r in st if r.ttft is not None)
            toks = sum(usage_tokens(r.usage) for r in cp)
            if d == "all":
                all_ttft, total_tokens = tt, toks
            out.append(f"  {d:<10} {len(rs):>8} {len(st):>8} {len(cp):>9} "
                       f"{sum(1 for r in st if id(r) in cancelled_ids):>9} "
                       f"{sum(1 for r in st if id(r) in early_ids):>9} "
                       f"{sum(1 for r in rs if r.status in (429, 529)):>8} {toks:>7} "
                       f"{pct(tt, 50):>9} {pct(tt, 99):>9}")
        out.append("  (completed: streams that reached their final event; cancelled: hang-ups the ledger "
                   "shows as cancelled;")
        out.append(f"   early-end: hang-ups whose generation ended before the server could notice them (within "
                   f"{a.hangup_slack:g} s + 3 tokens), ledger")
        out.append("   shows the normal finish; TTFT in ms to the first content delta, queue wait included)")
        planned = [r for r in recs if r.planned and r.status == 200]
        out.append(f"  planned hang-ups: {len(planned)} requests, {len(hung)} hung up, "
                   f"{len(planned) - len(hung)} ended before reaching their hang-up point")
        out.append(f"  throughput: {len(completed) / self.elapsed:.2f} completed requests/s, "
                   f"{total_tokens / self.elapsed:.1f} completion tokens/s "
                   f"(completed streams, from their usage)")
        by_status = Counter(r.status for r in recs if r.status != 200)
        by_status_txt = ", ".join(f"{s if s is not None else 'none'}: {n}" for s, n in sorted(by_status.items(), key=str))
        out.append(f"  non-200 answers by status: {by_status_txt or 'none'} (429 {n429}, 529 {n529}); "
                   f"overloaded clients that stopped at the deadline: {self.gave_up_at_deadline}")
        out.append(f"  RSS: baseline {self.rss_base / MIB:.1f} MiB, after {self.rss_after / MIB:.1f} MiB "
                   f"({growth:+.1%}) after {self.settle_secs:.1f} s of settling; of which prefix cache "
                   f"{self.cache_base / MIB:.1f} MiB / {self.cache_after / MIB:.1f} MiB")
        eng = self.health
        out.append(f"  engine (/health): completed {eng.get('completed')}, cancelled {eng.get('cancelled')}, "
                   f"errors {eng.get('errors')}, peak batch {eng.get('peak_batch')}, completion tokens "
                   f"{eng.get('completion_tokens')}; ledger entries seen {len(self.ledger)}; "
                   f"requests admitted by this script {len(started) + len(warm)}")
        out.append("  checks:")
        print("\n".join(out + lines))
        if fails:
            print(f"load: FAIL ({'; '.join(fails)})")
            return 1
        print("load: PASS")
        return 0


def pct(values: list[float], p: float) -> str:
    if not values:
        return "-"
    k = (len(values) - 1) * p / 100
    lo, hi = math.floor(k), math.ceil(k)
    v = values[lo] + (values[hi] - values[lo]) * (k - lo)
    return f"{v * 1000:.0f}"


def main() -> int:
    env_secs = os.environ.get("SHOAL_LOAD_SECONDS")
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=float(env_secs) if env_secs else 60.0,
                    help="how long clients keep starting requests (default 60, or $SHOAL_LOAD_SECONDS)")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--disconnect-rate", type=float, default=0.3)
    ap.add_argument("--queue", type=int, default=16)
    ap.add_argument("--max-batch", type=int, default=8)
    ap.add_argument("--bin", type=Path, default=Path(os.environ.get("SHOAL_BIN") or REPO / "target/release/shoal"))
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--settle-seconds", type=float, default=20.0)
    ap.add_argument("--drain-seconds", type=float, default=120.0,
                    help="how long requests in flight at the deadline may take to end")
    ap.add_argument("--rss-tolerance", type=float, default=0.10)
    ap.add_argument("--prefix-cache-mb", type=int, default=256,
                    help="the server's prefix-cache budget; filled before the RSS baseline")
    ap.add_argument("--hangup-slack", type=float, default=1.0,
                    help="seconds a server may take to notice a hang-up")
    ap.add_argument("--keep-tmp", action="store_true", help="keep the server's temp dir (log, store)")
    args = ap.parse_args()
    if args.seed is None:
        args.seed = random.randrange(1 << 30)
    if not args.bin.is_file() or not os.access(args.bin, os.X_OK):
        print(f"load: shoal binary not found or not executable: {args.bin}")
        print("load: FAIL (no server binary)")
        return 1
    print(f"load: seed {args.seed}; {args.bin}", flush=True)

    # SIGTERM/SIGHUP unwind like Ctrl-C, so the server is always stopped.
    def on_signal(signum, _frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for s in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(s, on_signal)

    srv = None
    rc = 1
    try:
        srv = Server(args.bin, ["--queue", str(args.queue), "--max-batch", str(args.max_batch),
                                "--prefix-cache-mb", str(args.prefix_cache_mb)])
        rc = asyncio.run(Run(args, srv).main())
        if srv.proc.poll() is not None:
            print(f"load: the server exited during the run (code {srv.proc.returncode}); log tail:\n"
                  f"{srv.log_tail()}")
            print("load: FAIL (server exited)")
            rc = 1
    except KeyboardInterrupt as e:
        print(f"load: interrupted ({e or 'Ctrl-C'})")
        print("load: FAIL (interrupted)")
        rc = 1
    except Exception as e:  # noqa: BLE001 - any setup/run error is a failed load test
        print(f"load: error: {type(e).__name__}: {e}")
        if srv is not None:
            print(f"load: server log tail:\n{srv.log_tail()}")
        print(f"load: FAIL ({type(e).__name__})")
        rc = 1
    finally:
        if srv is not None:
            srv.stop()
            srv.cleanup(keep=args.keep_tmp or rc != 0)
            if rc != 0 or args.keep_tmp:
                print(f"load: server log, store and records.json kept in {srv.tmp}")
    return rc


if __name__ == "__main__":
    sys.exit(main())
