"""The prompt cache as agents meet it, through the official SDKs: a prefix
that outlives a server restart (the disk tier), Anthropic's `cache_control`
accounting (input + cache writes + cache reads = the prompt), the cache's
own routes, and API keys that keep their prefixes apart."""

from __future__ import annotations

import tempfile
import urllib.request
from pathlib import Path
from typing import Iterator

import anthropic
import openai
import pytest

from support import Server, anthropic_client, http_json, openai_client, start_server, stop_server

# An agent's instructions stand-in: a few hundred tokens, above the disk
# tier's 256-token floor.
SYSTEM = " ".join(f"Rule {i}: answer briefly, in plain words, and only what is asked." for i in range(1, 25))
QUESTION = "What is the capital of France? Answer in one sentence."
# Greedy (this SDK has no `temperature` argument of its own).
GREEDY = {"temperature": 0}


def newest_entry(srv: Server) -> dict:
    status, _, body = http_json(srv, "GET", "/v1/usage?limit=1")
    assert status == 200, body
    return body["data"][0]


def test_a_restarted_server_reads_the_prefix_from_disk() -> None:
    db = Path(tempfile.mkdtemp(prefix="shoal-sdk-restart-")) / "conversations.sqlite"
    msgs = [{"role": "user", "content": QUESTION}]
    first = start_server(db=db)
    try:
        claude = anthropic_client(first)
        m = first.model
        count = claude.messages.count_tokens(model=m, system=SYSTEM, messages=msgs).input_tokens
        cold = claude.messages.create(model=m, system=SYSTEM, messages=msgs, max_tokens=16, extra_body=GREEDY)
        assert cold.usage.cache_read_input_tokens == 0
        assert cold.usage.input_tokens == count
    finally:
        stop_server(first)
    second = start_server(db=db)
    try:
        claude = anthropic_client(second)
        with claude.messages.stream(
            model=second.model, system=SYSTEM, messages=msgs, max_tokens=16, extra_body=GREEDY
        ) as s:
            warm = s.get_final_message()
        assert warm.content[0].text == cold.content[0].text, "greedy reply equal to the cold one"
        # All but the last prompt token came back from disk.
        assert warm.usage.cache_read_input_tokens == count - 1
        assert warm.usage.input_tokens == 1
        tokens = newest_entry(second)["tokens"]
        assert tokens["cached"] == count - 1
        assert tokens["cached_disk"] == count - 1, tokens
        status, _, cache = http_json(second, "GET", "/v1/cache")
        assert status == 200, cache
        assert cache["disk"]["hits"] == 1
        assert cache["entries"] and cache["entries"][0]["model"] == second.model
        # Kept in blocks of 256 positions; /metrics counts them.
        assert cache["disk"]["blocks"] == cache["entries"][0]["blocks"] >= 1, cache
        with urllib.request.urlopen(second.url + "/metrics", timeout=60) as r:
            metrics = r.read().decode()
        assert f'shoal_prefix_cache{{tier="disk",stat="blocks"}} {cache["disk"]["blocks"]}' in metrics
        # /health says the same.
        status, _, health = http_json(second, "GET", "/health")
        assert health["prefix_cache"]["disk"]["entries"] >= 1
        # Clearing it empties the disk tier; the next request prefills cold.
        status, _, cleared = http_json(second, "DELETE", "/v1/cache")
        assert status == 200 and cleared["disk_entries_removed"] >= 1, cleared
        again = claude.messages.create(
            model=second.model, system=SYSTEM, messages=msgs, max_tokens=16, extra_body=GREEDY
        )
        assert again.usage.cache_read_input_tokens == 0
    finally:
        stop_server(second)


@pytest.fixture(scope="module")
def cache_server() -> Iterator[Server]:
    srv = start_server("--prefix-cache-mb", "256")
    try:
        yield srv
    finally:
        stop_server(srv)


def system_blocks(ttl: str | None = None) -> list[dict]:
    cc: dict = {"type": "ephemeral"}
    if ttl:
        cc["ttl"] = ttl
    return [{"type": "text", "text": SYSTEM, "cache_control": cc}]


def test_cache_control_usage_adds_up_as_anthropic_says(cache_server: Server) -> None:
    claude = anthropic_client(cache_server)
    m = cache_server.model
    # A question of its own, so no earlier test's prefix is in the cache.
    question = "What is the capital of Spain? Answer in one sentence."
    msgs = [
        {
            "role": "user",
            "content": [{"type": "text", "text": question, "cache_control": {"type": "ephemeral"}}],
        }
    ]
    count = claude.messages.count_tokens(model=m, system=system_blocks("1h"), messages=msgs).input_tokens
    sys_only = claude.messages.count_tokens(
        model=m, system=system_blocks("1h"), messages=[{"role": "user", "content": "x"}]
    ).input_tokens
    a = claude.messages.create(model=m, system=system_blocks("1h"), messages=msgs, max_tokens=8, extra_body=GREEDY)
    u = a.usage
    # Cold: nothing read; everything up to the last breakpoint written.
    assert u.cache_read_input_tokens == 0
    assert u.cache_creation_input_tokens > 0
    assert u.input_tokens + u.cache_creation_input_tokens + u.cache_read_input_tokens == count
    # The last breakpoint ends the user turn: only the generation prompt is left.
    assert 0 < u.input_tokens < 10
    split = u.cache_creation
    assert split is not None
    assert split.ephemeral_1h_input_tokens + split.ephemeral_5m_input_tokens == u.cache_creation_input_tokens
    # The system block's breakpoint (1h) covers the system turn; the rest (5m) the user turn.
    assert 0 < split.ephemeral_1h_input_tokens < sys_only
    assert split.ephemeral_5m_input_tokens > 0
    # The same request again: read from the cache, nothing new written.
    with claude.messages.stream(model=m, system=system_blocks("1h"), messages=msgs, max_tokens=8, extra_body=GREEDY) as s:
        b = s.get_final_message()
    v = b.usage
    assert v.cache_read_input_tokens == count - 1
    assert v.cache_creation_input_tokens == 0
    assert v.input_tokens == 1
    # The ledger keeps the writes apart.
    tokens = newest_entry(cache_server)["tokens"]
    assert tokens["cache_write"] == 0 and tokens["cached"] == count - 1
    # Without any breakpoint nothing is reported as written.
    plain = [{"role": "user", "content": "What is the capital of Portugal? Answer in one sentence."}]
    c = claude.messages.create(model=m, system=SYSTEM, messages=plain, max_tokens=8, extra_body=GREEDY)
    assert c.usage.cache_creation_input_tokens == 0
    total = claude.messages.count_tokens(model=m, system=SYSTEM, messages=plain).input_tokens
    assert c.usage.input_tokens + c.usage.cache_read_input_tokens == total


def test_more_than_four_breakpoints_or_a_bad_ttl_is_refused(cache_server: Server) -> None:
    claude = anthropic_client(cache_server)
    blocks = [{"type": "text", "text": f"part {i}. ", "cache_control": {"type": "ephemeral"}} for i in range(5)]
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=cache_server.model, messages=[{"role": "user", "content": blocks}], max_tokens=4
        )
    assert "maximum of 4" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(
            model=cache_server.model,
            system=[{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}],
            messages=[{"role": "user", "content": "hi"}],
            max_tokens=4,
        )
    assert "ttl" in str(e.value)


def test_openai_prompt_cache_key_is_accepted(cache_server: Server) -> None:
    oai = openai_client(cache_server)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Name a colour."}]
    for _ in range(2):
        r = oai.chat.completions.create(
            model=cache_server.model, messages=msgs, max_tokens=4, temperature=0, prompt_cache_key="agent-1"
        )
    assert r.usage.prompt_tokens_details.cached_tokens == r.usage.prompt_tokens - 1


def keyed(srv: Server, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=srv.url + "/v1", api_key=key, max_retries=0, timeout=120)


def ask(srv: Server, key: str):
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": QUESTION}]
    return keyed(srv, key).chat.completions.create(model=srv.model, messages=msgs, max_tokens=4, temperature=0)


def test_one_keys_prefixes_are_not_reused_for_another() -> None:
    srv = start_server("--api-key", "alice=key-a", "--api-key", "bob=key-b")
    try:
        assert ask(srv, "key-a").usage.prompt_tokens_details.cached_tokens == 0
        b = ask(srv, "key-b")
        assert b.usage.prompt_tokens_details.cached_tokens == 0, "another key's prefix is not reused"
        a2 = ask(srv, "key-a")
        assert a2.usage.prompt_tokens_details.cached_tokens == a2.usage.prompt_tokens - 1
    finally:
        stop_server(srv)
    shared = start_server("--api-key", "alice=key-a", "--api-key", "bob=key-b", "--cache-share-across-keys")
    try:
        ask(shared, "key-a")
        b = ask(shared, "key-b")
        assert b.usage.prompt_tokens_details.cached_tokens == b.usage.prompt_tokens - 1
    finally:
        stop_server(shared)
