"""Fixtures for the SDK conformance suite: one `shoal serve` for the whole session."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass
from typing import Any, Iterator

import anthropic
import numpy as np
import openai
import pytest

from support import (
    EMBED_CORPUS,
    EMBED_GGUF,
    EMBED_HF_DIR,
    REPO,
    SHOAL_BIN,
    Server,
    anthropic_client,
    http_json,
    openai_client,
    start_server,
    stop_server,
)


def pytest_configure(config: pytest.Config) -> None:
    if not SHOAL_BIN.is_file() or not os.access(SHOAL_BIN, os.X_OK):
        raise pytest.UsageError(
            f"shoal binary not found or not executable: {SHOAL_BIN} "
            "(build it with `cargo build --release -p shoal`, or point SHOAL_BIN at it)"
        )
    if not EMBED_GGUF.is_file():
        raise pytest.UsageError(
            f"embedding model not found: {EMBED_GGUF} "
            "(make it with `bash tools/fetch-embedding-model.sh`, or point SHOAL_TEST_EMBED_GGUF at it)"
        )


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    # The conformance suite compares usage across repeated identical requests,
    # so it runs without the prefix cache; test_prefix_cache.py covers it.
    # The embedding model is served beside the default one (test_embeddings.py).
    srv = start_server("--prefix-cache-mb", "0", "--embedding-model", str(EMBED_GGUF))
    try:
        yield srv
    finally:
        stop_server(srv)


@pytest.fixture(scope="session")
def model(server: Server) -> str:
    return server.model


@pytest.fixture(scope="session")
def oai(server: Server) -> openai.OpenAI:
    return openai_client(server)


@pytest.fixture(scope="session")
def claude(server: Server) -> anthropic.Anthropic:
    return anthropic_client(server)


@pytest.fixture(scope="session")
def embed_model(server: Server) -> str:
    """The id of the embedding model: the /v1/models entry of that kind."""
    status, _, body = http_json(server, "GET", "/v1/models")
    assert status == 200, body
    found = [m["id"] for m in body["data"] if m["shoal"].get("kind") == "embedding"]
    assert len(found) == 1, f"expected one embedding model in /v1/models, found {found}"
    return found[0]


@dataclass
class EmbedReference:
    """The numpy reference (tools/py/bert_reference.py) on the embedding corpus."""

    model: Any  # bert_reference.Reference, for inputs beyond the corpus
    corpus: list[str]
    ids: list[list[int]]  # token ids from the `tokenizers` package, [CLS] ... [SEP]
    counts: list[int]
    vectors: np.ndarray  # (len(corpus), dimensions), each input run alone

    def vectors_of(self, id_lists: list[list[int]]) -> np.ndarray:
        return self.model.embed(id_lists)


@pytest.fixture(scope="session")
def embed_reference() -> EmbedReference:
    if not (EMBED_HF_DIR / "model.safetensors").is_file():
        pytest.fail(f"no HF directory at {EMBED_HF_DIR} (run `bash tools/fetch-embedding-model.sh`)")
    sys.path.insert(0, str(REPO / "tools" / "py"))
    try:
        import bert_reference
    finally:
        sys.path.pop(0)
    corpus = json.loads(EMBED_CORPUS.read_text())
    ref = bert_reference.Reference(EMBED_HF_DIR)
    ids = ref.tokenize(corpus)
    return EmbedReference(ref, corpus, ids, [len(x) for x in ids], ref.embed(ids))
