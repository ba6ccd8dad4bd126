"""Tool calls through the official SDKs, on the real default model: a
required or named tool_choice forces a call (constrained decoding), the
finish says so in each dialect's words, streamed argument deltas add up to
the non-streamed call, usage is the same either way, and results round-trip."""

from __future__ import annotations

import json

import anthropic
import openai
import pytest

from support import user

WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city",
    "parameters": {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        },
        "required": ["city"],
    },
}
TIME = {
    "name": "get_time",
    "description": "Current time in a time zone",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]},
}
ASK = "What is the weather in Paris?"
MAX = 80


def chat_tools() -> list[dict]:
    return [{"type": "function", "function": t} for t in (WEATHER, TIME)]


def check_weather_args(arguments: str) -> dict:
    args = json.loads(arguments)
    assert isinstance(args, dict) and isinstance(args["city"], str) and args["city"]
    assert set(args) <= {"city", "unit"}
    if "unit" in args:
        assert args["unit"] in ("celsius", "fahrenheit")
    return args


@pytest.mark.parametrize("choice", [{"type": "function", "function": {"name": "get_weather"}}, "required"])
def test_openai_chat_forced_call_streamed_and_not(oai, model, choice):
    kw = dict(model=model, messages=[user(ASK)], tools=chat_tools(), tool_choice=choice,
              temperature=0, max_tokens=MAX)
    r = oai.chat.completions.create(**kw)
    c = r.choices[0]
    assert c.finish_reason == "tool_calls"
    assert c.message.tool_calls and len(c.message.tool_calls) == 1
    call = c.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    if isinstance(choice, dict):
        assert call.function.name == "get_weather"
    assert call.function.name in ("get_weather", "get_time")
    if call.function.name == "get_weather":
        check_weather_args(call.function.arguments)
    assert r.usage.completion_tokens > 5
    assert r.usage.total_tokens == r.usage.prompt_tokens + r.usage.completion_tokens

    stream = oai.chat.completions.create(**kw, stream=True, stream_options={"include_usage": True})
    names, args, finishes, usage, deltas = {}, {}, [], None, 0
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for ch in chunk.choices:
            if ch.finish_reason:
                finishes.append(ch.finish_reason)
            for tc in ch.delta.tool_calls or []:
                if tc.function and tc.function.name:
                    names[tc.index] = tc.function.name
                if tc.function and tc.function.arguments:
                    args[tc.index] = args.get(tc.index, "") + tc.function.arguments
                    deltas += 1
    assert finishes == ["tool_calls"]
    assert names == {0: call.function.name}
    assert args == {0: call.function.arguments}
    assert deltas > 1, "arguments should stream in pieces"
    assert usage is not None and usage.model_dump() == r.usage.model_dump()


def test_openai_chat_tool_call_cut_by_max_tokens_counts_exactly(oai, model):
    r = oai.chat.completions.create(model=model, messages=[user(ASK)], tools=chat_tools(),
                                    tool_choice="required", temperature=0, max_tokens=6)
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 6


def test_openai_chat_tool_result_round_trip(oai, model):
    first = oai.chat.completions.create(model=model, messages=[user(ASK)], tools=chat_tools(),
                                        tool_choice="required", temperature=0, max_tokens=MAX)
    call = first.choices[0].message.tool_calls[0]
    messages = [
        user(ASK),
        {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
        {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 21 degrees celsius"},
    ]
    r = oai.chat.completions.create(model=model, messages=messages, tools=chat_tools(),
                                    temperature=0, max_tokens=30)
    c = r.choices[0]
    assert c.finish_reason in ("stop", "length", "tool_calls")
    # The call and its result are part of the prompt now.
    assert r.usage.prompt_tokens > first.usage.prompt_tokens + 15
    if c.finish_reason != "tool_calls":
        assert c.message.content


def test_openai_chat_tool_choice_none_and_bad_tools(oai, model):
    r = oai.chat.completions.create(model=model, messages=[user(ASK)], tools=chat_tools(),
                                    tool_choice="none", temperature=0, max_tokens=12)
    assert r.choices[0].message.tool_calls is None
    assert r.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(model=model, messages=[user(ASK)], tools=chat_tools(),
                                    tool_choice={"type": "function", "function": {"name": "nope"}},
                                    max_tokens=5)
    assert "nope" in str(e.value)
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[user(ASK)], max_tokens=5,
                                    tools=[{"type": "function", "function": {"name": "bad name!"}}])
    with pytest.raises(openai.BadRequestError):
        oai.chat.completions.create(model=model, messages=[user(ASK), {"role": "tool", "content": "x"}],
                                    max_tokens=5)


def anthropic_tools() -> list[dict]:
    return [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]}
            for t in (WEATHER, TIME)]


def test_anthropic_forced_tool_use_streamed_and_not(claude, model):
    kw = dict(model=model, max_tokens=MAX, messages=[user(ASK)], tools=anthropic_tools(),
              tool_choice={"type": "tool", "name": "get_weather"}, extra_body={"temperature": 0})
    m = claude.messages.create(**kw)
    assert m.stop_reason == "tool_use"
    uses = [b for b in m.content if b.type == "tool_use"]
    assert len(uses) == 1 and uses[0].name == "get_weather" and uses[0].id.startswith("toolu_")
    check_weather_args(json.dumps(uses[0].input))
    counted = claude.messages.count_tokens(model=model, messages=[user(ASK)], tools=anthropic_tools())
    assert counted.input_tokens == m.usage.input_tokens

    with claude.messages.stream(**kw) as s:
        partial = "".join(e.partial_json for e in s if e.type == "input_json")
        final = s.get_final_message()
    assert final.stop_reason == "tool_use"
    fuses = [b for b in final.content if b.type == "tool_use"]
    assert [(b.name, b.input) for b in fuses] == [(b.name, b.input) for b in uses]
    assert json.loads(partial) == uses[0].input
    assert final.usage.output_tokens == m.usage.output_tokens
    assert final.usage.input_tokens == m.usage.input_tokens

    # tool_choice any: some tool is called.
    any_kw = dict(kw, tool_choice={"type": "any"})
    m2 = claude.messages.create(**any_kw)
    assert m2.stop_reason == "tool_use"
    assert [b.type for b in m2.content if b.type == "tool_use"] == ["tool_use"]


def test_anthropic_tool_result_round_trip_and_errors(claude, model):
    m = claude.messages.create(model=model, max_tokens=MAX, messages=[user(ASK)], tools=anthropic_tools(),
                               tool_choice={"type": "any"}, extra_body={"temperature": 0})
    use = next(b for b in m.content if b.type == "tool_use")
    messages = [
        user(ASK),
        {"role": "assistant", "content": [b.model_dump() for b in m.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                      "content": "Sunny, 21 degrees celsius"}]},
    ]
    r = claude.messages.create(model=model, max_tokens=30, messages=messages, tools=anthropic_tools(),
                               extra_body={"temperature": 0})
    assert r.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert r.usage.input_tokens > m.usage.input_tokens + 15
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=model, max_tokens=5, messages=[user(ASK)], tools=anthropic_tools(),
                               tool_choice={"type": "tool", "name": "nope"})
    with pytest.raises(anthropic.BadRequestError):
        claude.messages.create(model=model, max_tokens=5, messages=[user(ASK)],
                               tools=[{"name": "x"}])


def responses_tools() -> list[dict]:
    return [{"type": "function", **t} for t in (WEATHER, TIME)]


def test_responses_function_call_streamed_and_not(oai, model):
    kw = dict(model=model, input=ASK, tools=responses_tools(),
              tool_choice={"type": "function", "name": "get_weather"}, temperature=0, max_output_tokens=MAX)
    r = oai.responses.create(**kw)
    assert r.status == "completed"
    calls = [o for o in r.output if o.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert calls[0].call_id.startswith("call_")
    check_weather_args(calls[0].arguments)
    assert r.usage.output_tokens > 5

    deltas, final = [], None
    with oai.responses.stream(**kw) as s:
        for ev in s:
            if ev.type == "response.function_call_arguments.delta":
                deltas.append(ev.delta)
        final = s.get_final_response()
    fcalls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, c.arguments) for c in fcalls] == [(c.name, c.arguments) for c in calls]
    assert "".join(deltas) == calls[0].arguments and len(deltas) > 1
    assert final.usage.model_dump() == r.usage.model_dump()

    # The result goes back as a function_call_output item.
    follow = oai.responses.create(
        model=model, tools=responses_tools(), temperature=0, max_output_tokens=30,
        input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": calls[0].call_id, "name": calls[0].name,
             "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 degrees"},
        ],
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens > r.usage.input_tokens + 15

    # previous_response_id carries the call forward: the same conversation.
    chained = oai.responses.create(
        model=model, previous_response_id=r.id, tools=responses_tools(), temperature=0,
        max_output_tokens=30,
        input=[{"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 degrees"}],
    )
    assert chained.usage.input_tokens == follow.usage.input_tokens


def test_responses_namespace_tools_and_hosted_tools_as_codex_sends_them(oai, model):
    # Codex's shape: a namespace of functions beside a hosted tool a local server cannot run.
    tools = [{"type": "namespace", "name": "weather_v1", "description": "Weather lookups.",
              "tools": responses_tools()},
             {"type": "web_search", "external_web_access": False}]
    kw = dict(model=model, input=ASK, tools=tools, tool_choice={"type": "function", "name": "get_weather"},
              temperature=0, max_output_tokens=MAX)
    raw = oai.responses.with_raw_response.create(**kw)
    # The hosted tool is left out, and the response says so.
    assert raw.headers.get("x-shoal-omitted-tools") == "web_search"
    r = raw.parse()
    calls = [o for o in r.output if o.type == "function_call"]
    assert [(c.name, getattr(c, "namespace", None)) for c in calls] == [("get_weather", "weather_v1")]
    check_weather_args(calls[0].arguments)
    with oai.responses.stream(**kw) as s:
        final = s.get_final_response()
    fcalls = [o for o in final.output if o.type == "function_call"]
    assert [(c.name, getattr(c, "namespace", None), c.arguments) for c in fcalls] == \
        [(c.name, "weather_v1", c.arguments) for c in calls]
    # The call goes back with its namespace, as Codex replays it.
    follow = oai.responses.create(
        model=model, tools=tools, temperature=0, max_output_tokens=30,
        input=[
            {"role": "user", "content": ASK},
            {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather",
             "namespace": "weather_v1", "arguments": calls[0].arguments},
            {"type": "function_call_output", "call_id": calls[0].call_id, "output": "Sunny, 21 degrees"},
        ],
    )
    assert follow.status in ("completed", "incomplete")
    assert follow.usage.input_tokens > r.usage.input_tokens + 15


def test_responses_bad_tools_are_400(oai, model):
    with pytest.raises(openai.BadRequestError) as e:
        oai.responses.create(model=model, input=ASK, tools=[{"type": "custom", "name": "x"}], max_output_tokens=5)
    assert "'custom' is not supported" in str(e.value) and "Some(" not in str(e.value)
    with pytest.raises(openai.BadRequestError):
        oai.responses.create(model=model, input=ASK, tools=responses_tools(),
                             tool_choice={"type": "function", "name": "nope"}, max_output_tokens=5)
