"""Prefix cache through the official SDKs: a second turn reuses the first
turn's KV state, `cached_tokens` / `cache_read_input_tokens` say exactly how
much, and the prompt is still counted whole."""

from __future__ import annotations

from typing import Iterator

import pytest

from support import Server, anthropic_client, openai_client, start_server, stop_server

SYSTEM = "You are a meticulous assistant. " * 20  # a long shared system prompt


@pytest.fixture(scope="module")
def cached_server() -> Iterator[Server]:
    srv = start_server("--prefix-cache-mb", "256")
    try:
        yield srv
    finally:
        stop_server(srv)


def test_multi_turn_chat_reuses_the_first_turn(cached_server: Server) -> None:
    oai = openai_client(cached_server)
    m = cached_server.model
    first_msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    a = oai.chat.completions.create(model=m, messages=first_msgs, temperature=0, max_tokens=8)
    assert a.usage.prompt_tokens_details.cached_tokens == 0
    second = first_msgs + [
        {"role": "assistant", "content": a.choices[0].message.content},
        {"role": "user", "content": "And another one?"},
    ]
    b = oai.chat.completions.create(model=m, messages=second, temperature=0, max_tokens=8)
    cached = b.usage.prompt_tokens_details.cached_tokens
    # Everything up to the end of the first prompt is shared, at least.
    assert cached >= a.usage.prompt_tokens - 1
    assert cached < b.usage.prompt_tokens
    assert b.usage.prompt_tokens > a.usage.prompt_tokens, "a cache hit never shortens the prompt"
    assert b.usage.total_tokens == b.usage.prompt_tokens + b.usage.completion_tokens


def test_cached_and_uncached_greedy_output_match(cached_server: Server) -> None:
    oai = openai_client(cached_server)
    m = cached_server.model
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
    cold = oai.chat.completions.create(model=m, messages=msgs, temperature=0, max_tokens=12)
    warm = oai.chat.completions.create(model=m, messages=msgs, temperature=0, max_tokens=12)
    assert warm.usage.prompt_tokens_details.cached_tokens == warm.usage.prompt_tokens - 1
    assert warm.choices[0].message.content == cold.choices[0].message.content
    assert warm.usage.completion_tokens == cold.usage.completion_tokens


def test_anthropic_reports_cache_reads_and_counts_the_rest(cached_server: Server) -> None:
    claude = anthropic_client(cached_server)
    m = cached_server.model
    msgs = [{"role": "user", "content": "Say hello."}]
    count = claude.messages.count_tokens(model=m, system=SYSTEM, messages=msgs).input_tokens
    claude.messages.create(model=m, system=SYSTEM, messages=msgs, max_tokens=4)
    with claude.messages.stream(model=m, system=SYSTEM, messages=msgs, max_tokens=4) as s:
        final = s.get_final_message()
    u = final.usage
    assert u.cache_read_input_tokens == count - 1
    assert u.input_tokens == 1
    assert u.input_tokens + u.cache_read_input_tokens == count
