"""Embeddings (--is-embedding) through the `openai` client against transformers' numbers: a tiny
random Llama (one token per byte) whose `LlamaModel` final hidden states, pooled by the last token
or by their mean (sentence-transformers' config) and L2-normalized, are what rsgl must return,
with prompts longer than the prefill chunk; base64, SGLang's /encode and Engine.encode, the
errors, and the KV pool empty after."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest
import rsgl
import torch
from core_keys import declared, known_keys
from rsgl import _core, core_types
from server_helpers import AUTH, assert_openai_error, drained, openai_client, running_server
from tiny_models import TINY, build_byte_llama

SERVED_NAME = "tiny-embed"
CHUNK = 16  # --chunked-prefill-size: the long prompts below take several chunks
TEXTS = ["Hello world", "A", "Embeddings pool the final hidden states of every token of the prompt, chunk after chunk."]
MIN_COSINE = 0.9999
MAX_ABS_DIFF = 1e-4  # float32 on both sides


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory):
    """(folder, transformers model, tokenizer) of a tiny Llama with a byte tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-embed")
    return folder, *build_byte_llama(folder)


@pytest.fixture(scope="module")
def mean_folder(tiny, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same model declared mean-pooled by sentence-transformers' files."""
    source, _, _ = tiny
    folder = tmp_path_factory.mktemp("tiny-embed-mean")
    for file in source.iterdir():
        os.symlink(file, folder / file.name)
    modules = [{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
               {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]  # fmt: skip
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "1_Pooling").mkdir()
    pooling = {"word_embedding_dimension": TINY["hidden_size"], "pooling_mode_mean_tokens": True, "pooling_mode_cls_token": False}
    (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling))
    return folder


def embedding_server(folder: Path, log_dir: Path, *extra: str):
    options = ("--model-path", str(folder), "--served-model-name", SERVED_NAME, "--threads", "1", "--chunked-prefill-size", str(CHUNK))
    return running_server(log_dir, *options, *extra)


@pytest.fixture(scope="module")
def last_url(tiny, tmp_path_factory: pytest.TempPathFactory):
    with embedding_server(tiny[0], tmp_path_factory.mktemp("last-server"), "--is-embedding") as (url, _):
        yield url


@pytest.fixture(scope="module")
def mean_url(mean_folder: Path, tmp_path_factory: pytest.TempPathFactory):
    with embedding_server(mean_folder, tmp_path_factory.mktemp("mean-server"), "--is-embedding") as (url, _):
        yield url


@pytest.fixture(scope="module")
def http(last_url: str):
    with httpx.Client(base_url=last_url, headers=AUTH, timeout=120) as client:
        yield client


def reference(model, ids: list[int], pooling: str) -> np.ndarray:
    """transformers' LlamaModel final (normed) hidden states, pooled and L2-normalized."""
    with torch.no_grad():
        states = model.model(torch.tensor([ids])).last_hidden_state[0].double()
    pooled = states[-1] if pooling == "last" else states.mean(dim=0)
    return (pooled / pooled.norm()).numpy()


def assert_close(got: list[float], want: np.ndarray) -> None:
    vector = np.asarray(got, dtype=np.float64)
    assert vector.shape == want.shape
    assert abs(np.linalg.norm(vector) - 1) < 1e-5
    assert float(vector @ want) > MIN_COSINE and np.abs(vector - want).max() < MAX_ABS_DIFF


def test_last_token_embeddings_match_transformers(tiny, last_url: str):
    _, model, tokenizer = tiny
    response = openai_client(last_url).embeddings.create(model=SERVED_NAME, input=TEXTS)
    ids = [tokenizer.encode(text).ids for text in TEXTS]
    assert max(map(len, ids)) > 4 * CHUNK
    assert [d.index for d in response.data] == list(range(len(TEXTS))) and response.model == SERVED_NAME
    for data, prompt in zip(response.data, ids):
        assert data.object == "embedding"
        assert_close(data.embedding, reference(model, prompt, "last"))
    assert response.usage.prompt_tokens == response.usage.total_tokens == sum(map(len, ids))


def test_mean_pooling_accumulates_across_prefill_chunks(tiny, mean_url: str):
    _, model, tokenizer = tiny
    long_ids = tokenizer.encode(TEXTS[2] * 2).ids
    inputs = [long_ids, tokenizer.encode(TEXTS[0]).ids, long_ids[: CHUNK + 1]]
    response = openai_client(mean_url).embeddings.create(model="default", input=inputs)
    for data, prompt in zip(response.data, inputs):
        assert_close(data.embedding, reference(model, prompt, "mean"))
    # Same rows, other pooling: the folder's sentence-transformers config was read.
    last = reference(model, inputs[0], "last")
    assert float(np.asarray(response.data[0].embedding) @ last) < MIN_COSINE


def test_inputs_as_a_string_and_as_token_ids(tiny, last_url: str):
    _, model, tokenizer = tiny
    client = openai_client(last_url)
    ids = tokenizer.encode(TEXTS[0]).ids
    [one] = client.embeddings.create(model=SERVED_NAME, input=TEXTS[0]).data
    [from_ids] = client.embeddings.create(model=SERVED_NAME, input=ids).data
    assert_close(one.embedding, reference(model, ids, "last"))
    assert np.allclose(one.embedding, from_ids.embedding, atol=1e-6)


def test_base64_is_little_endian_float32(http: httpx.Client):
    floats = http.post("/v1/embeddings", json={"input": TEXTS[:2], "model": SERVED_NAME}).json()["data"]
    encoded = http.post("/v1/embeddings", json={"input": TEXTS[:2], "model": SERVED_NAME, "encoding_format": "base64"}).json()["data"]
    for as_float, as_base64 in zip(floats, encoded):
        decoded = np.frombuffer(base64.b64decode(as_base64["embedding"]), dtype="<f4")
        assert np.array_equal(decoded, np.asarray(as_float["embedding"], dtype=np.float32))


def test_native_encode_endpoint(tiny, http: httpx.Client):
    _, model, tokenizer = tiny
    result = http.post("/encode", json={"text": TEXTS[0]}).json()
    assert_close(result["embedding"], reference(model, tokenizer.encode(TEXTS[0]).ids, "last"))
    assert result["meta_info"]["prompt_tokens"] == len(tokenizer.encode(TEXTS[0]).ids)
    assert len(http.post("/encode", json={"input_ids": [[1, 5], [1, 6, 7]]}).json()) == 2


def test_refusals(http: httpx.Client):
    hidden = TINY["hidden_size"]
    assert http.post("/v1/embeddings", json={"input": "a", "dimensions": hidden}).status_code == 200
    too_long = [5] * (TINY["max_position_embeddings"] + 1)
    empty = [{"input": ""}, {"input": []}, {"input": [[]]}]
    malformed = [{"input": [1, 999]}, {"input": {"a": 1}}, {"input": "a", "dimensions": hidden // 2}, {"input": "a", "encoding_format": "int8"}]
    for body in empty + malformed:
        assert_openai_error(http.post("/v1/embeddings", json=body), 400)
    assert "context length" in assert_openai_error(http.post("/v1/embeddings", json={"input": too_long}), 400)
    assert_openai_error(http.post("/v1/embeddings", json={"input": "a", "model": "other"}), 404)
    generate = http.post("/v1/completions", json={"prompt": "a", "max_tokens": 2})
    assert "embeddings" in assert_openai_error(generate, 400)


def test_kv_pool_is_empty_after_embeddings(last_url: str, mean_url: str):
    for url in (last_url, mean_url):
        info = drained(url)
        assert info["kv_pages_free"] == info["kv_pages_total"] and info["cached_pages"] == 0 and info["kv_pages_used"] == 0


def test_a_generation_server_refuses_embeddings(tiny, tmp_path_factory: pytest.TempPathFactory):
    with embedding_server(tiny[0], tmp_path_factory.mktemp("generation-server")) as (url, _):
        response = httpx.post(f"{url}/v1/embeddings", headers=AUTH, json={"input": "a"})
        assert "--is-embedding" in assert_openai_error(response, 400)


def test_engine_encode_as_sglang(tiny):
    folder, model, tokenizer = tiny
    with rsgl.Engine(str(folder), is_embedding=True, threads=1, progress=False, chunked_prefill_size=CHUNK) as llm:
        one = llm.encode(TEXTS[2])
        assert isinstance(one, dict) and one["meta_info"]["prompt_tokens"] == len(tokenizer.encode(TEXTS[2]).ids)
        assert_close(one["embedding"], reference(model, tokenizer.encode(TEXTS[2]).ids, "last"))
        batch = llm.encode([[1, 5, 6], TEXTS[0]])
        assert isinstance(batch, list) and len(batch) == 2
        assert_close(batch[0]["embedding"], reference(model, [1, 5, 6], "last"))
        with pytest.raises(rsgl.InvalidRequestError, match="embeddings"):
            llm.generate("a", {"max_new_tokens": 1})
    with rsgl.Engine(str(folder), threads=1, progress=False) as generator, pytest.raises(rsgl.InvalidRequestError, match="is_embedding"):
        generator.encode("a")


def test_embed_request_and_output_keys_are_the_engines(tiny):
    with rsgl.Engine(str(tiny[0]), is_embedding=True, threads=1, progress=False) as llm:
        with pytest.raises(rsgl.InvalidRequestError) as refused:
            llm._core.embed({"rid": "r", "input_ids": [1], "no_such_key": 1})
        assert known_keys(refused.value) == declared(core_types.EmbedRequest)
        stream = llm._core.embed({"rid": "keys", "input_ids": [1, 2, 3]})
        out = stream.next(10.0)
        assert out is not None and stream.done
        assert set(out) == declared(core_types.Output) - {"logprobs", "prompt_logits", "input_token_logprobs"}


def test_a_base_model_checkpoint_embeds(tiny, tmp_path: Path):
    """A `LlamaModel` checkpoint (as sentence-transformers saves embedding models: no lm_head, no
    `model.` prefix) serves as its causal LM's architecture."""
    folder, model, _ = tiny
    model.model.save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["architectures"] == ["LlamaModel"]
    with rsgl.Engine(str(tmp_path), is_embedding=True, threads=1, progress=False, skip_tokenizer_init=True) as llm:
        result = llm.encode([1, 7, 9, 11])
        assert isinstance(result, dict)
        assert_close(result["embedding"], reference(model, [1, 7, 9, 11], "last"))


@pytest.mark.parametrize(("pooling_type", "pooling"), [(1, "mean"), (2, "cls"), (3, "last"), (None, None)])
def test_gguf_pooling_type_is_read(tmp_path: Path, pooling_type: int | None, pooling: str | None):
    path = tmp_path / "embedder.gguf"
    writer = gguf.GGUFWriter(path, "qwen3")
    writer.add_block_count(1)
    writer.add_context_length(64)
    writer.add_embedding_length(8)
    writer.add_feed_forward_length(16)
    writer.add_head_count(2)
    writer.add_head_count_kv(1)
    writer.add_layer_norm_rms_eps(1e-6)
    if pooling_type is not None:
        writer.add_pooling_type(gguf.PoolingType(pooling_type))
    writer.add_tensor("token_embd.weight", np.zeros((10, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert _core.ModelConfig.from_gguf(path).fields["pooling"] == pooling
