"""Images through the official clients, on a vision model: the default GGUF beside a
random-weight projector (tools/py/vision_fixture.py: 16 tokens an image) on llama.cpp,
served by a `shoal serve` of this module's own.

Each client sends an image its own documented way and reads back its own usage type:
OpenAI's `image_url` parts (streamed, with the usage chunk) and Responses' `input_image`
(`prompt_tokens_details.image_tokens` / `input_tokens_details.image_tokens` ride as extra
fields of the SDK's models), Anthropic's base64 `image` block (its usage has no image field:
`input_tokens` + cache reads + cache writes add up to `count_tokens`, image included), and
Ollama's `images` (the client base64-encodes the bytes it is given). A bad image is each
SDK's own 400 error."""

from __future__ import annotations

import base64
import os
import struct
import zlib
from pathlib import Path
from typing import Iterator

import anthropic
import ollama
import openai
import pytest

from support import REPO, Server, anthropic_client, openai_client, start_server, stop_server

VISION_GGUF = Path(
    os.environ.get(
        "SHOAL_TEST_VISION_GGUF",
        REPO / ".cache/models/smollm2-vision-v1/SmolLM2-135M-Instruct.Q4_1.gguf",
    )
)
IMAGE_TOKENS = 16
QUESTION = "What is in this picture?"


def png(w: int, h: int, rgb: tuple[int, int, int]) -> bytes:
    """A PNG of one colour with a white corner, written by hand (no imaging library)."""
    rows = []
    for y in range(h):
        row = bytearray([0])
        for x in range(w):
            row += bytes((255, 255, 255)) if x < w // 2 and y < h // 3 else bytes(rgb)
        rows.append(bytes(row))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    head = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", head) + chunk(b"IDAT", zlib.compress(b"".join(rows))) + chunk(b"IEND", b"")


RED = png(40, 30, (200, 20, 20))
RED_B64 = base64.b64encode(RED).decode()
RED_URL = f"data:image/png;base64,{RED_B64}"


@pytest.fixture(scope="module")
def vision() -> Iterator[Server]:
    if not VISION_GGUF.is_file():
        pytest.fail(f"vision fixture missing: {VISION_GGUF} (make models)")
    srv = start_server("--model", str(VISION_GGUF), "--backend", "llama", "--prefix-cache-mb", "0")
    try:
        yield srv
    finally:
        stop_server(srv)


def image_tokens(details) -> int | None:
    """`image_tokens` from an SDK usage-details model, where it rides as an extra field."""
    if details is None:
        return None
    extra = getattr(details, "model_extra", None) or {}
    return getattr(details, "image_tokens", None) or extra.get("image_tokens")


def test_openai_chat_sends_image_parts_and_reads_their_tokens(vision: Server) -> None:
    oai = openai_client(vision)
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": RED_URL, "detail": "low"}}]
    r = oai.chat.completions.create(
        model=vision.model, messages=[{"role": "user", "content": content}], max_tokens=6, temperature=0
    )
    assert r.choices[0].finish_reason in ("stop", "length")
    assert image_tokens(r.usage.prompt_tokens_details) == IMAGE_TOKENS
    assert r.usage.prompt_tokens > IMAGE_TOKENS
    stream = oai.chat.completions.create(
        model=vision.model,
        messages=[{"role": "user", "content": content}],
        max_tokens=6,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    usage = chunks[-1].usage
    assert usage is not None and usage.prompt_tokens == r.usage.prompt_tokens
    assert image_tokens(usage.prompt_tokens_details) == IMAGE_TOKENS
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == r.choices[0].message.content, "greedy, streamed or not"


def test_openai_responses_sends_input_image(vision: Server) -> None:
    oai = openai_client(vision)
    r = oai.responses.create(
        model=vision.model,
        input=[{"role": "user", "content": [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": RED_URL}]}],
        max_output_tokens=16,
    )
    assert r.status in ("completed", "incomplete")
    assert image_tokens(r.usage.input_tokens_details) == IMAGE_TOKENS


def test_anthropic_image_block_is_counted_and_usage_adds_up(vision: Server) -> None:
    claude = anthropic_client(vision)
    blocks = [
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": RED_B64}},
        {"type": "text", "text": QUESTION},
    ]
    counted = claude.messages.count_tokens(model=vision.model, messages=[{"role": "user", "content": blocks}])
    text_only = claude.messages.count_tokens(model=vision.model, messages=[{"role": "user", "content": QUESTION}])
    assert counted.input_tokens == text_only.input_tokens + IMAGE_TOKENS
    m = claude.messages.create(model=vision.model, max_tokens=6, messages=[{"role": "user", "content": blocks}])
    u = m.usage
    whole = u.input_tokens + (u.cache_read_input_tokens or 0) + (u.cache_creation_input_tokens or 0)
    assert whole == counted.input_tokens


def test_ollama_client_sends_images_as_it_encodes_them(vision: Server) -> None:
    olm = ollama.Client(host=vision.url, timeout=120)
    r = olm.chat(
        model=vision.model,
        messages=[{"role": "user", "content": QUESTION, "images": [RED]}],
        options={"num_predict": 6, "temperature": 0},
    )
    # Ollama's client keeps only Ollama's fields (Shoal's `prompt_eval_image_count` is
    # dropped by its model): the image is in `prompt_eval_count`, 16 over the text alone.
    text = olm.chat(model=vision.model, messages=[{"role": "user", "content": QUESTION}], options={"num_predict": 1})
    assert r.done and r.prompt_eval_count == text.prompt_eval_count + IMAGE_TOKENS
    g = olm.generate(model=vision.model, prompt=QUESTION, images=[RED], options={"num_predict": 6, "temperature": 0})
    g_text = olm.generate(model=vision.model, prompt=QUESTION, options={"num_predict": 1})
    assert g.done and g.prompt_eval_count == g_text.prompt_eval_count + IMAGE_TOKENS


def test_a_bad_image_is_each_sdks_own_400(vision: Server) -> None:
    bad_url = "data:image/png;base64," + base64.b64encode(b"not a picture").decode()
    with pytest.raises(openai.BadRequestError) as e:
        openai_client(vision).chat.completions.create(
            model=vision.model,
            messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": bad_url}}, {"type": "text", "text": "hi"}]}],
            max_tokens=4,
        )
    assert "not a PNG, JPEG, WebP or GIF" in str(e.value)
    with pytest.raises(anthropic.BadRequestError) as e2:
        anthropic_client(vision).messages.create(
            model=vision.model,
            max_tokens=4,
            messages=[{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": RED_B64[: len(RED_B64) // 2]}},
                {"type": "text", "text": "hi"},
            ]}],
        )
    assert e2.value.status_code == 400
    with pytest.raises(ollama.ResponseError) as e3:
        ollama.Client(host=vision.url, timeout=120).chat(
            model=vision.model, messages=[{"role": "user", "content": "hi", "images": [b"not a picture"]}]
        )
    assert e3.value.status_code == 400
