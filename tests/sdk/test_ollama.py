"""Ollama's API through the official `ollama` Python client, unmodified, on the
shared server: list, show, ps, chat and generate (streamed and not), options,
format, errors, and the calls VS Code Copilot Chat's Ollama provider makes."""

from __future__ import annotations

import json
import urllib.request

import ollama
import pytest

from support import (
    ANSWER,
    ANSWER_TOKENS,
    CUT,
    CUT_TEXT,
    MAX,
    PROMPT_TOKENS,
    QUESTION,
    RAW_PROMPT,
    STOP,
    STOPPED_TEXT,
    STOPPED_TOKENS,
    Server,
    ledger,
)

GREEDY = {"temperature": 0, "num_predict": MAX}


@pytest.fixture(scope="module")
def olm(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def ask() -> list[dict[str, str]]:
    return [{"role": "user", "content": QUESTION}]


def test_list_show_and_ps_name_the_model(olm: ollama.Client, model: str) -> None:
    names = [m.model for m in olm.list().models]
    assert f"{model}:latest" in names
    listed = next(m for m in olm.list().models if m.model == f"{model}:latest")
    assert listed.details.format == "gguf" and listed.size > 1 << 20
    for name in (model, f"{model}:latest"):
        shown = olm.show(name)
        assert "completion" in shown.capabilities and "tools" in shown.capabilities
        assert shown.modelinfo["general.architecture"] == "llama"
        assert shown.template and "temperature" in shown.parameters
    # The embedding model is loaded too once an embedding test has run.
    running = [m for m in olm.ps().models if not m.model.startswith("all-MiniLM")]
    assert [m.model for m in running] == [f"{model}:latest"]
    assert running[0].size_vram == 0 and running[0].size > 0


def test_chat_is_exact_streamed_or_not(olm: ollama.Client, model: str) -> None:
    r = olm.chat(model=model, messages=ask(), options=GREEDY)
    assert r.message.content == ANSWER
    assert (r.prompt_eval_count, r.eval_count, r.done_reason) == (PROMPT_TOKENS, ANSWER_TOKENS, "stop")
    assert r.total_duration >= r.prompt_eval_duration + r.eval_duration > 0
    parts = list(olm.chat(model=f"{model}:latest", messages=ask(), options=GREEDY, stream=True))
    assert "".join(p.message.content or "" for p in parts) == ANSWER
    last = parts[-1]
    assert last.done and not any(p.done for p in parts[:-1])
    assert (last.prompt_eval_count, last.eval_count, last.done_reason) == (PROMPT_TOKENS, ANSWER_TOKENS, "stop")


def test_generate_templated_and_raw(olm: ollama.Client, model: str) -> None:
    r = olm.generate(model=model, prompt=QUESTION, options=GREEDY)
    assert r.response == ANSWER and r.prompt_eval_count == PROMPT_TOKENS
    raw = olm.generate(model=model, prompt=RAW_PROMPT, raw=True, options=GREEDY)
    assert raw.response == ANSWER and raw.prompt_eval_count == PROMPT_TOKENS
    parts = list(olm.generate(model=model, prompt=QUESTION, options=GREEDY, stream=True))
    assert "".join(p.response for p in parts) == ANSWER
    assert parts[-1].eval_count == ANSWER_TOKENS


def test_options_cut_and_stop(olm: ollama.Client, model: str) -> None:
    cut = olm.chat(model=model, messages=ask(), options={"temperature": 0, "num_predict": CUT})
    assert (cut.message.content, cut.eval_count, cut.done_reason) == (CUT_TEXT, CUT, "length")
    stopped = olm.chat(model=model, messages=ask(), options={**GREEDY, "stop": [STOP]})
    assert (stopped.message.content, stopped.eval_count, stopped.done_reason) == (
        STOPPED_TEXT,
        STOPPED_TOKENS,
        "stop",
    )


def test_format_schema_constrains_the_reply(olm: ollama.Client, model: str) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
    r = olm.chat(
        model=model,
        messages=[{"role": "user", "content": "Which city is the capital of France? Answer as JSON."}],
        format=schema,
        options={"temperature": 0, "num_predict": 40},
    )
    assert isinstance(json.loads(r.message.content)["city"], str)
    flag = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
    r = olm.generate(model=model, prompt="Is Paris in France? Answer as JSON.", format=flag, options={"temperature": 0, "num_predict": 40})
    assert isinstance(json.loads(r.response)["ok"], bool) and r.done_reason == "stop"


def test_errors_are_ollamas(olm: ollama.Client, model: str) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        olm.chat(model="no-such-model", messages=ask())
    assert e.value.status_code == 404 and "try pulling it first" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        olm.chat(model=model, messages=ask(), think=True)
    assert e.value.status_code == 400 and "does not support thinking" in e.value.error
    with pytest.raises(ollama.ResponseError) as e:
        olm.delete(model)
    assert e.value.status_code == 400
    # think=False is fine on any model.
    assert olm.chat(model=model, messages=ask(), think=False, options=GREEDY).message.content == ANSWER


def test_ledger_records_ollama_requests(olm: ollama.Client, server: Server, model: str) -> None:
    r = olm.chat(model=model, messages=ask(), options=GREEDY)
    rows = [e for e in ledger(server) if e["dialect"] == "ollama" and e["endpoint"] == "/api/chat"]
    assert rows, "no ollama rows"
    assert rows[0]["usage"]["prompt_eval_count"] == r.prompt_eval_count
    assert rows[0]["usage"]["eval_count"] == r.eval_count


def test_copilot_provider_flow(server: Server, model: str) -> None:
    """What VS Code Copilot Chat's Ollama provider does: version, tags, show
    each model (it needs `tools` and a model_info), then chat, one port."""

    def call(method: str, path: str, body=None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(server.url + path, data=data, method=method, headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            return json.loads(r.read())

    assert call("GET", "/api/version")["version"]
    tags = call("GET", "/api/tags")["models"]
    assert tags
    for t in tags:
        info = call("POST", "/api/show", {"model": t["model"]})
        assert info["model_info"].get("general.architecture")
        # Chat models offer tools; an embedding model says it only embeds,
        # and the provider leaves it out of the chat picker.
        if info["capabilities"] == ["embedding"]:
            continue
        assert "tools" in info["capabilities"]
    chat = call(
        "POST",
        "/api/chat",
        {"model": f"{model}:latest", "messages": ask(), "stream": False, "options": GREEDY},
    )
    assert chat["message"]["content"] == ANSWER and chat["done_reason"] == "stop"


PULLED = "test/SmolLM2-GGUF"


def test_pull_with_progress_then_delete(olm: ollama.Client, model: str) -> None:
    """`ollama pull` from the hub (the loopback fixture run-sdk.sh starts),
    its progress as the client reads it, a chat on the pulled model, then
    `ollama rm`."""
    events = list(olm.pull(f"hf.co/{PULLED}:Q4_1", stream=True))
    assert events[0].status == "pulling manifest"
    assert events[-1].status == "success"
    progress = [e for e in events if e.digest]
    assert progress and all(e.digest.startswith("sha256:") and e.total for e in progress)
    done = [e.completed or 0 for e in progress]
    assert done == sorted(done) and done[-1] == progress[-1].total
    assert any(e.status == "verifying sha256 digest" for e in events)

    names = [m.model for m in olm.list().models]
    pulled = next(n for n in names if n.startswith(PULLED + "/"))
    assert pulled.endswith(".gguf:latest") and f"{model}:latest" in names
    # keep_alive 0: the pulled model is unloaded after its reply.
    r = olm.chat(model=pulled, messages=ask(), options=GREEDY, keep_alive=0)
    assert r.message.content == ANSWER and r.done_reason == "stop"

    assert olm.delete(pulled).status == "success"
    assert pulled not in [m.model for m in olm.list().models]
    with pytest.raises(ollama.ResponseError) as gone:
        olm.delete(pulled)
    assert gone.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as unknown:
        olm.pull("hf.co/test/NoSuchRepo-GGUF:Q4_1")
    assert "NoSuchRepo" in str(unknown.value.error)
