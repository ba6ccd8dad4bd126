"""The /v1/usage ledger, cancellation, errors in each dialect, and queue overflow."""

from __future__ import annotations

import time

import anthropic
import openai
import pytest

from support import (
    ANSWER,
    ANSWER_TOKENS,
    CUT,
    CUT_TEXT,
    LONG_PROMPT,
    MAX,
    PROMPT_TOKENS,
    QUESTION,
    STOP,
    STOPPED_TEXT,
    STOPPED_TOKENS,
    anthropic_client,
    assert_usage_as_sent,
    http_json,
    ledger,
    ledger_entry,
    openai_client,
    start_server,
    stop_server,
    user,
)

GREEDY = {"temperature": 0}
ANTHROPIC_GREEDY = {"extra_body": GREEDY}  # this SDK version has no `temperature` argument
# A cap the counting reply cannot reach before its client leaves, on any machine:
# what a test cancels is still running when it cancels it.
LONG_MAX = 4000


def test_health_and_models(server, oai, model, embed_model):
    status, _, body = http_json(server, "GET", "/health")
    assert status == 200 and body["status"] == "ok" and body["model"] == model
    # The chat model, then the embedding model the session server also names.
    listed = oai.models.list().data
    assert [m.id for m in listed] == [model, embed_model]
    assert [m.model_extra["shoal"]["kind"] for m in listed] == ["chat", "embedding"]
    # The local metadata rides in the `shoal` extension field.
    m = oai.models.retrieve(model)
    assert m.id == model and m.owned_by == "shoal"
    meta = m.model_extra["shoal"]
    assert meta["architecture"] == "llama" and meta["quantization"] == "Q4_1"
    assert meta["context_length"] == 8192 and meta["loaded"] is True
    assert meta["memory_bytes"] > meta["size_bytes"] > 0  # dense float32 on the CPU backend
    assert meta["source"] == {"kind": "path"}
    # What the loaded model's chat template can do, read once at load.
    assert meta["capabilities"] == {
        "chat": True,
        "thinking": False,
        "tools": False,
        "tool_syntax": "hermes",
        "harmony": False,
        "system_role": True,
        # No thinking switch and no `</think>` token: asked to reason, it answers.
        "reasoning": False,
        # No projector beside it: it reads text only.
        "vision": False,
    }
    with pytest.raises(openai.NotFoundError) as e:
        oai.models.retrieve("no-such/model")
    assert e.value.body["code"] == "model_not_found"
    # The configured model is a file of the user's, not the library's to delete.
    with pytest.raises(openai.BadRequestError):
        oai.models.delete(model)


def test_ledger_records_ids_finish_reasons_and_usage_as_sent(server, oai, claude, model):
    sent: dict[str, tuple[str, bool, list[str], dict]] = {}

    r = oai.chat.completions.create(model=model, messages=[user(QUESTION)], n=2, max_tokens=CUT, **GREEDY)
    sent[r.id] = ("openai.chat", False, [c.finish_reason for c in r.choices], r.usage.model_dump(exclude_unset=True))

    with oai.chat.completions.create(
        model=model, messages=[user(QUESTION)], max_tokens=MAX, stop=STOP, stream=True,
        stream_options={"include_usage": True}, **GREEDY,
    ) as s:
        chunks = list(s)
    finishes = [ch.finish_reason for c in chunks for ch in c.choices if ch.finish_reason]
    sent[chunks[0].id] = ("openai.chat", True, finishes, chunks[-1].usage.model_dump(exclude_unset=True))

    r = oai.completions.create(model=model, prompt="The capital of France is", max_tokens=CUT, **GREEDY)
    sent[r.id] = ("openai.completions", False, [c.finish_reason for c in r.choices], r.usage.model_dump(exclude_unset=True))

    r = oai.responses.create(model=model, input=QUESTION, max_output_tokens=CUT, **GREEDY)
    # The ledger words a Responses finish as `status` or `status:incomplete_details.reason`.
    sent[r.id] = ("openai.responses", False, [f"{r.status}:{r.incomplete_details.reason}"], r.usage.model_dump(exclude_unset=True))

    r = oai.responses.create(model=model, input=QUESTION, max_output_tokens=MAX, **GREEDY)
    sent[r.id] = ("openai.responses", False, [r.status], r.usage.model_dump(exclude_unset=True))

    m = claude.messages.create(model=model, messages=[user(QUESTION)], max_tokens=MAX, **ANTHROPIC_GREEDY)
    sent[m.id] = ("anthropic.messages", False, [m.stop_reason], m.usage.model_dump(exclude_unset=True))

    with claude.messages.stream(
        model=model, messages=[user(QUESTION)], max_tokens=MAX, stop_sequences=[STOP], **ANTHROPIC_GREEDY
    ) as s:
        final = s.get_final_message()
    assert final.stop_reason == "stop_sequence"
    sent[final.id] = ("anthropic.messages", True, [final.stop_reason], final.usage.model_dump(exclude_unset=True))

    for rid, (dialect, stream, finishes, usage) in sent.items():
        e = ledger_entry(server, rid)
        assert e["dialect"] == dialect, e
        assert e["model"] == model
        assert e["stream"] is stream, e
        assert e["finish_reasons"] == finishes, e
        assert_usage_as_sent(e["usage"], usage)
        assert e["ttft_ms"] > 0

    # The ledger is newest first.
    order = [e["id"] for e in ledger(server) if e["id"] in sent]
    assert order == list(reversed(sent))
    status, _, body = http_json(server, "GET", "/v1/usage?limit=1")
    assert status == 200 and len(body["data"]) == 1


def _cancelled(e):
    return e["finish_reasons"] == ["cancelled"]


def test_closed_openai_chat_stream_is_cancelled(server, oai, model):
    stream = oai.chat.completions.create(
        model=model, messages=[user(LONG_PROMPT)], max_tokens=LONG_MAX, stream=True, **GREEDY
    )
    got, rid = 0, None
    for chunk in stream:
        rid = chunk.id
        got += sum(1 for ch in chunk.choices if ch.delta.content)
        if got >= 2:
            break
    stream.close()
    e = ledger_entry(server, rid, want=_cancelled)
    assert e["stream"] is True
    assert 2 <= e["usage"]["completion_tokens"] < LONG_MAX
    assert e["usage"]["prompt_tokens"] > 0
    assert e["usage"]["total_tokens"] == e["usage"]["prompt_tokens"] + e["usage"]["completion_tokens"]


def test_closed_anthropic_stream_is_cancelled(server, claude, model):
    rid = None
    with claude.messages.stream(
        model=model, messages=[user(LONG_PROMPT)], max_tokens=LONG_MAX, **ANTHROPIC_GREEDY
    ) as stream:
        deltas = 0
        for event in stream:
            if event.type == "message_start":
                rid = event.message.id
            if event.type == "content_block_delta":
                deltas += 1
                if deltas >= 2:
                    break
    e = ledger_entry(server, rid, want=_cancelled)
    assert e["dialect"] == "anthropic.messages"
    assert 2 <= e["usage"]["output_tokens"] < LONG_MAX


def test_closed_responses_stream_is_cancelled(server, oai, model):
    rid = None
    with oai.responses.create(
        model=model, input=LONG_PROMPT, max_output_tokens=LONG_MAX, stream=True, **GREEDY
    ) as stream:
        for event in stream:
            if event.type == "response.created":
                rid = event.response.id
            if event.type == "response.output_text.delta":
                break
    e = ledger_entry(server, rid, want=_cancelled)
    assert e["dialect"] == "openai.responses"
    assert 1 <= e["usage"]["output_tokens"] < LONG_MAX


def test_closed_n2_stream_cancels_every_choice(server, oai, model):
    """The ledger has one finish reason per choice, also when the client leaves
    during the first choice and the second never gets to run."""
    stream = oai.chat.completions.create(
        model=model, messages=[user(LONG_PROMPT)], n=2, max_tokens=LONG_MAX, stream=True, **GREEDY
    )
    got, rid = 0, None
    for chunk in stream:
        rid = chunk.id
        got += sum(1 for ch in chunk.choices if ch.delta.content)
        if got >= 2:
            break
    stream.close()
    e = ledger_entry(server, rid, want=lambda e: "cancelled" in e["finish_reasons"])
    assert e["finish_reasons"] == ["cancelled", "cancelled"], e
    assert 2 <= e["usage"]["completion_tokens"] < LONG_MAX


def test_abandoned_non_stream_request_is_cancelled(server, model):
    """A non-streaming client that gives up (times out) cancels its generation."""
    before = {e["id"] for e in ledger(server)}
    impatient = openai.OpenAI(base_url=server.url + "/v1", api_key="shoal-test", max_retries=0, timeout=1.5)
    with pytest.raises(openai.APITimeoutError):
        impatient.chat.completions.create(model=model, messages=[user(LONG_PROMPT)], max_tokens=LONG_MAX, **GREEDY)
    deadline = time.monotonic() + 60  # a hang guard: the loop ends on the entry
    while True:
        new = [e for e in ledger(server) if e["id"] not in before]
        if new or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(new) == 1, new
    assert new[0]["stream"] is False
    assert new[0]["finish_reasons"] == ["cancelled"]
    assert new[0]["usage"]["completion_tokens"] < LONG_MAX


# ------------------------------------------------------------ unknown model

NO_SUCH_MODEL = "no-such-model"


@pytest.mark.parametrize("call", ["chat", "chat-stream", "completions", "responses", "responses-stream"])
def test_unknown_model_openai(oai, call):
    with pytest.raises(openai.NotFoundError) as e:
        if call == "chat":
            oai.chat.completions.create(model=NO_SUCH_MODEL, messages=[user("hi")], max_tokens=1)
        elif call == "chat-stream":
            oai.chat.completions.create(model=NO_SUCH_MODEL, messages=[user("hi")], max_tokens=1, stream=True)
        elif call == "completions":
            oai.completions.create(model=NO_SUCH_MODEL, prompt="hi", max_tokens=1)
        elif call == "responses":
            oai.responses.create(model=NO_SUCH_MODEL, input="hi", max_output_tokens=1)
        else:
            oai.responses.create(model=NO_SUCH_MODEL, input="hi", max_output_tokens=1, stream=True)
    err = e.value
    assert err.status_code == 404
    assert err.code == "model_not_found"
    assert err.param == "model"
    assert err.type == "invalid_request_error"
    assert NO_SUCH_MODEL in err.message


@pytest.mark.parametrize("call", ["messages", "messages-stream", "count_tokens"])
def test_unknown_model_anthropic(claude, call):
    with pytest.raises(anthropic.NotFoundError) as e:
        if call == "messages":
            claude.messages.create(model=NO_SUCH_MODEL, messages=[user("hi")], max_tokens=1)
        elif call == "messages-stream":
            with claude.messages.stream(model=NO_SUCH_MODEL, messages=[user("hi")], max_tokens=1) as s:
                s.get_final_message()
        else:
            claude.messages.count_tokens(model=NO_SUCH_MODEL, messages=[user("hi")])
    err = e.value
    assert err.status_code == 404
    assert err.body["type"] == "error"
    assert err.body["error"]["type"] == "not_found_error"
    assert NO_SUCH_MODEL in err.body["error"]["message"]


def test_unknown_route_is_404_in_dialect(server):
    status, _, body = http_json(server, "GET", "/v1/nope")
    assert status == 404 and "error" in body and body["error"]["type"] == "invalid_request_error"
    status, _, body = http_json(server, "POST", "/v1/messages/nope", {})
    assert status == 404 and body["type"] == "error" and body["error"]["type"] == "not_found_error"


# ------------------------------------------- a second server: ids and queue

QUEUE_MODEL_ID = "shoal-queue-test"
QUEUE_ALIAS = "shoal-alias"


@pytest.fixture(scope="module")
def small_queue_server():
    # One running request and one queued: the next one overflows, whatever the speed.
    srv = start_server("--queue", "1", "--max-batch", "1", "--model-id", QUEUE_MODEL_ID, "--alias", QUEUE_ALIAS)
    try:
        yield srv
    finally:
        stop_server(srv)


def test_model_id_and_alias(small_queue_server):
    srv = small_queue_server
    assert srv.model == QUEUE_MODEL_ID
    oai2 = openai_client(srv)
    assert [m.id for m in oai2.models.list().data] == [QUEUE_MODEL_ID, QUEUE_ALIAS]
    r = oai2.chat.completions.create(model=QUEUE_ALIAS, messages=[user(QUESTION)], max_tokens=1, **GREEDY)
    assert r.model == QUEUE_ALIAS
    assert r.usage.prompt_tokens == PROMPT_TOKENS
    assert ledger_entry(srv, r.id)["model"] == QUEUE_ALIAS
    with pytest.raises(openai.NotFoundError):
        oai2.chat.completions.create(model="SmolLM2-135M-Instruct.Q4_1", messages=[user("hi")], max_tokens=1)


def test_queue_overflow_429_and_529(small_queue_server):
    srv = small_queue_server
    oai2 = openai_client(srv)
    claude2 = anthropic_client(srv)
    long_chat = dict(model=QUEUE_MODEL_ID, messages=[user(LONG_PROMPT)], max_tokens=2000, stream=True, **GREEDY)
    running = oai2.chat.completions.create(**long_chat)
    first = next(iter(running))  # the engine is busy with it now
    waiting = oai2.chat.completions.create(**long_chat)  # takes the one queue slot
    try:
        with pytest.raises(openai.RateLimitError) as e:
            oai2.chat.completions.create(model=QUEUE_MODEL_ID, messages=[user("hi")], max_tokens=1)
        assert e.value.status_code == 429
        assert e.value.response.headers.get("retry-after") == "1"
        assert e.value.type == "rate_limit_error"
        with pytest.raises(openai.RateLimitError):
            oai2.responses.create(model=QUEUE_MODEL_ID, input="hi", max_output_tokens=1)
        with pytest.raises(anthropic.OverloadedError) as e2:
            claude2.messages.create(model=QUEUE_MODEL_ID, messages=[user("hi")], max_tokens=1)
        assert e2.value.status_code == 529
        assert e2.value.response.headers.get("retry-after") == "1"
        assert e2.value.body == {"type": "error", "error": {"type": "overloaded_error", "message": e2.value.body["error"]["message"]}}
    finally:
        waiting.close()
        running.close()
    # Both clients left: the running one is cancelled, the queued one is dropped,
    # and the server takes new work again.
    deadline = time.monotonic() + 60
    while True:
        try:
            r = oai2.chat.completions.create(model=QUEUE_MODEL_ID, messages=[user(QUESTION)], max_tokens=2, **GREEDY)
            break
        except openai.RateLimitError:
            assert time.monotonic() < deadline, "the queue never drained after both clients left"
            time.sleep(0.2)
    assert r.usage.completion_tokens == 2
    ledger_entry(srv, first.id, want=_cancelled)


def test_queued_then_abandoned_stream_is_cancelled_in_ledger(small_queue_server):
    """A stream closed while still waiting in the queue is a cancelled request too."""
    srv = small_queue_server
    oai2 = openai_client(srv)
    long_chat = dict(model=QUEUE_MODEL_ID, messages=[user(LONG_PROMPT)], max_tokens=LONG_MAX, stream=True, **GREEDY)
    before = {e["id"] for e in ledger(srv)}
    running = oai2.chat.completions.create(**long_chat)
    first = next(iter(running))
    waiting = oai2.chat.completions.create(**long_chat)
    time.sleep(0.3)
    waiting.close()
    running.close()
    ledger_entry(srv, first.id, want=_cancelled)
    deadline = time.monotonic() + 60
    while True:
        new = [e for e in ledger(srv) if e["id"] not in before and e["id"] != first.id]
        if new or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert len(new) == 1, f"the abandoned queued request is missing from the ledger: {new}"
    assert new[0]["finish_reasons"] == ["cancelled"], new[0]


def test_concurrent_requests_keep_their_own_numbers(oai, claude, model):
    """Requests of different dialects in flight together each get their own exact usage."""
    from concurrent.futures import ThreadPoolExecutor

    def chat():
        r = oai.chat.completions.create(model=model, messages=[user(QUESTION)], max_tokens=CUT, **GREEDY)
        return r.choices[0].message.content, r.usage.prompt_tokens, r.usage.completion_tokens

    def chat_stream():
        with oai.chat.completions.create(
            model=model, messages=[user(QUESTION)], max_tokens=MAX, stream=True,
            stream_options={"include_usage": True}, **GREEDY,
        ) as s:
            chunks = list(s)
        text = "".join(ch.delta.content or "" for c in chunks for ch in c.choices)
        return text, chunks[-1].usage.prompt_tokens, chunks[-1].usage.completion_tokens

    def messages():
        m = claude.messages.create(
            model=model, messages=[user(QUESTION)], max_tokens=MAX, stop_sequences=[STOP], **ANTHROPIC_GREEDY
        )
        return m.content[0].text, m.usage.input_tokens, m.usage.output_tokens

    def responses():
        r = oai.responses.create(model=model, input=QUESTION, max_output_tokens=MAX, **GREEDY)
        return r.output_text, r.usage.input_tokens, r.usage.output_tokens

    with ThreadPoolExecutor(4) as pool:
        futures = [pool.submit(f) for f in (chat, chat_stream, messages, responses)]
        results = [f.result(timeout=120) for f in futures]
    assert results == [
        (CUT_TEXT, PROMPT_TOKENS, CUT),
        (ANSWER, PROMPT_TOKENS, ANSWER_TOKENS),
        (STOPPED_TEXT, PROMPT_TOKENS, STOPPED_TOKENS),
        (ANSWER, PROMPT_TOKENS, ANSWER_TOKENS),
    ]


# ------------------------------------------- the server's time limit

REQUEST_ID = "x-shoal-request-id"


@pytest.fixture(scope="module")
def timeout_server():
    # A one-second limit the counting reply runs far past on any machine.
    srv = start_server("--request-timeout-secs", "1")
    try:
        yield srv
    finally:
        stop_server(srv)


def _timed_out(e: dict) -> bool:
    return e["engine_finish_reasons"] == ["timeout"]


@pytest.mark.parametrize("call", ["chat", "chat-stream", "completions", "completions-stream"])
def test_openai_sdk_reads_a_timeout_that_carries_its_usage(timeout_server, call):
    """A timeout is the SDK's own error (504, or an error chunk in a stream);
    the usage Shoal sends beside it does not get in the SDK's way, and the
    non-streamed body's usage is the ledger's."""
    srv = timeout_server
    oai2 = openai_client(srv)
    kw = dict(model=srv.model, max_tokens=LONG_MAX, **GREEDY)
    if call.startswith("chat"):
        make = lambda **more: oai2.chat.completions.create(messages=[user(LONG_PROMPT)], **kw, **more)
    else:
        make = lambda **more: oai2.completions.create(prompt="1, 2, 3, 4, 5, 6,", **kw, **more)
    if call.endswith("stream"):
        stream = make(stream=True)
        request_id = stream.response.headers[REQUEST_ID]
        with pytest.raises(openai.APIError) as e:
            for _ in stream:
                pass
        assert e.value.code == "request_timeout"
        assert e.value.type == "timeout_error"
        ledger_entry(srv, request_id, want=_timed_out)
        return
    with pytest.raises(openai.InternalServerError) as e:
        make()
    err = e.value
    assert err.status_code == 504
    assert err.code == "request_timeout"
    assert "time limit of 1 s" in err.message
    entry = ledger_entry(srv, err.response.headers[REQUEST_ID], want=_timed_out)
    assert err.response.json()["usage"] == entry["usage"]


@pytest.mark.parametrize("stream", [False, True])
def test_anthropic_sdk_reads_a_timeout_that_carries_its_usage(timeout_server, stream):
    srv = timeout_server
    claude2 = anthropic_client(srv)
    kw = dict(model=srv.model, messages=[user(LONG_PROMPT)], max_tokens=LONG_MAX, **ANTHROPIC_GREEDY)
    if stream:
        with claude2.messages.stream(**kw) as s:
            request_id = s.response.headers[REQUEST_ID]
            with pytest.raises(anthropic.APIStatusError) as e:
                s.get_final_message()
    else:
        with pytest.raises(anthropic.InternalServerError) as e:
            claude2.messages.create(**kw)
        assert e.value.status_code == 504
        request_id = e.value.response.headers[REQUEST_ID]
    body = e.value.body
    assert body["type"] == "error" and body["error"]["type"] == "timeout_error", body
    entry = ledger_entry(srv, request_id, want=_timed_out)
    assert body["usage"] == entry["usage"]
    assert body["usage"]["output_tokens"] < LONG_MAX
