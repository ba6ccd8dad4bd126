"""POST /v1/messages and /v1/messages/count_tokens through the Anthropic Python SDK."""

from __future__ import annotations

import json

import anthropic
import pytest

from support import (
    ANSWER,
    ANSWER_TOKENS,
    CUT,
    CUT_TEXT,
    MAX,
    PROMPT_TOKENS,
    QUESTION,
    STOP,
    STOPPED_TEXT,
    STOPPED_TOKENS,
    count_tokens,
    http_json,
    sse_data,
    user,
)

MESSAGES = [user(QUESTION)]


def greedy(kw):
    """This SDK version has no `temperature` argument; the server still takes it."""
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("extra_body", {"temperature": kw.pop("temperature", 0)})
    return kw


def create(claude, model, **kw):
    return claude.messages.create(model=model, **greedy(kw))


def streamed(claude, model, **kw):
    """Runs the SDK's stream helper; returns (events, final message)."""
    greedy(kw)
    with claude.messages.stream(model=model, **kw) as stream:
        events = list(stream)
        final = stream.get_final_message()
    return events, final


def check_usage(u, prompt, completion):
    assert u.input_tokens + (u.cache_read_input_tokens or 0) == prompt
    assert u.cache_read_input_tokens == 0
    assert u.cache_creation_input_tokens == 0
    assert u.output_tokens == completion


def check_stream(events, final, plain):
    """Stream invariants shared by every streamed message."""
    types = [e.type for e in events]
    assert types[0] == "message_start"
    assert types.count("message_start") == 1
    assert types.count("message_delta") == 1
    assert types[-1] == "message_stop"
    start = events[0].message
    assert start.id == final.id
    assert start.stop_reason is None
    assert start.usage.output_tokens == 0
    # message_start carries the real input usage, equal to the final one.
    assert start.usage.input_tokens == final.usage.input_tokens
    assert start.usage.cache_read_input_tokens == final.usage.cache_read_input_tokens
    delta = next(e for e in events if e.type == "message_delta")
    assert delta.delta.stop_reason == final.stop_reason
    assert delta.usage.output_tokens == final.usage.output_tokens
    # Streamed and plain requests agree exactly.
    assert final.usage.model_dump() == plain.usage.model_dump()
    assert final.stop_reason == plain.stop_reason
    assert final.stop_sequence == plain.stop_sequence
    assert [b.model_dump() for b in final.content] == [b.model_dump() for b in plain.content]


def test_count_tokens(claude, model):
    assert count_tokens(claude, model, MESSAGES) == PROMPT_TOKENS


def test_count_tokens_system_forms_agree(claude, model):
    as_string = count_tokens(claude, model, MESSAGES, system="You are terse.")
    as_blocks = count_tokens(claude, model, MESSAGES, system=[{"type": "text", "text": "You are terse."}])
    in_messages = count_tokens(claude, model, [{"role": "system", "content": "You are terse."}, *MESSAGES])
    assert as_string == as_blocks == in_messages
    assert as_string != PROMPT_TOKENS  # an explicit system prompt replaces the default one
    blocks_content = count_tokens(claude, model, [{"role": "user", "content": [{"type": "text", "text": QUESTION}]}])
    assert blocks_content == PROMPT_TOKENS


def test_natural_stop(claude, model):
    m = create(claude, model, max_tokens=MAX)
    assert m.type == "message" and m.role == "assistant"
    assert m.id.startswith("msg_")
    assert m.model == model
    assert [(b.type, b.text) for b in m.content] == [("text", ANSWER)]
    assert m.stop_reason == "end_turn"
    assert m.stop_sequence is None
    check_usage(m.usage, count_tokens(claude, model, MESSAGES), ANSWER_TOKENS)
    check_usage(m.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_natural_stop_stream(claude, model):
    plain = create(claude, model, max_tokens=MAX)
    events, final = streamed(claude, model, max_tokens=MAX)
    check_stream(events, final, plain)
    text = "".join(e.delta.text for e in events if e.type == "content_block_delta")
    assert text == ANSWER
    assert final.stop_reason == "end_turn"
    check_usage(final.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_max_tokens_cut(claude, model):
    m = create(claude, model, max_tokens=CUT)
    assert m.stop_reason == "max_tokens"
    assert m.stop_sequence is None
    assert m.content[0].text == CUT_TEXT
    check_usage(m.usage, PROMPT_TOKENS, CUT)


def test_max_tokens_cut_stream(claude, model):
    plain = create(claude, model, max_tokens=CUT)
    events, final = streamed(claude, model, max_tokens=CUT)
    check_stream(events, final, plain)
    assert final.stop_reason == "max_tokens"
    assert final.content[0].text == CUT_TEXT
    check_usage(final.usage, PROMPT_TOKENS, CUT)


@pytest.mark.parametrize("stops", [[STOP], ["no such text", STOP]])
def test_stop_sequence(claude, model, stops):
    m = create(claude, model, max_tokens=MAX, stop_sequences=stops)
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == STOP  # the string that matched, not the first in the list
    assert m.content[0].text == STOPPED_TEXT
    check_usage(m.usage, PROMPT_TOKENS, STOPPED_TOKENS)


def test_stop_sequence_stream(claude, model):
    plain = create(claude, model, max_tokens=MAX, stop_sequences=["no such text", STOP])
    events, final = streamed(claude, model, max_tokens=MAX, stop_sequences=["no such text", STOP])
    check_stream(events, final, plain)
    assert final.stop_reason == "stop_sequence"
    assert final.stop_sequence == STOP
    assert final.content[0].text == STOPPED_TEXT
    check_usage(final.usage, PROMPT_TOKENS, STOPPED_TOKENS)


@pytest.mark.parametrize(
    "kw,count_kw",
    [
        ({"system": "You are terse."}, {"system": "You are terse."}),
        ({"system": [{"type": "text", "text": "You are terse."}]}, {"system": "You are terse."}),
        (
            {"messages": [{"role": "system", "content": "You are terse."}, user(QUESTION)]},
            {"system": "You are terse."},
        ),
        (
            {"messages": [user("Hi!"), {"role": "assistant", "content": "Hello!"}, user(QUESTION)]},
            {"messages": [user("Hi!"), {"role": "assistant", "content": "Hello!"}, user(QUESTION)]},
        ),
    ],
    ids=["system-string", "system-blocks", "system-role-in-messages", "multi-turn"],
)
def test_input_tokens_equal_count_tokens(claude, model, kw, count_kw):
    m = create(claude, model, max_tokens=1, **kw)
    expected = count_tokens(claude, model, count_kw.get("messages", MESSAGES), system=count_kw.get("system"))
    check_usage(m.usage, expected, 1)
    assert m.stop_reason == "max_tokens"


def test_openai_and_anthropic_agree_on_prompt_tokens(oai, claude, model):
    system = "You are terse."
    m = create(claude, model, max_tokens=1, system=system)
    c = oai.chat.completions.create(
        model=model,
        messages=[{"role": "system", "content": system}, user(QUESTION)],
        max_tokens=1,
        temperature=0,
    )
    assert m.usage.input_tokens + m.usage.cache_read_input_tokens == c.usage.prompt_tokens
    assert c.usage.prompt_tokens == count_tokens(claude, model, MESSAGES, system=system)


def test_raw_stream_event_names(server, model):
    frames = sse_data(
        server,
        "/v1/messages",
        {"model": model, "max_tokens": MAX, "temperature": 0, "stream": True, "messages": MESSAGES},
    )
    names = [ev for ev, _ in frames]
    for ev, data in frames:
        assert json.loads(data)["type"] == ev
    assert names[:2] == ["message_start", "content_block_start"]
    assert names[-3:] == ["content_block_stop", "message_delta", "message_stop"]
    start = json.loads(frames[0][1])["message"]["usage"]
    delta = json.loads(frames[-2][1])
    assert start["input_tokens"] == PROMPT_TOKENS
    assert delta["usage"]["output_tokens"] == ANSWER_TOKENS
    assert delta["delta"] == {"stop_reason": "end_turn", "stop_sequence": None}


def test_missing_max_tokens_is_400(server, model):
    status, _, body = http_json(server, "POST", "/v1/messages", {"model": model, "messages": MESSAGES})
    assert status == 400
    assert body["type"] == "error"
    assert body["error"]["type"] == "invalid_request_error"
    assert "max_tokens" in body["error"]["message"]


def test_bad_request_maps_to_sdk_error(claude, model):
    with pytest.raises(anthropic.BadRequestError) as e:
        create(claude, model, max_tokens=1, temperature=1.5)
    assert e.value.status_code == 400
    assert e.value.body["error"]["type"] == "invalid_request_error"


def test_stop_sequence_inside_a_token(claude, model):
    m = create(claude, model, max_tokens=MAX, stop_sequences=["Par"])
    assert m.stop_reason == "stop_sequence"
    assert m.stop_sequence == "Par"
    assert m.content[0].text == STOPPED_TEXT
    check_usage(m.usage, PROMPT_TOKENS, STOPPED_TOKENS)


@pytest.mark.parametrize(
    "max_tokens,stop_reason",
    [(ANSWER_TOKENS, "end_turn"), (ANSWER_TOKENS - 1, "max_tokens")],
)
def test_limit_at_the_natural_end(claude, model, max_tokens, stop_reason):
    m = create(claude, model, max_tokens=max_tokens)
    assert m.content[0].text == ANSWER
    assert m.stop_reason == stop_reason
    check_usage(m.usage, PROMPT_TOKENS, max_tokens)


def test_partial_stop_match_releases_held_back_text_stream(claude, model):
    plain = create(claude, model, max_tokens=MAX, stop_sequences=["Paris!"])
    events, final = streamed(claude, model, max_tokens=MAX, stop_sequences=["Paris!"])
    check_stream(events, final, plain)
    assert final.content[0].text == ANSWER
    assert final.stop_reason == "end_turn"
    assert final.stop_sequence is None
    check_usage(final.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_context_overflow_is_400(claude, model):
    long = [user("hi " * 9000)]
    assert count_tokens(claude, model, long) > 8192  # counting works past the window
    with pytest.raises(anthropic.BadRequestError) as e:
        create(claude, model, max_tokens=1, messages=long)
    assert e.value.body["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(
    "max_tokens,stop_reason,text",
    [(STOPPED_TOKENS, "stop_sequence", STOPPED_TEXT), (STOPPED_TOKENS - 1, "max_tokens", STOPPED_TEXT.rstrip())],
)
def test_stop_sequence_at_the_limit(claude, model, max_tokens, stop_reason, text):
    # The token that completes the stop sequence is also the last one allowed:
    # the stop sequence wins. One token less and the limit does.
    m = create(claude, model, max_tokens=max_tokens, stop_sequences=[STOP])
    assert (m.stop_reason, m.content[0].text) == (stop_reason, text)
    assert m.stop_sequence == (STOP if stop_reason == "stop_sequence" else None)
    check_usage(m.usage, PROMPT_TOKENS, max_tokens)
