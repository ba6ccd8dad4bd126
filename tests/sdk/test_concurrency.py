"""Continuous batching seen from the outside: concurrent requests through the
SDKs get the same greedy text, finish and usage as the same requests sent one
at a time, in every dialect at once."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import json
import urllib.request

import pytest

from support import anthropic_client, openai_client, start_server, stop_server, user


@pytest.fixture(scope="module")
def own_server():
    """A server of this module's own: its peak batch counts these requests only."""
    srv = start_server("--prefix-cache-mb", "0")
    try:
        yield srv
    finally:
        stop_server(srv)

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a haiku about autumn leaves.",
    "List three colours.",
    "Explain how a bicycle works.",
    "Say hello.",
    "Name a large animal.",
]


def chat(oai, model, prompt):
    r = oai.chat.completions.create(model=model, messages=[user(prompt)], temperature=0, max_tokens=24)
    return ("chat", r.choices[0].message.content, r.choices[0].finish_reason, r.usage.model_dump())


def messages(claude, model, prompt):
    m = claude.messages.create(model=model, max_tokens=24, messages=[user(prompt)], extra_body={"temperature": 0})
    return ("messages", m.content[0].text, m.stop_reason, m.usage.model_dump())


def responses(oai, model, prompt):
    r = oai.responses.create(model=model, input=prompt, temperature=0, max_output_tokens=24)
    return ("responses", r.output_text, r.status, r.usage.model_dump())


def test_concurrent_requests_equal_sequential_ones(own_server):
    server, model = own_server, own_server.model
    oai, claude = openai_client(server), anthropic_client(server)
    calls = []
    for i, p in enumerate(PROMPTS):
        kind = (chat, messages, responses)[i % 3]
        client = claude if kind is messages else oai
        calls.append((kind, client, p))
    sequential = [f(c, model, p) for f, c, p in calls]
    with ThreadPoolExecutor(max_workers=len(calls)) as pool:
        concurrent = list(pool.map(lambda a: a[0](a[1], model, a[2]), calls))
    with urllib.request.urlopen(server.url + "/v1/models") as r:
        backend = next(m for m in json.load(r)["data"] if m["id"] == model)["shoal"]["backend"]
    if backend == "mlx":
        assert concurrent == sequential
    else:
        # llama.cpp's CPU attention picks its kernel by the number of tokens in
        # a step, so a batched greedy reply may part from the sequential one
        # after a near tie; each reply's accounting must still hold.
        for (kind, _, _, su), (ckind, text, _, cu) in zip(sequential, concurrent):
            assert kind == ckind and text
            prompt = "prompt_tokens" if kind == "chat" else "input_tokens"
            out = "completion_tokens" if kind == "chat" else "output_tokens"
            assert su[prompt] == cu[prompt], (su, cu)
            assert 0 < cu[out] <= 24, cu
    assert all(text for _, text, _, _ in sequential)
    # They really were decoded together.
    with urllib.request.urlopen(server.url + "/health") as r:
        engine = json.load(r)["engine"]
    assert engine["peak_batch"] >= 3, engine
