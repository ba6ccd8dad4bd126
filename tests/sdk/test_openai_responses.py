"""POST /v1/responses and GET /v1/responses/{id} through the OpenAI Python SDK."""

from __future__ import annotations

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
    count_tokens,
    user,
)


def create(oai, model, **kw):
    kw.setdefault("input", QUESTION)
    kw.setdefault("temperature", 0)
    return oai.responses.create(model=model, **kw)


def check_usage(u, prompt, completion):
    assert u.input_tokens == prompt
    assert u.output_tokens == completion
    assert u.total_tokens == prompt + completion
    assert u.input_tokens_details.cached_tokens == 0
    assert u.output_tokens_details.reasoning_tokens == 0


def check_sequence(events):
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert events[0].type == "response.created"
    assert events[0].response.status == "in_progress"
    assert events[0].response.usage is None


def test_completed(oai, claude, model):
    r = create(oai, model, max_output_tokens=MAX)
    assert r.object == "response"
    assert r.id.startswith("resp_")
    assert r.model == model
    assert r.status == "completed"
    assert r.incomplete_details is None
    assert r.error is None
    assert r.output_text == ANSWER
    assert [(o.type, o.role, o.status) for o in r.output] == [("message", "assistant", "completed")]
    assert count_tokens(claude, model, [user(QUESTION)]) == PROMPT_TOKENS
    check_usage(r.usage, PROMPT_TOKENS, ANSWER_TOKENS)


def test_incomplete_max_output_tokens(oai, model):
    r = create(oai, model, max_output_tokens=CUT)
    assert r.status == "incomplete"
    assert r.incomplete_details.reason == "max_output_tokens"
    assert r.output_text == CUT_TEXT
    assert r.output[0].status == "incomplete"
    assert r.max_output_tokens == CUT
    check_usage(r.usage, PROMPT_TOKENS, CUT)


def test_stream_helper_completed_matches_non_stream(oai, model):
    plain = create(oai, model, max_output_tokens=MAX)
    with oai.responses.stream(model=model, input=QUESTION, temperature=0, max_output_tokens=MAX) as stream:
        events = list(stream)
        final = stream.get_final_response()
    check_sequence(events)
    assert events[-1].type == "response.completed"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == ANSWER
    assert [e.text for e in events if e.type == "response.output_text.done"] == [ANSWER]
    assert final.status == "completed"
    assert final.output_text == ANSWER
    assert final.usage.model_dump() == plain.usage.model_dump()
    check_usage(final.usage, PROMPT_TOKENS, ANSWER_TOKENS)
    # A streamed response is stored like any other.
    got = oai.responses.retrieve(final.id)
    assert got.output_text == ANSWER
    assert got.usage.model_dump() == final.usage.model_dump()


def test_stream_incomplete_matches_non_stream(oai, model):
    plain = create(oai, model, max_output_tokens=CUT)
    with create(oai, model, max_output_tokens=CUT, stream=True) as stream:
        events = list(stream)
    check_sequence(events)
    types = [e.type for e in events]
    assert types[-1] == "response.incomplete"
    assert "response.completed" not in types
    final = events[-1].response
    assert final.status == "incomplete"
    assert final.incomplete_details.reason == "max_output_tokens"
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == CUT_TEXT
    assert final.output_text == CUT_TEXT
    assert final.usage.model_dump() == plain.usage.model_dump()
    check_usage(final.usage, PROMPT_TOKENS, CUT)


@pytest.mark.parametrize(
    "kw,system",
    [
        ({"instructions": "You are terse."}, "You are terse."),
        ({"input": [{"role": "user", "content": QUESTION}]}, None),
        ({"input": [{"role": "developer", "content": "You are terse."}, {"role": "user", "content": QUESTION}]}, "You are terse."),
        ({"input": [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]}]}, None),
    ],
    ids=["instructions", "items", "developer-item", "input_text-parts"],
)
def test_input_tokens_equal_count_tokens(oai, claude, model, kw, system):
    r = create(oai, model, max_output_tokens=1, **kw)
    expected = count_tokens(claude, model, [user(QUESTION)], system=system)
    check_usage(r.usage, expected, 1)
    assert r.status == "incomplete"


def test_previous_response_id_round_trip(oai, claude, model):
    first = create(oai, model, max_output_tokens=MAX)
    assert first.status == "completed"
    follow_up = "And what is the capital of Germany?"
    second = create(oai, model, input=follow_up, previous_response_id=first.id, max_output_tokens=4)
    assert second.previous_response_id == first.id
    assert second.id != first.id
    assert second.usage.input_tokens > first.usage.input_tokens
    # Exactly the count of the whole conversation so far.
    convo = [user(QUESTION), {"role": "assistant", "content": first.output_text}, user(follow_up)]
    assert second.usage.input_tokens == count_tokens(claude, model, convo)
    check_usage(second.usage, second.usage.input_tokens, second.usage.output_tokens)
    assert second.usage.output_tokens <= 4
    # Both turns stay retrievable with the usage they were sent with.
    for r in (first, second):
        got = oai.responses.retrieve(r.id)
        assert got.id == r.id
        assert got.output_text == r.output_text
        assert got.usage.model_dump() == r.usage.model_dump()


def test_instructions_do_not_carry_over(oai, claude, model):
    first = create(oai, model, instructions="Answer in one short sentence.", max_output_tokens=MAX)
    follow_up = "And of Germany?"
    second = create(oai, model, input=follow_up, previous_response_id=first.id, max_output_tokens=1)
    # The earlier turn's instructions are dropped, so the default system prompt is back.
    convo = [user(QUESTION), {"role": "assistant", "content": first.output_text}, user(follow_up)]
    assert second.usage.input_tokens == count_tokens(claude, model, convo)
    third = create(
        oai, model, input=follow_up, previous_response_id=first.id, instructions="Be brief.", max_output_tokens=1
    )
    assert third.usage.input_tokens == count_tokens(claude, model, convo, system="Be brief.")


def test_stream_then_previous_response_id(oai, claude, model):
    with oai.responses.stream(model=model, input=QUESTION, temperature=0, max_output_tokens=MAX) as stream:
        first = stream.get_final_response()
    second = create(oai, model, input="Thanks!", previous_response_id=first.id, max_output_tokens=1)
    convo = [user(QUESTION), {"role": "assistant", "content": ANSWER}, user("Thanks!")]
    assert second.usage.input_tokens == count_tokens(claude, model, convo)


def test_store_false_is_not_retrievable(oai, model):
    r = create(oai, model, max_output_tokens=1, store=False)
    assert r.store is False
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(r.id)
    with pytest.raises(openai.BadRequestError):
        create(oai, model, input="Thanks!", previous_response_id=r.id, max_output_tokens=1)


def test_unknown_previous_response_id_is_400(oai, model):
    with pytest.raises(openai.BadRequestError) as e:
        create(oai, model, previous_response_id="resp_doesnotexist", max_output_tokens=1)
    assert e.value.status_code == 400
    assert e.value.body["param"] == "previous_response_id"


def test_retrieve_unknown_is_404(oai):
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve("resp_doesnotexist")
