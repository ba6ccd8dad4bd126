"""POST /v1/chat/completions through the OpenAI Python SDK."""

from __future__ import annotations

import json

import openai
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
    sse_data,
    user,
)

MESSAGES = [user(QUESTION)]


def create(oai, model, **kw):
    kw.setdefault("messages", MESSAGES)
    kw.setdefault("temperature", 0)
    return oai.chat.completions.create(model=model, **kw)


def stream_chunks(oai, model, include_usage=True, **kw):
    if include_usage is not None:
        kw["stream_options"] = {"include_usage": include_usage}
    with create(oai, model, stream=True, **kw) as stream:
        return list(stream)


def usage_of_stream(chunks):
    """The single usage chunk: the last one, with no choices."""
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1, [c.usage for c in with_usage]
    assert chunks[-1] is with_usage[0]
    assert chunks[-1].choices == []
    return chunks[-1].usage


def per_choice(chunks):
    """Text and finish reasons per choice index, from the chunks."""
    text: dict[int, str] = {}
    finish: dict[int, list[str]] = {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] = text.get(ch.index, "") + (ch.delta.content or "")
            if ch.finish_reason is not None:
                finish.setdefault(ch.index, []).append(ch.finish_reason)
    return text, finish


def check_usage(u, prompt, completion):
    assert u.prompt_tokens == prompt
    assert u.completion_tokens == completion
    assert u.total_tokens == prompt + completion
    assert u.prompt_tokens_details.cached_tokens == 0
    assert u.completion_tokens_details.reasoning_tokens == 0


def test_natural_stop(oai, claude, model):
    r = create(oai, model, max_tokens=MAX)
    assert r.object == "chat.completion"
    assert r.id.startswith("chatcmpl-")
    assert r.model == model
    assert len(r.choices) == 1
    ch = r.choices[0]
    assert (ch.index, ch.finish_reason) == (0, "stop")
    assert ch.message.role == "assistant"
    assert ch.message.content == ANSWER
    assert count_tokens(claude, model, MESSAGES) == PROMPT_TOKENS
    check_usage(r.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_natural_stop_stream_matches_non_stream(oai, model):
    plain = create(oai, model, max_tokens=MAX)
    chunks = stream_chunks(oai, model, max_tokens=MAX)
    assert {c.id for c in chunks} == {chunks[0].id}
    assert all(c.object == "chat.completion.chunk" and c.model == model for c in chunks)
    assert chunks[0].choices[0].delta.role == "assistant"
    text, finish = per_choice(chunks)
    assert text == {0: ANSWER}
    assert finish == {0: ["stop"]}
    u = usage_of_stream(chunks)
    assert u.model_dump() == plain.usage.model_dump()
    check_usage(u, PROMPT_TOKENS, ANSWER_TOKENS)


def test_stream_without_include_usage_has_no_usage(oai, model):
    for opt in (None, False):
        chunks = stream_chunks(oai, model, include_usage=opt, max_tokens=MAX)
        assert all(c.usage is None for c in chunks)
        assert all(c.choices for c in chunks), "a chunk without choices although usage was not asked for"
        text, finish = per_choice(chunks)
        assert text == {0: ANSWER} and finish == {0: ["stop"]}


@pytest.mark.parametrize("include_usage", [True, False])
def test_raw_sse_usage_chunk_right_before_done(server, model, include_usage):
    frames = sse_data(
        server,
        "/v1/chat/completions",
        {
            "model": model,
            "messages": MESSAGES,
            "temperature": 0,
            "max_tokens": MAX,
            "stream": True,
            "stream_options": {"include_usage": include_usage},
        },
    )
    assert all(ev is None for ev, _ in frames)
    datas = [d for _, d in frames]
    assert datas[-1] == "[DONE]"
    assert datas.count("[DONE]") == 1
    chunks = [json.loads(d) for d in datas[:-1]]
    with_usage = [i for i, c in enumerate(chunks) if c.get("usage") is not None]
    if include_usage:
        assert with_usage == [len(chunks) - 1]
        last = chunks[-1]
        assert last["choices"] == []
        assert last["usage"]["prompt_tokens"] == PROMPT_TOKENS
        assert last["usage"]["completion_tokens"] == ANSWER_TOKENS
        assert last["usage"]["total_tokens"] == PROMPT_TOKENS + ANSWER_TOKENS
    else:
        assert with_usage == []
        assert all(c["choices"] for c in chunks)


@pytest.mark.parametrize("limit_param", ["max_tokens", "max_completion_tokens"])
def test_max_tokens_cut(oai, model, limit_param):
    r = create(oai, model, **{limit_param: CUT})
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].message.content == CUT_TEXT
    check_usage(r.usage, PROMPT_TOKENS, CUT)


def test_max_tokens_cut_stream(oai, model):
    plain = create(oai, model, max_tokens=CUT)
    chunks = stream_chunks(oai, model, max_tokens=CUT)
    text, finish = per_choice(chunks)
    assert text == {0: CUT_TEXT}
    assert finish == {0: ["length"]}
    u = usage_of_stream(chunks)
    assert u.model_dump() == plain.usage.model_dump()
    check_usage(u, PROMPT_TOKENS, CUT)


@pytest.mark.parametrize("stop", [STOP, [STOP], ["no such text", STOP]])
def test_stop_sequence(oai, model, stop):
    r = create(oai, model, max_tokens=MAX, stop=stop)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == STOPPED_TEXT
    check_usage(r.usage, PROMPT_TOKENS, STOPPED_TOKENS)


def test_stop_sequence_stream(oai, model):
    chunks = stream_chunks(oai, model, max_tokens=MAX, stop=[STOP])
    text, finish = per_choice(chunks)
    assert text == {0: STOPPED_TEXT}
    assert finish == {0: ["stop"]}
    assert STOP not in text[0]
    check_usage(usage_of_stream(chunks), PROMPT_TOKENS, STOPPED_TOKENS)


@pytest.mark.parametrize(
    "max_tokens,text,finish,per_choice_tokens",
    [(MAX, ANSWER, "stop", ANSWER_TOKENS), (CUT, CUT_TEXT, "length", CUT)],
)
def test_n2(oai, model, max_tokens, text, finish, per_choice_tokens):
    r = create(oai, model, n=2, max_tokens=max_tokens)
    assert [c.index for c in r.choices] == [0, 1]
    for c in r.choices:
        assert c.message.content == text
        assert c.finish_reason == finish
    # The prompt counts once; completion tokens add up over the choices.
    check_usage(r.usage, PROMPT_TOKENS, 2 * per_choice_tokens)


def test_n2_stream(oai, model):
    plain = create(oai, model, n=2, max_tokens=MAX)
    chunks = stream_chunks(oai, model, n=2, max_tokens=MAX)
    for c in chunks[:-1]:
        assert len(c.choices) == 1
    text, finish = per_choice(chunks)
    assert text == {0: ANSWER, 1: ANSWER}
    assert finish == {0: ["stop"], 1: ["stop"]}
    roles = [ch.index for c in chunks for ch in c.choices if ch.delta.role == "assistant"]
    assert sorted(roles) == [0, 1]
    u = usage_of_stream(chunks)
    check_usage(u, PROMPT_TOKENS, 2 * ANSWER_TOKENS)
    assert u.model_dump() == plain.usage.model_dump()


@pytest.mark.parametrize(
    "messages,system",
    [
        ([{"role": "system", "content": "You are terse."}, user(QUESTION)], "You are terse."),
        ([{"role": "developer", "content": "You are terse."}, user(QUESTION)], "You are terse."),
        ([user("Hi!"), {"role": "assistant", "content": "Hello! How can I help?"}, user(QUESTION)], None),
        ([{"role": "user", "content": [{"type": "text", "text": QUESTION}]}], None),
    ],
    ids=["system", "developer", "multi-turn", "content-parts"],
)
def test_prompt_tokens_equal_count_tokens(oai, claude, model, messages, system):
    r = create(oai, model, messages=messages, max_tokens=1)
    anth_messages = [m for m in messages if m["role"] not in ("system", "developer")]
    expected = count_tokens(claude, model, anth_messages, system=system)
    assert r.usage.prompt_tokens == expected
    assert r.choices[0].finish_reason == "length"
    check_usage(r.usage, expected, 1)


def test_system_prompt_replaces_default(oai, model):
    r = create(oai, model, messages=[{"role": "system", "content": "Be brief."}, user(QUESTION)], max_tokens=1)
    assert r.usage.prompt_tokens != PROMPT_TOKENS


def test_logprobs_count_matches_usage(oai, model):
    r = create(oai, model, max_tokens=CUT, logprobs=True, top_logprobs=2)
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens == CUT
    assert "".join(t.token for t in content) == r.choices[0].message.content == CUT_TEXT
    for t in content:
        assert len(t.top_logprobs) == 2
        assert t.logprob <= 0
        # Greedy: the chosen token is the most likely one.
        assert t.token == t.top_logprobs[0].token


def test_seeded_sampling_is_reproducible(oai, model):
    kw = dict(temperature=1.0, seed=1234, max_tokens=8, messages=[user("Tell me a story.")])
    a = create(oai, model, **kw)
    b = create(oai, model, **kw)
    assert a.choices[0].message.content == b.choices[0].message.content
    assert a.usage.model_dump() == b.usage.model_dump()


def test_partial_stop_match_releases_held_back_text(oai, model):
    # " Paris" is held back while it could still become "Paris!", then released.
    plain = create(oai, model, max_tokens=MAX, stop=["Paris!"])
    assert plain.choices[0].message.content == ANSWER
    assert plain.choices[0].finish_reason == "stop"
    check_usage(plain.usage, PROMPT_TOKENS, ANSWER_TOKENS)
    chunks = stream_chunks(oai, model, max_tokens=MAX, stop=["Paris!"])
    assert per_choice(chunks) == ({0: ANSWER}, {0: ["stop"]})
    check_usage(usage_of_stream(chunks), PROMPT_TOKENS, ANSWER_TOKENS)


@pytest.mark.parametrize(
    "max_tokens,finish",
    [(ANSWER_TOKENS, "stop"), (ANSWER_TOKENS - 1, "length")],
)
def test_limit_at_the_natural_end(oai, model, max_tokens, finish):
    # With room for exactly the EOS the answer ends naturally; one less cuts it
    # after the full text, before the EOS.
    r = create(oai, model, max_tokens=max_tokens)
    assert r.choices[0].message.content == ANSWER
    assert r.choices[0].finish_reason == finish
    check_usage(r.usage, PROMPT_TOKENS, max_tokens)


def test_sdk_stream_helper_final_completion(oai, model):
    plain = create(oai, model, n=2, max_tokens=MAX)
    with oai.chat.completions.stream(
        model=model, messages=MESSAGES, temperature=0, n=2, max_tokens=MAX, stream_options={"include_usage": True}
    ) as stream:
        final = stream.get_final_completion()
    assert [(c.index, c.message.content, c.finish_reason) for c in final.choices] == [
        (0, ANSWER, "stop"),
        (1, ANSWER, "stop"),
    ]
    assert final.usage.model_dump() == plain.usage.model_dump()
    check_usage(final.usage, PROMPT_TOKENS, 2 * ANSWER_TOKENS)


def test_stream_logprobs_count_matches_usage(oai, model):
    chunks = stream_chunks(oai, model, max_tokens=CUT, logprobs=True, top_logprobs=1)
    tokens = [t.token for c in chunks for ch in c.choices if ch.logprobs for t in ch.logprobs.content]
    assert "".join(tokens) == CUT_TEXT
    assert len(tokens) == usage_of_stream(chunks).completion_tokens == CUT


def test_too_many_stop_sequences_is_400(oai, model):
    with pytest.raises(openai.BadRequestError) as e:
        create(oai, model, max_tokens=1, stop=["a", "b", "c", "d", "e"])
    assert e.value.param == "stop"


def test_context_overflow_is_400(oai, model):
    with pytest.raises(openai.BadRequestError) as e:
        create(oai, model, max_tokens=1, messages=[user("hi " * 9000)])
    assert e.value.code == "context_length_exceeded"


def test_logprob_bytes_rebuild_multibyte_text(oai, model):
    """`bytes` is each token's own UTF-8 bytes, so that characters split over
    several tokens can be put back together (the reason the field exists)."""
    r = create(oai, model, messages=[user("Translate 'good morning' into Japanese.")], max_tokens=10, logprobs=True)
    ch = r.choices[0]
    content = ch.logprobs.content
    assert len(content) == r.usage.completion_tokens == 10
    assert any(ord(c) > 0x2FFF for c in ch.message.content), ch.message.content  # CJK text came out
    joined = b"".join(bytes(t.bytes) for t in content)
    assert joined.decode("utf-8", errors="replace") == ch.message.content, [(t.token, t.bytes) for t in content]


def control_ids(oai, model):
    """The served model's control tokens, read from its GGUF (the path
    `/v1/models` reports): every token that can end a reply is one of them,
    whichever the engine ends on."""
    import gguf

    r = gguf.GGUFReader(oai.models.retrieve(model).model_extra["shoal"]["path"])
    types = r.fields["tokenizer.ggml.token_type"].contents()
    return [i for i, t in enumerate(types) if t == gguf.TokenType.CONTROL]


def test_logit_bias_bans_the_end_of_turn(oai, model):
    """`logit_bias` through the SDK: with the end of turn banned, the greedy
    answer runs on to the limit, and the finish and usage say so."""
    ban = {str(i): -100 for i in control_ids(oai, model)}
    assert ban
    r = create(oai, model, max_tokens=MAX, logit_bias=ban)
    ch = r.choices[0]
    assert ch.finish_reason == "length"
    assert ch.message.content.startswith(ANSWER) and ch.message.content != ANSWER
    check_usage(r.usage, PROMPT_TOKENS, MAX)
    for bad in ({"not-an-id": 1}, {"5": 101}):
        with pytest.raises(openai.BadRequestError) as e:
            create(oai, model, max_tokens=MAX, logit_bias=bad)
        assert e.value.param == "logit_bias", e.value.body
