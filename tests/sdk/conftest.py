"""Fixtures for the SDK conformance suite: one `shoal serve` for the whole session."""

from __future__ import annotations

import os
from typing import Iterator

import anthropic
import openai
import pytest

from support import SHOAL_BIN, Server, anthropic_client, openai_client, start_server, stop_server


def pytest_configure(config: pytest.Config) -> None:
    if not SHOAL_BIN.is_file() or not os.access(SHOAL_BIN, os.X_OK):
        raise pytest.UsageError(
            f"shoal binary not found or not executable: {SHOAL_BIN} "
            "(build it with `cargo build --release -p shoal`, or point SHOAL_BIN at it)"
        )


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    # The conformance suite compares usage across repeated identical requests,
    # so it runs without the prefix cache; test_prefix_cache.py covers it.
    srv = start_server("--prefix-cache-mb", "0")
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
