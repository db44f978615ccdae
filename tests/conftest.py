"""Shared fixtures: tiny random Hugging Face models saved by transformers (built offline from a
config), dense and mixture-of-experts; a server per test module that asks for one, with its
clients; and the rule that tests leave one core to whatever else runs.

The tiers (tests/unit, tests/engine, tests/server, tests/external) share the helper modules beside
this file. torch is imported only by the tests that build models or compare with transformers, so
`pytest tests/unit` runs on the core install."""

from __future__ import annotations

import sys
import time

import httpx
import openai
import pytest
from server_helpers import AUTH, openai_client, running_server


def pytest_collection_finish(session: pytest.Session) -> None:
    # Test modules that compare with transformers imported torch while being collected.
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory):
    """{arch: (path, transformers model)} for the dense Llama-family variants and the MoE ones."""
    from tiny_models import DENSE_ARCHS, MOE_ARCHS, build_tiny

    out = {}
    for arch in DENSE_ARCHS + MOE_ARCHS:
        path = tmp_path_factory.mktemp(f"tiny-{arch}")
        out[arch] = (str(path), build_tiny(arch, path))
    return out


@pytest.fixture(scope="session")
def smolvlm_folder(tmp_path_factory):
    """A tiny random SmolVLM folder with its tokenizer and processor (tests/vision_models.py)."""
    from vision_models import build_tiny_smolvlm

    folder = tmp_path_factory.mktemp("smolvlm")
    build_tiny_smolvlm(folder)
    return folder


# ---- a server per test module (python -m rsgl.server on loopback), and its clients ----------------


@pytest.fixture(scope="module")
def server_started_at() -> float:
    """time.time() just before the module's server is launched (server_url depends on it)."""
    return time.time()


@pytest.fixture(scope="module")
def server_url(tmp_path_factory: pytest.TempPathFactory, server_started_at: float):
    with running_server(tmp_path_factory.mktemp("server")) as (url, _):
        yield url


@pytest.fixture(scope="module")
def http(server_url: str):
    with httpx.Client(base_url=server_url, headers=AUTH, timeout=120) as client:
        yield client


@pytest.fixture(scope="module")
def client(server_url: str) -> openai.OpenAI:
    return openai_client(server_url)


@pytest.fixture(scope="module")
def model(http: httpx.Client) -> str:
    """The served model's name."""
    return http.get("/v1/models").json()["data"][0]["id"]
