"""Reasoning through the official SDKs: the server opens a thinking section
for the default model (which has none of its own), closes it when the budget
is spent, and counts reasoning tokens exactly."""

from __future__ import annotations

from support import QUESTION, user

BUDGET = 5


def test_openai_chat_reasoning_budget_exact(oai, model):
    r = oai.chat.completions.create(
        model=model, messages=[user(QUESTION)], temperature=0, max_tokens=30,
        extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    assert r.usage.completion_tokens_details.reasoning_tokens == BUDGET
    msg = r.choices[0].message
    reasoning = (msg.model_extra or {}).get("reasoning_content")
    assert reasoning and "<think>" not in reasoning and "</think>" not in reasoning
    assert msg.content and "</think>" not in msg.content
    assert r.usage.completion_tokens > BUDGET

    stream = oai.chat.completions.create(
        model=model, messages=[user(QUESTION)], temperature=0, max_tokens=30, stream=True,
        stream_options={"include_usage": True}, extra_body={"reasoning": {"max_tokens": BUDGET}},
    )
    parts, text, usage = [], [], None
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for c in chunk.choices:
            extra = c.delta.model_extra or {}
            if extra.get("reasoning_content"):
                parts.append(extra["reasoning_content"])
            if c.delta.content:
                text.append(c.delta.content)
    assert "".join(parts) == reasoning
    assert "".join(text) == msg.content
    assert usage is not None and usage.model_dump() == r.usage.model_dump()


def test_openai_reasoning_effort_none_means_no_reasoning(oai, model):
    r = oai.chat.completions.create(
        model=model, messages=[user(QUESTION)], temperature=0, max_tokens=12, reasoning_effort="none",
    )
    assert r.usage.completion_tokens_details.reasoning_tokens == 0
    assert "reasoning_content" not in (r.choices[0].message.model_extra or {})


def test_anthropic_thinking_blocks_with_budget(claude, model):
    kw = dict(model=model, max_tokens=30, messages=[user(QUESTION)],
              thinking={"type": "enabled", "budget_tokens": BUDGET}, extra_body={"temperature": 0})
    m = claude.messages.create(**kw)
    assert [b.type for b in m.content] == ["thinking", "text"]
    assert m.content[0].thinking and m.content[1].text
    with claude.messages.stream(**kw) as s:
        final = s.get_final_message()
    assert [b.type for b in final.content] == ["thinking", "text"]
    assert final.content[0].thinking == m.content[0].thinking
    assert final.usage.output_tokens == m.usage.output_tokens
    assert m.stop_reason in ("end_turn", "max_tokens")


def test_responses_reasoning_item_and_tokens(oai, model):
    r = oai.responses.create(model=model, input=QUESTION, temperature=0, max_output_tokens=30,
                             reasoning={"effort": "low"})
    kinds = [item.type for item in r.output]
    assert kinds[0] == "reasoning"
    rt = r.usage.output_tokens_details.reasoning_tokens
    assert 0 < rt <= r.usage.output_tokens
