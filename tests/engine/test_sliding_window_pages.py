"""Sliding-window layers keep only their window's KV (tests/zoo_models.py's tiny Gemma 3: five of six
layers slide over 8 tokens). With pages of 4 tokens a request holds at most 3 window pages between
steps (the 8 keys its next token reads, over at most 3 pages), however long its prompt, while its
greedy tokens stay transformers'; a later request sharing the prompt finds it in the radix cache;
the disk tier, speculative decoding, tensor parallelism and a window pool too small to cache much
keep the tokens right; and after a drain both pools are whole again."""

from __future__ import annotations

import threading

import pytest
import rsgl
import torch
from zoo_models import build_family

PAGE = 4
WINDOW = 8
# window / page + 1: the pages one request holds between steps (rsgl's window_pages_per_request).
PER_REQUEST = WINDOW // PAGE + 1
NEW_TOKENS = 12
LONG = [1, *range(3, 120)]  # 118 tokens: 15 windows
# Shares LONG's first 100 tokens (25 pages), then goes its own way.
FOLLOW_UP = [*LONG[:100], *range(150, 160)]
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    path = tmp_path_factory.mktemp("gemma3")
    return path, build_family("gemma3", path)


def transformers_greedy(model, ids: list[int]) -> list[int]:
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(ids) :].tolist()


def engine(path, **options) -> rsgl.Engine:
    options = {"threads": 1, "page_size": PAGE, "chunked_prefill_size": 16, "progress": False, "dtype": "float32", **options}
    return rsgl.Engine(str(path), **options)


def window_pages_in_use(info: dict) -> int:
    """Window pages neither free nor kept by the prefix cache for later requests (evictable)."""
    return info["kv_window_pages_total"] - info["kv_window_pages_free"] - info["window_cached_pages"]


def generate_watching_window_pages(llm: rsgl.Engine, ids: list[int]) -> tuple[list[int], int]:
    """The request's tokens, and the most window pages in use seen while it ran (read after every step)."""
    peak, done = 0, threading.Event()

    def watch():
        nonlocal peak
        while not done.is_set():
            peak = max(peak, window_pages_in_use(llm.get_server_info()))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        tokens = llm.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"]
    finally:
        done.set()
        watcher.join()
    return tokens, peak


def assert_drained(llm: rsgl.Engine) -> None:
    """Nothing in use: what is not free is the cache's, and a flush frees it."""
    info = llm.get_server_info()
    assert info["kv_pages_free"] + info["cached_pages"] == info["kv_pages_total"]
    assert window_pages_in_use(info) == 0
    assert llm.flush_cache()
    info = llm.get_server_info()
    assert (info["kv_pages_free"], info["kv_window_pages_free"]) == (info["kv_pages_total"], info["kv_window_pages_total"])


@pytest.mark.parametrize("radix_cache", [True, False])
def test_a_long_prompt_holds_only_its_window_pages(gemma3, radix_cache):
    path, model = gemma3
    with engine(path, disable_radix_cache=not radix_cache) as llm:
        info = llm.get_server_info()
        assert info["sliding_window"] == WINDOW and info["kv_window_pages_total"] >= PER_REQUEST
        tokens, peak = generate_watching_window_pages(llm, LONG)
        assert tokens == transformers_greedy(model, LONG)
        # Without releasing pages behind the window the prompt alone would hold 30.
        assert 0 < peak <= PER_REQUEST, f"{peak} window pages in use for one request"
        assert_drained(llm)


def test_a_follow_up_sharing_the_long_prefix_hits_the_radix_cache(gemma3):
    path, model = gemma3
    with engine(path) as llm:
        assert llm.generate(input_ids=LONG, sampling_params=GREEDY)["output_ids"] == transformers_greedy(model, LONG)
        hits = llm.get_server_info()["cache_hit_tokens"]
        tokens, peak = generate_watching_window_pages(llm, FOLLOW_UP)
        assert llm.get_server_info()["cache_hit_tokens"] - hits == 100  # the shared 25 pages, windows and all
        assert tokens == transformers_greedy(model, FOLLOW_UP)
        assert peak <= PER_REQUEST
        # Batched with both prompts cached (each request's window pages evictable once it left).
        batch = [out["output_ids"] for out in llm.generate(input_ids=[LONG, FOLLOW_UP], sampling_params=GREEDY)]
        assert batch == [transformers_greedy(model, LONG), transformers_greedy(model, FOLLOW_UP)]
        assert_drained(llm)


def test_a_window_pool_too_small_to_cache_much_stays_correct(gemma3):
    """Ten window pages: admitting more than three requests waits, and the cache's window pages are
    evicted (matches stop where a window is missing), yet every request's tokens stay transformers'."""
    path, model = gemma3
    prompts = [LONG, FOLLOW_UP, LONG[:60], [*LONG[:40], *range(200, 230)], LONG]
    want = [transformers_greedy(model, ids) for ids in prompts]
    with engine(path, max_total_tokens=1024, swa_full_tokens_ratio=0.04) as llm:
        assert llm.get_server_info()["kv_window_pages_total"] == 10
        assert [out["output_ids"] for out in llm.generate(input_ids=prompts, sampling_params=GREEDY)] == want
        assert [llm.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in prompts] == want
        assert llm.get_server_info()["cache_hit_tokens"] > 0
        assert_drained(llm)


def test_speculative_decoding_keeps_the_tokens(gemma3):
    path, model = gemma3
    repetitive = [1, *[3 + i % 9 for i in range(90)]]  # n-gram drafts find continuations here
    with engine(path, speculative_algorithm="ngram", speculative_num_draft_tokens=4) as llm:
        for ids in (repetitive, LONG):
            assert llm.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] == transformers_greedy(model, ids)
        assert_drained(llm)


def test_tensor_parallel_ranks_keep_their_heads_window_pages(gemma3):
    path, model = gemma3
    with engine(path, tp_size=2, threads=2) as llm:
        assert llm.generate(input_ids=LONG, sampling_params=GREEDY)["output_ids"] == transformers_greedy(model, LONG)
        assert_drained(llm)


def test_the_disk_tier_reads_window_pages_back(gemma3, tmp_path):
    path, model = gemma3
    with engine(path, hicache_dir=tmp_path) as llm:
        assert llm.generate(input_ids=LONG, sampling_params=GREEDY)["output_ids"] == transformers_greedy(model, LONG)
    with engine(path, hicache_dir=tmp_path) as llm:
        assert llm.generate(input_ids=FOLLOW_UP, sampling_params=GREEDY)["output_ids"] == transformers_greedy(model, FOLLOW_UP)
        assert llm.get_server_info()["hicache"]["hit_tokens"] == 100
        assert_drained(llm)


def test_models_without_sliding_layers_keep_one_pool(tiny_models):
    with rsgl.Engine(tiny_models["llama"][0], threads=1, progress=False) as llm:
        info = llm.get_server_info()
        assert (info["sliding_window"], info["kv_window_pages_total"], info["window_cached_pages"]) == (0, 0, 0)
