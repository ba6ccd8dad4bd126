"""Embeddings on the shared server (all-MiniLM-L6-v2 served beside the chat
model) through the official clients, unmodified: the OpenAI SDK's
`embeddings.create` (floats, base64, token arrays, errors), the Ollama
client's `embed` and legacy `embeddings`, and LiteLLM's `embedding`.

Every vector is checked against the independent numpy reference
(tools/py/bert_reference.py on the model's Hugging Face directory), and every
token count against the `tokenizers` package's count of the same text.
"""

from __future__ import annotations

import base64
import os

import numpy as np
import ollama
import openai
import pytest

from support import Server, http_json

MATCH = 0.999  # server vector vs the float64 reference (the GGUF's matrices are float16)
SAME = 0.9999  # the same input embedded twice by the server (alone, batched, another route)
DIMS = 384
WINDOW = 512
TOO_LONG = "word " * 1000  # 1002 tokens with [CLS] and [SEP]


def cos(a, b) -> float:
    a = np.asarray(a, dtype=np.float64)
    b = np.asarray(b, dtype=np.float64)
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def unit(v) -> None:
    v = np.asarray(v, dtype=np.float64)
    assert v.shape == (DIMS,)
    assert abs(np.linalg.norm(v) - 1.0) < 1e-3, np.linalg.norm(v)


def close_to(got, want, at: str, floor: float = MATCH) -> None:
    c = cos(got, want)
    assert c >= floor, f"{at}: cosine {c:.6f} < {floor}"


@pytest.fixture(scope="module")
def olm(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def lone(oai: openai.OpenAI, embed_model: str, embed_reference) -> list[list[float]]:
    """Each corpus entry embedded in a request of its own (the SDK's default encoding)."""
    out = []
    for i, text in enumerate(embed_reference.corpus):
        r = oai.embeddings.create(model=embed_model, input=text)
        assert len(r.data) == 1 and r.data[0].index == 0, f"entry {i}"
        assert r.usage.prompt_tokens == r.usage.total_tokens == embed_reference.counts[i], (
            f"entry {i} {text[:40]!r}: server counted {r.usage.prompt_tokens} tokens, "
            f"the tokenizers package {embed_reference.counts[i]}"
        )
        out.append(r.data[0].embedding)
    return out


# ------------------------------------------------------------------ OpenAI SDK


def test_models_lists_the_embedding_model(server: Server, model: str, embed_model: str) -> None:
    status, _, body = http_json(server, "GET", "/v1/models")
    assert status == 200
    ids = [m["id"] for m in body["data"]]
    assert model in ids and embed_model in ids and model != embed_model
    entry = next(m for m in body["data"] if m["id"] == embed_model)
    assert entry["shoal"]["kind"] == "embedding"
    info = entry["shoal"]["embedding"]
    assert info["dimensions"] == DIMS and info["max_input_tokens"] == WINDOW
    assert info["pooling"] == "mean" and info["normalize"] is True


def test_one_string(oai: openai.OpenAI, embed_model: str, embed_reference) -> None:
    ref = embed_reference
    r = oai.embeddings.create(model=embed_model, input=ref.corpus[1])
    assert r.object == "list" and r.model == embed_model
    assert len(r.data) == 1
    d = r.data[0]
    assert d.object == "embedding" and d.index == 0
    unit(d.embedding)
    close_to(d.embedding, ref.vectors[1], "A man is eating food.")
    assert r.usage.prompt_tokens == r.usage.total_tokens == ref.counts[1]


def test_similar_sentences_are_close(oai: openai.OpenAI, embed_model: str, embed_reference) -> None:
    texts = embed_reference.corpus[1:4]  # eating food / eating bread / carrying a baby
    v = [d.embedding for d in oai.embeddings.create(model=embed_model, input=texts).data]
    assert cos(v[0], v[1]) > 0.7
    assert cos(v[0], v[2]) < 0.2 and cos(v[1], v[2]) < 0.2


def test_every_corpus_entry_alone_matches_the_reference(lone, embed_reference) -> None:
    for i, v in enumerate(lone):
        unit(v)
        close_to(v, embed_reference.vectors[i], f"entry {i} {embed_reference.corpus[i][:40]!r}")


def test_the_corpus_in_one_request(oai: openai.OpenAI, embed_model: str, embed_reference, lone) -> None:
    ref = embed_reference
    r = oai.embeddings.create(model=embed_model, input=ref.corpus)
    assert [d.index for d in r.data] == list(range(len(ref.corpus)))
    assert r.usage.prompt_tokens == r.usage.total_tokens == sum(ref.counts)
    for i, d in enumerate(r.data):
        unit(d.embedding)
        close_to(d.embedding, ref.vectors[i], f"batched entry {i}")
        close_to(d.embedding, lone[i], f"batched entry {i} vs alone", SAME)


def test_base64_is_the_float_vector(oai: openai.OpenAI, embed_model: str, embed_reference) -> None:
    texts = embed_reference.corpus[:3]
    floats = oai.embeddings.create(model=embed_model, input=texts, encoding_format="float")
    packed = oai.embeddings.create(model=embed_model, input=texts, encoding_format="base64")
    assert packed.usage.prompt_tokens == floats.usage.prompt_tokens == sum(embed_reference.counts[:3])
    for f, p in zip(floats.data, packed.data):
        assert isinstance(p.embedding, str) and isinstance(f.embedding, list)
        decoded = np.frombuffer(base64.b64decode(p.embedding), dtype="<f4")
        assert decoded.shape == (DIMS,)
        np.testing.assert_allclose(decoded, np.asarray(f.embedding, dtype=np.float32), rtol=0, atol=1e-6)
        close_to(decoded, embed_reference.vectors[f.index], f"base64 entry {f.index}")


def test_token_arrays(oai: openai.OpenAI, embed_model: str, embed_reference) -> None:
    ref = embed_reference
    assert ref.corpus[0] == "Hello" and ref.ids[0] == [101, 7592, 102]  # [CLS] hello [SEP]
    r = oai.embeddings.create(model=embed_model, input=[[101, 7592, 102]])
    assert r.usage.prompt_tokens == r.usage.total_tokens == 3
    close_to(r.data[0].embedding, ref.vectors[0], "[[101, 7592, 102]]")
    # Several token arrays, the text's ids among them, and one flat array (one input).
    ids = [ref.ids[1], [101, 2088, 102], ref.ids[3]]
    r = oai.embeddings.create(model=embed_model, input=ids)
    want = ref.vectors_of(ids)
    assert r.usage.prompt_tokens == sum(map(len, ids))
    for i, d in enumerate(r.data):
        close_to(d.embedding, want[i], f"token array {i}")
    r = oai.embeddings.create(model=embed_model, input=ref.ids[2])
    assert len(r.data) == 1 and r.usage.prompt_tokens == ref.counts[2]
    close_to(r.data[0].embedding, ref.vectors[2], "flat token array")


def test_dimensions(oai: openai.OpenAI, embed_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=embed_model, input="Hello", dimensions=128)
    assert e.value.status_code == 400 and "dimensions" in str(e.value)
    # The model's own length is no shortening.
    r = oai.embeddings.create(model=embed_model, input="Hello", dimensions=DIMS)
    assert len(r.data[0].embedding) == DIMS


BAD_INPUTS = {
    "empty string": "",
    "empty list": [],
    "one empty string": ["ok", ""],
    "a number": 123,
    "token id out of vocabulary": [[999999]],
    "too many inputs": ["x"] * 2049,
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
def test_bad_input_is_an_openai_400(server: Server, oai: openai.OpenAI, embed_model: str, case: str) -> None:
    bad = BAD_INPUTS[case]
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=embed_model, input=bad, encoding_format="float")
    assert e.value.status_code == 400
    status, _, body = http_json(server, "POST", "/v1/embeddings", {"model": embed_model, "input": bad})
    assert status == 400, body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, body
    assert isinstance(err["message"], str) and err["message"]
    assert err["type"] == "invalid_request_error" and err["param"] == "input"


def test_still_serving_after_bad_inputs(oai: openai.OpenAI, embed_model: str, embed_reference) -> None:
    for bad in BAD_INPUTS.values():
        with pytest.raises(openai.BadRequestError):
            oai.embeddings.create(model=embed_model, input=bad, encoding_format="float")
    r = oai.embeddings.create(model=embed_model, input=embed_reference.corpus[2])
    close_to(r.data[0].embedding, embed_reference.vectors[2], "after the errors")
    assert r.usage.prompt_tokens == embed_reference.counts[2]


def test_a_chat_model_gives_no_embeddings(server: Server, oai: openai.OpenAI, model: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=model, input="Hello")
    assert e.value.status_code == 400 and "not an embedding model" in str(e.value)
    status, _, body = http_json(server, "POST", "/v1/embeddings", {"model": model, "input": "Hello"})
    assert status == 400 and body["error"]["param"] == "model", body


def test_the_embedding_model_does_not_chat(oai: openai.OpenAI, embed_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.chat.completions.create(
            model=embed_model, messages=[{"role": "user", "content": "Hello"}], max_tokens=8
        )
    assert e.value.status_code == 400 and "is an embedding model" in str(e.value)


# --------------------------------------------------------------- Ollama client


def test_ollama_embed(olm: ollama.Client, embed_model: str, embed_reference) -> None:
    ref = embed_reference
    r = olm.embed(model=embed_model, input=ref.corpus)
    assert len(r.embeddings) == len(ref.corpus)
    assert r.prompt_eval_count == sum(ref.counts)
    assert isinstance(r.total_duration, int) and isinstance(r.load_duration, int)
    assert r.total_duration > 0 and r.load_duration >= 0
    for i, v in enumerate(r.embeddings):
        unit(v)
        close_to(v, ref.vectors[i], f"ollama entry {i}")
    one = olm.embed(model=embed_model, input=ref.corpus[1])
    assert len(one.embeddings) == 1 and one.prompt_eval_count == ref.counts[1]
    close_to(one.embeddings[0], ref.vectors[1], "ollama one string")


def test_ollama_truncate(olm: ollama.Client, embed_model: str, embed_reference) -> None:
    ids = embed_reference.model.tokenize([TOO_LONG])[0]
    assert len(ids) > WINDOW
    r = olm.embed(model=embed_model, input=TOO_LONG, truncate=True)
    assert r.prompt_eval_count == WINDOW and len(r.embeddings) == 1
    unit(r.embeddings[0])
    # The window's first tokens, still closed by [SEP].
    want = embed_reference.vectors_of([ids[: WINDOW - 1] + ids[-1:]])[0]
    close_to(r.embeddings[0], want, "truncated input")
    # Ollama truncates by default too.
    assert olm.embed(model=embed_model, input=TOO_LONG).prompt_eval_count == WINDOW
    with pytest.raises(ollama.ResponseError) as e:
        olm.embed(model=embed_model, input=TOO_LONG, truncate=False)
    assert e.value.status_code == 400


def test_openai_refuses_too_long_input(oai: openai.OpenAI, embed_model: str) -> None:
    with pytest.raises(openai.BadRequestError) as e:
        oai.embeddings.create(model=embed_model, input=TOO_LONG)
    assert e.value.status_code == 400


def test_ollama_legacy_embeddings(olm: ollama.Client, embed_model: str, embed_reference) -> None:
    text = embed_reference.corpus[2]
    legacy = olm.embeddings(model=embed_model, prompt=text)
    assert len(legacy.embedding) == DIMS
    new = olm.embed(model=embed_model, input=text).embeddings[0]
    close_to(legacy.embedding, new, "legacy vs embed", SAME)
    close_to(legacy.embedding, embed_reference.vectors[2], "legacy vs reference")


def test_ollama_names(olm: ollama.Client, embed_model: str, embed_reference) -> None:
    latest = f"{embed_model}:latest"
    assert latest in [m.model for m in olm.list().models]
    assert "embedding" in olm.show(latest).capabilities
    a = olm.embed(model=latest, input=embed_reference.corpus[3])
    b = olm.embed(model=embed_model, input=embed_reference.corpus[3])
    close_to(a.embeddings[0], b.embeddings[0], "name:latest vs name", SAME)
    close_to(a.embeddings[0], embed_reference.vectors[3], "name:latest")
    legacy = olm.embeddings(model=latest, prompt=embed_reference.corpus[3])
    close_to(legacy.embedding, b.embeddings[0], "legacy name:latest", SAME)


# --------------------------------------------------------------------- LiteLLM


def test_litellm_embedding(server: Server, embed_model: str, embed_reference) -> None:
    # The bundled model-price map, not a download from GitHub at import.
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    ref = embed_reference
    texts = ref.corpus[:6]
    r = litellm.embedding(
        model=f"openai/{embed_model}",
        input=texts,
        api_base=server.url + "/v1",
        api_key="x",
        timeout=120,
        max_retries=0,
    )
    assert len(r.data) == len(texts)
    for i, item in enumerate(r.data):
        v = item["embedding"] if isinstance(item, dict) else item.embedding
        unit(v)
        close_to(v, ref.vectors[i], f"litellm entry {i}")
    assert r.usage.prompt_tokens == sum(ref.counts[:6])
