"""Reasoning through the official SDKs.

A model that can reason gets a thinking section: the server opens it for a
model whose vocabulary has `</think>` but whose template has no switch of
its own, closes it when the budget is spent, and counts reasoning tokens
exactly. These run on a server of their own, on the default weights given
the two tokens (the `make models` fixture, SHOAL_TEST_THINK_GGUF).

A model that cannot reason (the default model) asked for reasoning answers
exactly as it does unasked, with no reasoning and 0 reasoning tokens, in
every dialect, streamed and not.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterator

import pytest

from support import ANSWER, QUESTION, REPO, Server, anthropic_client, openai_client, start_server, stop_server, user

BUDGET = 5
THINK_GGUF = Path(
    os.environ.get("SHOAL_TEST_THINK_GGUF")
    or REPO / ".cache/models/smollm2-think-v1/SmolLM2-135M-Instruct-think.Q4_1.gguf"
)


@pytest.fixture(scope="module")
def think_server() -> Iterator[Server]:
    assert THINK_GGUF.is_file(), f"reasoning fixture missing at {THINK_GGUF} (make models)"
    srv = start_server("--prefix-cache-mb", "0", "--model", str(THINK_GGUF))
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def think_oai(think_server):
    return openai_client(think_server)


@pytest.fixture(scope="module")
def think_claude(think_server):
    return anthropic_client(think_server)


@pytest.fixture(scope="module")
def think_model(think_server) -> str:
    return think_server.model


def test_openai_chat_reasoning_budget_exact(think_oai, think_model):
    r = think_oai.chat.completions.create(
        model=think_model, messages=[user(QUESTION)], temperature=0, max_tokens=30,
        extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    assert r.usage.completion_tokens_details.reasoning_tokens == BUDGET
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert msg.content and "</think>" not in msg.content
    assert r.usage.completion_tokens > BUDGET

    stream = think_oai.chat.completions.create(
        model=think_model, messages=[user(QUESTION)], temperature=0, max_tokens=30, stream=True,
        stream_options={"include_usage": True}, extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    parts, text, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            if extra.get("reasoning_content"):
                parts.append(extra["reasoning_content"])
            if c.delta.content:
                text.append(c.delta.content)
    assert "".join(parts) == reasoning
    assert "".join(text) == msg.content
    assert usage is not None and usage.model_dump() == r.usage.model_dump()


def test_openai_reasoning_effort_none_means_no_reasoning(think_oai, think_model):
    r = think_oai.chat.completions.create(
        model=think_model, messages=[user(QUESTION)], temperature=0, max_tokens=12, reasoning_effort="none",
    )
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_anthropic_thinking_blocks_with_budget(think_claude, think_model):
    kw = dict(model=think_model, max_tokens=30, messages=[user(QUESTION)],
              thinking={"type": "enabled", "budget_tokens": BUDGET}, extra_body={"temperature": 0})
    m = think_claude.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking and m.content[1].text
    with think_claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == m.content[0].thinking
    assert final.usage.output_tokens == m.usage.output_tokens
    assert m.stop_reason in ("end_turn", "max_tokens")


def test_responses_reasoning_item_and_tokens(think_oai, think_model):
    r = think_oai.responses.create(model=think_model, input=QUESTION, temperature=0, max_output_tokens=30,
                             reasoning={"effort": "low"})
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning"
    rt = r.usage.output_tokens_details.reasoning_tokens
    assert 0 < rt <= r.usage.output_tokens


def test_a_model_that_cannot_reason_answers_normally_in_chat(oai, model):
    caps = oai.models.retrieve(model).model_extra["shoal"]["capabilities"]
    assert caps["reasoning"] is False
    plain = oai.chat.completions.create(model=model, messages=[user(QUESTION)], temperature=0, max_tokens=30)
    assert plain.choices[0].message.content == ANSWER
    for ask in ({"reasoning_effort": "medium"}, {"extra_body": {"reasoning": {"max_tokens": BUDGET}}}):
        r = oai.chat.completions.create(model=model, messages=[user(QUESTION)], temperature=0, max_tokens=30, **ask)
        msg = r.choices[0].message
        assert msg.content == ANSWER, ask
        assert not (msg.model_extra or {}).get("reasoning_content"), ask
        assert r.usage.completion_tokens_details.reasoning_tokens == 0
        assert r.usage.completion_tokens == plain.usage.completion_tokens
        stream = oai.chat.completions.create(
            model=model, messages=[user(QUESTION)], temperature=0, max_tokens=30, stream=True,
            stream_options={"include_usage": True}, **ask,
        )
        text, reasoning, usage = [], [], None
        for chunk in stream:
            usage = chunk.usage or usage
            for c in chunk.choices:
                text.append(c.delta.content or "")
                reasoning.append((c.delta.model_extra or {}).get("reasoning_content") or "")
        assert "".join(text) == ANSWER and "".join(reasoning) == ""
        assert usage.completion_tokens_details.reasoning_tokens == 0


def test_a_model_that_cannot_reason_answers_normally_in_messages(claude, model):
    kw = dict(model=model, max_tokens=30, messages=[user(QUESTION)],
              thinking={"type": "enabled", "budget_tokens": BUDGET}, extra_body={"temperature": 0})
    m = claude.messages.create(**kw)
    assert [b.type for b in m.content] == ["text"] and m.content[0].text == ANSWER
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["text"] and final.content[0].text == ANSWER
    assert final.usage.output_tokens == m.usage.output_tokens


def test_a_model_that_cannot_reason_answers_normally_in_responses(oai, model):
    r = oai.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=30,
                             reasoning={"effort": "low"})
    assert [item.type for item in r.output] == ["message"]
    assert r.output_text == ANSWER
    assert r.usage.output_tokens_details.reasoning_tokens == 0
    done = None
    for ev in oai.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=30,
                                   reasoning={"effort": "low"}, stream=True):
        if ev.type == "response.completed":
            done = ev.response
    assert done is not None and [item.type for item in done.output] == ["message"]
    assert done.usage.output_tokens_details.reasoning_tokens == 0
