"""Shared pieces of the SDK conformance suite: starting `shoal serve`, the
model facts the tests assert, and small HTTP/ledger helpers.

The server binary comes from SHOAL_BIN (default <repo>/target/release/shoal);
the model is whatever the server loads (it reads SHOAL_MODEL itself). The exact
numbers below (answers, token counts) are facts of the default model,
SmolLM2-135M-Instruct, under greedy decoding.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import openai

REPO = Path(__file__).resolve().parents[2]
SHOAL_BIN = Path(os.environ.get("SHOAL_BIN") or REPO / "target" / "release" / "shoal")
# The embedding model the session server serves beside the default one
# (all-MiniLM-L6-v2; `tools/fetch-embedding-model.sh` makes both paths), and
# its Hugging Face directory, which the numpy reference reads.
EMBED_DIR = Path(os.environ.get("SHOAL_CACHE") or REPO / ".cache") / "models" / "all-minilm-l6-v2-0.1.2"
EMBED_GGUF = Path(os.environ.get("SHOAL_TEST_EMBED_GGUF") or EMBED_DIR / "all-MiniLM-L6-v2-F16.gguf")
EMBED_HF_DIR = EMBED_DIR / "hf"
EMBED_CORPUS = REPO / "tests" / "data" / "embedding-corpus.json"
STARTUP_TIMEOUT_S = 180.0
LISTEN_RE = re.compile(r"shoal listening on (http://\S+) \(model (.+)\)")

# Facts of the default model under greedy decoding (temperature 0).
QUESTION = "What is the capital of France? Answer in one sentence."
ANSWER = "The capital of France is Paris."
ANSWER_TOKENS = 8  # seven text tokens plus the closing <|im_end|> (EOS counts)
PROMPT_TOKENS = 42  # QUESTION under the template's default system prompt
STOP = "Paris"
STOPPED_TEXT = "The capital of France is "
STOPPED_TOKENS = 6  # includes the token that completed the stop sequence
CUT = 3  # a max_tokens small enough to cut the answer short
CUT_TEXT = "The capital of"
MAX = 24  # enough for every natural stop used here
# The same conversation as raw ChatML text, for /v1/completions (no template).
RAW_PROMPT = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\n" + QUESTION + "<|im_end|>\n<|im_start|>assistant\n"
)
# A prompt the model answers at length on both backends (greedy runs to any
# max_tokens used here), for cancellation and queue tests.
LONG_PROMPT = "Write the numbers from 1 to 500 separated by commas."


@dataclass
class Server:
    url: str  # http://127.0.0.1:PORT
    model: str
    proc: subprocess.Popen
    log: Path

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return "(no server log)"


def start_server(*extra: str, db: Path | None = None) -> Server:
    """Starts `shoal serve --port 0 EXTRA...` and waits for its listening line.
    `db` (default: a new temporary folder's) is its store; the prefix cache's
    disk tier lives beside it, so a server started again on the same `db`
    finds what the last one kept."""
    if not SHOAL_BIN.is_file() or not os.access(SHOAL_BIN, os.X_OK):
        raise RuntimeError(f"shoal binary not found or not executable: {SHOAL_BIN}")
    log = Path(tempfile.mkstemp(prefix="shoal-sdk-server-", suffix=".log")[1])
    log_fh = open(log, "wb")
    # A store of its own, never the user's.
    if db is None:
        db = Path(tempfile.mkdtemp(prefix="shoal-sdk-db-")) / "conversations.sqlite"
    # An empty model library, so the listed models are only the test's.
    env = {**os.environ, "HF_HOME": tempfile.mkdtemp(prefix="shoal-sdk-hf-")}
    proc = subprocess.Popen(
        [str(SHOAL_BIN), "serve", "--port", "0", "--db", str(db), *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=log_fh,
        stdin=subprocess.DEVNULL,
    )
    log_fh.close()
    found: dict[str, str] = {}
    ready = threading.Event()

    def pump() -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:  # keeps draining after the line so the pipe never fills
            line = raw.decode(errors="replace")
            m = LISTEN_RE.search(line)
            if m and not ready.is_set():
                found["url"], found["model"] = m.group(1), m.group(2)
                ready.set()
        ready.set()

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not ready.wait(0.1):
        if time.monotonic() > deadline:
            break
    srv = Server(found.get("url", ""), found.get("model", ""), proc, log)
    if "url" not in found:
        stop_server(srv)
        raise RuntimeError(
            f"shoal serve did not report its address (exit code {proc.returncode}); "
            f"log tail:\n{srv.log_tail()}"
        )
    return srv


def stop_server(srv: Server) -> None:
    """SIGTERM, which the server answers by finishing gracefully (its
    models freed, the prefix cache's writes landed); a kill after 60 s."""
    if srv.proc.poll() is None:
        srv.proc.terminate()
        try:
            srv.proc.wait(60)
        except subprocess.TimeoutExpired:
            srv.proc.kill()
            srv.proc.wait(10)


def openai_client(srv: Server) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="shoal-test", max_retries=0, timeout=120)


def anthropic_client(srv: Server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=srv.url, api_key="shoal-test", max_retries=0, timeout=120)


# ---------------------------------------------------------------- helpers


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def count_tokens(claude: anthropic.Anthropic, model: str, messages: list, system: Any = None) -> int:
    """The server's own count of a conversation (Anthropic count_tokens)."""
    kw: dict[str, Any] = {"model": model, "messages": messages}
    if system is not None:
        kw["system"] = system
    return claude.messages.count_tokens(**kw).input_tokens


def http_json(srv: Server, method: str, path: str, body: Any = None) -> tuple[int, dict, Any]:
    """Plain HTTP request; returns (status, headers, parsed JSON body)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(srv.url + path, data=data, method=method)
    req.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), json.loads(e.read() or b"null")


def sse_data(srv: Server, path: str, body: Any) -> list[tuple[str | None, str]]:
    """Posts a streaming request and returns its SSE frames as (event, data) pairs."""
    req = urllib.request.Request(srv.url + path, data=json.dumps(body).encode(), method="POST")
    req.add_header("content-type", "application/json")
    frames: list[tuple[str | None, str]] = []
    event: str | None = None
    data: list[str] = []
    with urllib.request.urlopen(req, timeout=120) as r:
        assert r.status == 200
        assert r.headers.get("content-type", "").startswith("text/event-stream")
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if line == "":
                if data:
                    frames.append((event, "\n".join(data)))
                event, data = None, []
            elif line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].lstrip(" "))
    if data:
        frames.append((event, "\n".join(data)))
    return frames


def ledger(srv: Server, limit: int = 1000) -> list[dict]:
    status, _, body = http_json(srv, "GET", f"/v1/usage?limit={limit}")
    assert status == 200, body
    return body["data"]


def ledger_entry(srv: Server, request_id: str, timeout: float = 60.0, want=None) -> dict:
    """Waits until the ledger has an entry for `request_id` (matching `want`, if given).
    The deadline only guards against a hang: the wait ends on the entry itself."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        for e in ledger(srv):
            if e["id"] == request_id:
                last = e
                if want is None or want(e):
                    return e
        if time.monotonic() > deadline:
            raise AssertionError(
                f"ledger has no matching entry for {request_id} after {timeout}s; last seen: {last}"
            )
        time.sleep(0.1)


def assert_usage_as_sent(ledger_usage: dict, sent: dict) -> None:
    """The ledger's usage is the object the client got, field for field
    (`sent` is the SDK object dumped with exclude_unset=True)."""
    assert ledger_usage == sent
