"""POST /v1/completions (legacy, no chat template) through the OpenAI Python SDK."""

from __future__ import annotations

import json

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
    count_tokens,
    sse_data,
    user,
)


def create(oai, model, **kw):
    kw.setdefault("prompt", RAW_PROMPT)
    kw.setdefault("temperature", 0)
    return oai.completions.create(model=model, **kw)


def stream_chunks(oai, model, include_usage=True, **kw):
    if include_usage is not None:
        kw["stream_options"] = {"include_usage": include_usage}
    with create(oai, model, stream=True, **kw) as stream:
        return list(stream)


def per_choice(chunks):
    text: dict[int, str] = {}
    finish: dict[int, list[str]] = {}
    for c in chunks:
        for ch in c.choices:
            text[ch.index] = text.get(ch.index, "") + ch.text
            if ch.finish_reason is not None:
                finish.setdefault(ch.index, []).append(ch.finish_reason)
    return text, finish


def usage_of_stream(chunks):
    with_usage = [c for c in chunks if c.usage is not None]
    assert len(with_usage) == 1, [c.usage for c in with_usage]
    assert chunks[-1] is with_usage[0]
    assert chunks[-1].choices == []
    return chunks[-1].usage


def check_usage(u, prompt, completion):
    assert u.prompt_tokens == prompt
    assert u.completion_tokens == completion
    assert u.total_tokens == prompt + completion


def test_raw_chatml_prompt_counts_like_the_template(oai, claude, model):
    r = create(oai, model, max_tokens=MAX)
    assert r.object == "text_completion"
    assert r.id.startswith("cmpl-")
    assert r.model == model
    assert [(c.index, c.text, c.finish_reason) for c in r.choices] == [(0, ANSWER, "stop")]
    # The raw ChatML text is the chat template's rendering, token for token.
    assert count_tokens(claude, model, [user(QUESTION)]) == PROMPT_TOKENS
    check_usage(r.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_natural_stop_stream_matches_non_stream(oai, model):
    plain = create(oai, model, max_tokens=MAX)
    chunks = stream_chunks(oai, model, max_tokens=MAX)
    assert {c.id for c in chunks} == {chunks[0].id}
    text, finish = per_choice(chunks)
    assert text == {0: ANSWER}
    assert finish == {0: ["stop"]}
    u = usage_of_stream(chunks)
    assert u.model_dump() == plain.usage.model_dump()


def test_stream_without_include_usage_has_no_usage(oai, model):
    for opt in (None, False):
        chunks = stream_chunks(oai, model, include_usage=opt, max_tokens=MAX)
        assert all(c.usage is None for c in chunks)
        assert all(c.choices for c in chunks)
        assert per_choice(chunks) == ({0: ANSWER}, {0: ["stop"]})


@pytest.mark.parametrize("include_usage", [True, False])
def test_raw_sse_usage_chunk_right_before_done(server, model, include_usage):
    frames = sse_data(
        server,
        "/v1/completions",
        {
            "model": model,
            "prompt": RAW_PROMPT,
            "temperature": 0,
            "max_tokens": MAX,
            "stream": True,
            "stream_options": {"include_usage": include_usage},
        },
    )
    datas = [d for _, d in frames]
    assert datas[-1] == "[DONE]" and datas.count("[DONE]") == 1
    chunks = [json.loads(d) for d in datas[:-1]]
    with_usage = [i for i, c in enumerate(chunks) if c.get("usage") is not None]
    if include_usage:
        assert with_usage == [len(chunks) - 1]
        assert chunks[-1]["choices"] == []
        assert chunks[-1]["usage"]["completion_tokens"] == ANSWER_TOKENS
        assert chunks[-1]["usage"]["prompt_tokens"] == PROMPT_TOKENS
    else:
        assert with_usage == []


def test_max_tokens_cut(oai, model):
    r = create(oai, model, max_tokens=CUT)
    assert r.choices[0].finish_reason == "length"
    assert r.choices[0].text == CUT_TEXT
    check_usage(r.usage, PROMPT_TOKENS, CUT)


def test_max_tokens_cut_stream(oai, model):
    plain = create(oai, model, max_tokens=CUT)
    chunks = stream_chunks(oai, model, max_tokens=CUT)
    assert per_choice(chunks) == ({0: CUT_TEXT}, {0: ["length"]})
    u = usage_of_stream(chunks)
    assert u.model_dump() == plain.usage.model_dump()
    check_usage(u, PROMPT_TOKENS, CUT)


def test_default_max_tokens_is_16(oai, model):
    r = oai.completions.create(model=model, prompt="Once upon a time", temperature=0)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 16


@pytest.mark.parametrize("stop", [STOP, ["no such text", STOP]])
def test_stop_sequence(oai, model, stop):
    r = create(oai, model, max_tokens=MAX, stop=stop)
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].text == STOPPED_TEXT
    check_usage(r.usage, PROMPT_TOKENS, STOPPED_TOKENS)


def test_stop_sequence_stream(oai, model):
    chunks = stream_chunks(oai, model, max_tokens=MAX, stop=STOP)
    assert per_choice(chunks) == ({0: STOPPED_TEXT}, {0: ["stop"]})
    check_usage(usage_of_stream(chunks), PROMPT_TOKENS, STOPPED_TOKENS)


def test_n2(oai, model):
    r = create(oai, model, n=2, max_tokens=CUT)
    assert [(c.index, c.text, c.finish_reason) for c in r.choices] == [
        (0, CUT_TEXT, "length"),
        (1, CUT_TEXT, "length"),
    ]
    check_usage(r.usage, PROMPT_TOKENS, 2 * CUT)


def test_n2_stream(oai, model):
    plain = create(oai, model, n=2, max_tokens=MAX)
    chunks = stream_chunks(oai, model, n=2, max_tokens=MAX)
    assert per_choice(chunks) == ({0: ANSWER, 1: ANSWER}, {0: ["stop"], 1: ["stop"]})
    u = usage_of_stream(chunks)
    check_usage(u, PROMPT_TOKENS, 2 * ANSWER_TOKENS)
    assert u.model_dump() == plain.usage.model_dump()


def test_prompt_array_counts_each_prompt(oai, model):
    a, b = "Once upon a time", "The capital of France is"
    ua = create(oai, model, prompt=a, max_tokens=2).usage
    ub = create(oai, model, prompt=b, max_tokens=2).usage
    r = create(oai, model, prompt=[a, b], max_tokens=2)
    assert [c.index for c in r.choices] == [0, 1]
    assert all(c.finish_reason == "length" for c in r.choices)
    check_usage(r.usage, ua.prompt_tokens + ub.prompt_tokens, 4)


def test_prompt_array_with_n2(oai, model):
    a, b = "Once upon a time", "The capital of France is"
    pa = create(oai, model, prompt=a, max_tokens=1).usage.prompt_tokens
    pb = create(oai, model, prompt=b, max_tokens=1).usage.prompt_tokens
    r = create(oai, model, prompt=[a, b], n=2, max_tokens=2)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    # Choices 0-1 continue prompt a, 2-3 prompt b; greedy makes each pair equal.
    assert r.choices[0].text == r.choices[1].text
    assert r.choices[2].text == r.choices[3].text
    assert r.choices[2].text == create(oai, model, prompt=b, max_tokens=2).choices[0].text
    # Each prompt counts once, however many choices it has.
    check_usage(r.usage, pa + pb, 8)


@pytest.mark.parametrize("prompt,count", [([504, 3575, 282, 4649, 314], 5), ([[504, 3575], [282, 4649, 314]], 5)])
def test_token_id_prompt(oai, model, prompt, count):
    r = create(oai, model, prompt=prompt, max_tokens=1)
    assert len(r.choices) == (2 if isinstance(prompt[0], list) else 1)
    check_usage(r.usage, count, len(r.choices))


def test_echo_does_not_change_usage(oai, model):
    prompt = "The capital of France is"
    plain = create(oai, model, prompt=prompt, max_tokens=CUT)
    echoed = create(oai, model, prompt=prompt, max_tokens=CUT, echo=True)
    assert echoed.choices[0].text == prompt + plain.choices[0].text
    assert echoed.usage.model_dump() == plain.usage.model_dump()


def test_echo_stream(oai, model):
    prompt = "The capital of France is"
    plain = create(oai, model, prompt=prompt, max_tokens=CUT)
    chunks = stream_chunks(oai, model, prompt=prompt, max_tokens=CUT, echo=True)
    text, finish = per_choice(chunks)
    assert text == {0: prompt + plain.choices[0].text}
    assert finish == {0: ["length"]}
    assert usage_of_stream(chunks).model_dump() == plain.usage.model_dump()


def test_logprobs_count_matches_usage(oai, model):
    r = create(oai, model, max_tokens=CUT, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == r.usage.completion_tokens == CUT
    assert "".join(lp.tokens) == r.choices[0].text == CUT_TEXT
    assert all(len(top) == 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0
