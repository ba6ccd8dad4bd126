"""Structured output through the official SDKs on the real default model:
json_schema replies always parse and validate, streamed or not."""

from __future__ import annotations

import json

import openai
import pytest

from support import user

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string"},
        "country": {"type": "string"},
        "population": {"type": "integer"},
        "landmarks": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
    },
    "required": ["city", "country", "population", "landmarks"],
    "additionalProperties": False,
}
ASK = "Describe Paris as JSON."


def check(obj: dict) -> None:
    assert set(obj) == {"city", "country", "population", "landmarks"}
    assert isinstance(obj["city"], str) and isinstance(obj["country"], str)
    assert isinstance(obj["population"], int) and not isinstance(obj["population"], bool)
    assert isinstance(obj["landmarks"], list) and len(obj["landmarks"]) <= 3
    assert all(isinstance(x, str) for x in obj["landmarks"])


def test_chat_json_schema_streamed_and_not(oai, model):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA, "strict": True}}
    kw = dict(model=model, messages=[user(ASK)], response_format=fmt, temperature=0, max_tokens=200)
    r = oai.chat.completions.create(**kw)
    assert r.choices[0].finish_reason == "stop", r.choices[0].message.content
    check(json.loads(r.choices[0].message.content))
    text, usage = [], None
    for chunk in oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True}):
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            text.append(c.delta.content or "")
    assert "".join(text) == r.choices[0].message.content
    assert usage.model_dump() == r.usage.model_dump()


def test_chat_json_object_and_sampled_schema(oai, model):
    r = oai.chat.completions.create(model=model, messages=[user("Give me a JSON object about a cat.")],
                                    response_format={"type": "json_object"}, temperature=0, max_tokens=120)
    if r.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(r.choices[0].message.content), dict)
    else:
        assert r.choices[0].message.content.lstrip().startswith("{")
    # Sampling at temperature 1 still cannot leave the grammar.
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": SCHEMA}}
    for seed in (1, 2, 3):
        r = oai.chat.completions.create(model=model, messages=[user(ASK)], response_format=fmt,
                                        temperature=1.0, seed=seed, max_tokens=300)
        if r.choices[0].finish_reason == "stop":
            check(json.loads(r.choices[0].message.content))


def test_responses_text_format_json_schema(oai, model):
    r = oai.responses.create(model=model, input=ASK, temperature=0, max_output_tokens=200,
                             text={"format": {"type": "json_schema", "name": "city", "schema": SCHEMA}})
    assert r.status == "completed"
    check(json.loads(r.output_text))
    assert r.text.format.type == "json_schema"


def test_bad_schemas_are_400(oai, model):
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[user(ASK)], max_tokens=5, response_format={
            "type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}})
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[user(ASK)], max_tokens=5,
                                    response_format={"type": "yaml"})
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=model, input=ASK, max_output_tokens=5,
                             text={"format": {"type": "json_schema", "name": "x", "schema": 3}})
