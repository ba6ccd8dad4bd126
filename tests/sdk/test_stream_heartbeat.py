"""A stream that is quiet while its prompt is read sends its dialect's heartbeat,
and the official clients take it: the OpenAI and Ollama SDKs hand it to the
caller (where agents' stream-idle guards, such as Qwen Code's and Codex's, watch),
their accumulators build the same reply as without it, and the usage stays exact.

The server here sends a heartbeat after 1 s without data; each prompt takes
several seconds to read on this model, so heartbeats come before its first token.
Each test's prompt opens with its own line, so no prefill is shared."""

from __future__ import annotations

import json
from typing import Iterator

import ollama
import pytest

from support import (
    Server,
    anthropic_client,
    count_tokens,
    ledger_entry,
    openai_client,
    sse_data,
    start_server,
    stop_server,
    user,
)

REPLY = 4  # tokens each reply may take: the point is what comes before them


def long_prompt(opening: str, ask: str = "Which item weighs the most?") -> str:
    """About 1,600 tokens: a few seconds of prefill on the default model."""
    rows = " ".join(f"item{i} weighs {i * 7 % 13} kg." for i in range(180))
    return f"{opening}\n{rows}\n{ask}"


@pytest.fixture(scope="module")
def beating() -> Iterator[Server]:
    srv = start_server("--prefix-cache-mb", "0", "--stream-heartbeat-secs", "1")
    try:
        yield srv
    finally:
        stop_server(srv)


def test_chat_heartbeats_reach_the_caller_and_the_accumulated_reply_is_whole(beating: Server) -> None:
    oai = openai_client(beating)
    msgs = [user(long_prompt("Chat."))]
    before = []  # chunks the SDK handed over before the first text
    text = ""
    with oai.chat.completions.stream(
        model=beating.model, messages=msgs, max_tokens=REPLY, temperature=0,
        stream_options={"include_usage": True},
    ) as stream:
        for ev in stream:
            if ev.type != "chunk":
                continue
            for c in ev.chunk.choices:
                if c.delta.content and not text:
                    text = c.delta.content
                elif not text:
                    before.append(c.delta)
        # The accumulated reply (the helper's final-completion call refuses a
        # reply cut by max_tokens, so its snapshot is read instead).
        final = stream.current_completion_snapshot
    # The first heartbeat is the role chunk OpenAI sends first; the rest carry
    # an empty delta. The role is said once, so the accumulator keeps it whole.
    assert len(before) >= 2, before
    assert before[0].role == "assistant"
    assert all(d.role is None and not d.content and not d.tool_calls for d in before[1:]), before
    msg = final.choices[0].message
    assert msg.role == "assistant"
    assert msg.content.startswith(text)
    assert final.choices[0].finish_reason == "length"
    assert final.usage.completion_tokens == REPLY
    assert final.usage.prompt_tokens == count_tokens(anthropic_client(beating), beating.model, msgs)
    assert ledger_entry(beating, final.id)["usage"]["prompt_tokens"] == final.usage.prompt_tokens


def test_completions_heartbeats_are_empty_text(beating: Server) -> None:
    oai = openai_client(beating)
    chunks = list(oai.completions.create(
        model=beating.model, prompt=long_prompt("Completions.", "The heaviest item is item"), max_tokens=REPLY, temperature=0,
        stream=True, stream_options={"include_usage": True},
    ))
    first_text = next(i for i, c in enumerate(chunks) if c.choices and c.choices[0].text)
    assert first_text >= 1
    assert all(c.choices[0].text == "" and c.choices[0].finish_reason is None for c in chunks[:first_text])
    assert chunks[-1].usage.completion_tokens == REPLY
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finishes == ["length"]


def test_responses_heartbeats_are_in_progress_events_the_stream_helper_accepts(beating: Server) -> None:
    oai = openai_client(beating)
    kinds = []
    # The helper checks each event against the response it accumulates; its
    # final-response call wants `response.completed`, so the reply cut by
    # max_output_tokens is read from its closing event.
    with oai.responses.stream(
        model=beating.model, input=long_prompt("Responses."), max_output_tokens=REPLY, temperature=0,
    ) as stream:
        for ev in stream:
            kinds.append(ev.type)
            if ev.type == "response.incomplete":
                final = ev.response
    first_delta = kinds.index("response.output_text.delta")
    head = kinds[:first_delta]
    # Created once, then in progress: once as ever, again for each heartbeat.
    assert head[0] == "response.created" and head.count("response.created") == 1
    assert head.count("response.in_progress") >= 2, head
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert final.usage.output_tokens == REPLY
    assert final.output_text
    # Sequence numbers still count every event once.
    raw = sse_data(beating, "/v1/responses", {
        "model": beating.model, "input": long_prompt("Responses, raw."), "max_output_tokens": REPLY,
        "temperature": 0, "stream": True,
    })
    seqs = [json.loads(d)["sequence_number"] for _, d in raw]
    assert seqs == list(range(len(seqs)))


def test_messages_heartbeats_are_pings_and_the_sdk_stream_is_whole(beating: Server) -> None:
    claude = anthropic_client(beating)
    msgs = [user(long_prompt("Messages."))]
    raw = sse_data(beating, "/v1/messages", {
        "model": beating.model, "messages": msgs, "max_tokens": REPLY, "temperature": 0, "stream": True,
    })
    names = [e for e, _ in raw]
    start = names.index("message_start")
    assert start >= 1 and set(names[:start]) == {"ping"}, names[:start]
    # The SDK drops pings before its events; its message is as Anthropic's would be.
    with claude.messages.stream(
        model=beating.model, messages=[user(long_prompt("Messages, SDK."))], max_tokens=REPLY,
    ) as stream:
        events = [ev.type for ev in stream]
        final = stream.get_final_message()
    assert events[0] == "message_start"
    assert final.stop_reason == "max_tokens"
    assert final.usage.output_tokens == REPLY
    assert final.usage.input_tokens == count_tokens(claude, beating.model, [user(long_prompt("Messages, SDK."))])


def test_ollama_heartbeats_are_empty_lines_before_the_reply(beating: Server) -> None:
    olm = ollama.Client(host=beating.url, timeout=120)
    for kind, parts in (
        ("chat", olm.chat(model=beating.model, messages=[user(long_prompt("Ollama chat."))], stream=True,
                          options={"num_predict": REPLY, "temperature": 0})),
        ("generate", olm.generate(model=beating.model, prompt=long_prompt("Ollama generate."), stream=True,
                                  options={"num_predict": REPLY, "temperature": 0})),
    ):
        parts = list(parts)
        text = [p.message.content if kind == "chat" else p.response for p in parts]
        first = next(i for i, t in enumerate(text) if t)
        assert first >= 1, (kind, text)
        assert all(t == "" and not p.done for t, p in zip(text[:first], parts)), kind
        last = parts[-1]
        assert last.done and last.done_reason == "length"
        assert last.eval_count == REPLY
