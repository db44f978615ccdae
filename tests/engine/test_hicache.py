"""The prefix cache's disk tier (`hicache_dir`) on a tiny model: pages evicted from memory come back
from disk, a restarted engine finds them, and a file of other settings, or a corrupt one, is never
read into a request (outputs stay those of an engine without the tier)."""

from __future__ import annotations

from pathlib import Path

import pytest
import rsgl

GREEDY = {"temperature": 0, "max_new_tokens": 6}
# Eight prompts of 6 pages and a token (page size 16) that share nothing: 4x the 12-page KV pool.
PROMPTS = [[3 + (7 * i + 11 * j) % 90 for j in range(97)] for i in range(8)]
KV_TOKENS = 192
PAGES = 8 * 6
# A round of the prompts with none in memory: every page but the last token's (computed for its logits).
ROUND_HITS = 8 * 96


def engine(path: str, hicache_dir: Path | None, **options) -> rsgl.Engine:
    return rsgl.Engine(path, threads=1, max_total_tokens=KV_TOKENS, hicache_dir=hicache_dir, progress=False, **options)


def outputs(llm: rsgl.Engine, prompts=PROMPTS) -> list[list[int]]:
    return [llm.generate(input_ids=ids, sampling_params=GREEDY)["output_ids"] for ids in prompts]


def disk_stats(llm: rsgl.Engine) -> dict:
    hicache = llm.get_server_info()["hicache"]
    assert hicache is not None
    return hicache


@pytest.fixture(scope="module")
def tiny_llama(tiny_models) -> str:
    return tiny_models["llama"][0]


@pytest.fixture(scope="module")
def cold(tiny_llama) -> list[list[int]]:
    """Greedy outputs of an engine without the tier."""
    with engine(tiny_llama, None) as llm:
        assert llm.get_server_info()["hicache"] is None
        return outputs(llm)


def test_evicted_prefixes_come_back_from_disk_and_survive_a_restart(tiny_llama, cold, tmp_path):
    with engine(tiny_llama, tmp_path) as llm:
        assert outputs(llm) == cold
        assert llm.get_server_info()["cache_hit_tokens"] == 0
        assert outputs(llm) == cold, "the second round reads its prompts back"
        stats, info = disk_stats(llm), llm.get_server_info()
        assert stats["hit_tokens"] == info["cache_hit_tokens"] == ROUND_HITS
        assert stats["used_pages"] == PAGES and stats["read_pages"] == PAGES
        assert stats["read_bytes"] > 0 and stats["read_bytes"] % PAGES == 0
    with engine(tiny_llama, tmp_path) as llm:
        stats = disk_stats(llm)
        assert stats["recovered_pages"] == PAGES and stats["ignored_records"] == 0, stats["startup"]
        assert outputs(llm) == cold
        assert disk_stats(llm)["hit_tokens"] == ROUND_HITS, "a restarted engine answers from disk"
        assert llm.flush_cache()
        assert disk_stats(llm)["used_pages"] == 0
        assert outputs(llm, PROMPTS[:1]) == cold[:1]
        assert disk_stats(llm)["hit_tokens"] == ROUND_HITS, "nothing was left to read after the flush"


def test_other_settings_and_corrupt_records_are_never_read(tiny_llama, cold, tmp_path):
    with engine(tiny_llama, tmp_path) as llm:
        outputs(llm)
    [file] = tmp_path.glob("*.rsglkv")
    with engine(tiny_llama, tmp_path, kv_cache_dtype="bfloat16") as llm:
        stats = disk_stats(llm)
        assert stats["recovered_pages"] == 0 and "1 cache files of other models or settings left alone" in stats["startup"]
        outputs(llm)
        assert disk_stats(llm)["hit_tokens"] == 0
    # Slots follow a 4 KiB file header, one per page in the order written; a record's header
    # takes its slot's first 4 KiB. Flip a byte of every payload, and cut the last slot short.
    data = bytearray(file.read_bytes())
    slot = (len(data) - 4096) // PAGES
    for start in range(4096, len(data), slot):
        data[start + 4096 + 5] ^= 0x40
    file.write_bytes(bytes(data[: len(data) - slot // 2]))
    with engine(tiny_llama, tmp_path) as llm:
        stats = disk_stats(llm)
        assert stats["ignored_records"] == 1, stats["startup"]
        assert outputs(llm) == cold
        stats = disk_stats(llm)
        assert stats["rejected_pages"] > 0 and stats["hit_tokens"] == 0, "every corrupt page was recomputed"
        assert outputs(llm) == cold
        assert disk_stats(llm)["hit_tokens"] > 0, "recomputed pages were written again"


def test_bad_options_are_refused(tiny_llama, tmp_path):
    with pytest.raises(rsgl.InvalidRequestError, match="disable_radix_cache"):
        engine(tiny_llama, tmp_path, disable_radix_cache=True)
    with pytest.raises(rsgl.InvalidRequestError, match="too small for one page"):
        engine(tiny_llama, tmp_path, hicache_size_gb=1e-6)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(rsgl.InvalidRequestError, match="cannot use hicache_dir"):
        engine(tiny_llama, blocker)
