"""Models by Hugging Face Hub id: the real `huggingface_hub` library fetches them from a Hub on
loopback (tests/local_hub.py, through HF_ENDPOINT) into a real Hugging Face cache; then, with
HF_HUB_OFFLINE=1, `rsgl.Engine` and `python -m rsgl.server` serve them from that cache alone."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
import rsgl
from local_hub import LocalHub, serving
from rsgl.loader.hub import HubId, gguf_models, parse_hub_id, projector_of
from server_helpers import openai_client, running_server
from tiny_models import build_byte_llama

FOLDER_REPO = "test-org/tiny-llama"
GGUF_REPO = "test-org/tiny-llama-GGUF"
GREEDY = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}
PROMPT = "Hello, Hub"
PROMPT_IDS = [1, 40, 41, 42, 43, 44, 45]  # the GGUF files carry no tokenizer


def write_gguf(model, path: Path, split_max_tensors: int = 0) -> None:
    """`model` (a tiny transformers Llama) as llama.cpp writes a GGUF file of it, in float32; its
    q/k rows permuted as llama.cpp's converter does; cut into shards of `split_max_tensors`."""
    config = model.config
    writer = gguf.GGUFWriter(path, "llama", split_max_tensors=split_max_tensors)
    writer.add_name(path.stem)  # files of the same weights differ, as different quantizations' files do
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(10000.0)
    names = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output", "input_layernorm": "attn_norm",
             "q_proj": "attn_q", "k_proj": "attn_k", "v_proj": "attn_v", "o_proj": "attn_output",
             "post_attention_layernorm": "ffn_norm", "gate_proj": "ffn_gate", "up_proj": "ffn_up", "down_proj": "ffn_down"}  # fmt: skip
    heads = {"q_proj": config.num_attention_heads, "k_proj": config.num_key_value_heads}
    for name, tensor in model.state_dict().items():
        values = tensor.float().numpy()
        parts = name.removesuffix(".weight").split(".")
        if parts[-1] in heads:
            n = heads[parts[-1]]
            values = values.reshape(n, 2, values.shape[0] // n // 2, -1).swapaxes(1, 2).reshape(values.shape)
        layer = f"blk.{parts[2]}." if parts[:2] == ["model", "layers"] else ""
        writer.add_tensor(f"{layer}{names[parts[-1]]}.weight", np.ascontiguousarray(values))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


@pytest.fixture(scope="module")
def repos(tmp_path_factory):
    """{name: folder} of the repos the local Hub serves, and the transformers model behind each."""
    folder = tmp_path_factory.mktemp("tiny-llama")
    model, _ = build_byte_llama(folder)
    (folder / "README.md").write_text("not needed to serve")
    (folder / "original").mkdir()
    shutil.copy(folder / "model.safetensors", folder / "original" / "consolidated.safetensors")  # another copy: not fetched
    tagged = tmp_path_factory.mktemp("tiny-llama-v1")
    build_byte_llama(tagged, chat_template="v1: {{ messages[0]['content'] }}")
    ggufs = tmp_path_factory.mktemp("tiny-llama-gguf")
    for quantization in ("Q4_K_M", "Q8_0"):  # float32 inside: the names are what the choice reads
        write_gguf(model, ggufs / f"tiny-llama-{quantization}.gguf")
    write_gguf(model, ggufs / "tiny-llama-F16.gguf", split_max_tensors=11)
    write_gguf(model, ggufs / "mmproj-tiny-llama-f16.gguf")
    return {"folder": folder, "tagged": tagged, "ggufs": ggufs}


@pytest.fixture(scope="module")
def hub(repos):
    local = LocalHub()
    local.add(FOLDER_REPO, repos["folder"])
    local.add(FOLDER_REPO, repos["tagged"], revisions=("v1",))
    local.add(GGUF_REPO, repos["ggufs"])
    local.add("test-org/gated", repos["folder"])
    local.gated.add("test-org/gated")
    with serving(local) as url:
        local.url = url
        yield local


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, for this process (read when rsgl resolves) and its children."""
    folder = tmp_path / "hf-cache"
    monkeypatch.setenv("HF_HUB_CACHE", str(folder))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return folder


def rsgl_cli(*args: str, hub: LocalHub | None = None, offline: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_DISABLE_XET": "1", "HF_HUB_OFFLINE": "1" if offline else "0"}
    if hub is not None:
        env["HF_ENDPOINT"] = hub.url
    return subprocess.run([sys.executable, "-m", "rsgl.cli", *args], capture_output=True, text=True, env=env, timeout=300)


def pull(hub: LocalHub, model: str, *options: str) -> Path:
    result = rsgl_cli("pull", model, *options, hub=hub)
    assert result.returncode == 0, result.stderr
    return Path(result.stdout.strip().splitlines()[-1])


def greedy(model: str | Path, **options) -> list[int]:
    with rsgl.Engine(str(model), threads=1, progress=False, **options) as engine:
        return engine.generate(input_ids=PROMPT_IDS, sampling_params=GREEDY)["output_ids"]


def test_offline_with_nothing_cached_is_a_clear_error(cache, monkeypatch):
    result = rsgl_cli("pull", FOLDER_REPO, offline=True)
    assert result.returncode == 1 and "Traceback" not in result.stderr
    assert f"the Hugging Face cache ({cache}) holds no snapshot of {FOLDER_REPO}" in result.stderr
    assert "HF_HUB_OFFLINE is set" in result.stderr and f"rsgl pull {FOLDER_REPO}" in result.stderr
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(rsgl.ModelLoadError, match="holds no snapshot of test-org/tiny-llama"):
        rsgl.Engine(FOLDER_REPO, progress=False)


def test_a_folder_repo_is_fetched_once_then_served_offline(hub, repos, cache, monkeypatch, tmp_path):
    hub.downloads.clear()
    snapshot = pull(hub, FOLDER_REPO)
    assert snapshot.parent == cache / "models--test-org--tiny-llama" / "snapshots"
    # Only what rsgl reads: not the README, not the other copy of the weights.
    assert sorted(hub.downloads) == ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    assert pull(hub, FOLDER_REPO) == snapshot and len(hub.downloads) == 5  # cached: nothing fetched again
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert greedy(FOLDER_REPO) == greedy(repos["folder"])
    with rsgl.Engine(FOLDER_REPO, threads=1, progress=False) as engine:
        assert engine.served_model_name == FOLDER_REPO and engine.model.source == str(snapshot)
    listing = rsgl_cli("models", offline=True)
    assert listing.returncode == 0, listing.stderr
    assert FOLDER_REPO in listing.stdout and "safetensors" in listing.stdout and "main" in listing.stdout
    # The server, offline, by Hub id.
    with running_server(tmp_path, "--model-path", FOLDER_REPO, "--threads", "1", api_key=None) as (url, _):
        client = openai_client(url)
        assert [m.id for m in client.models.list().data] == [FOLDER_REPO]
        answer = client.completions.create(model=FOLDER_REPO, prompt=PROMPT, max_tokens=4, temperature=0)
        assert answer.choices[0].text


def test_a_revision_is_fetched_and_served_as_asked(hub, repos, cache, monkeypatch):
    main, tagged = pull(hub, FOLDER_REPO), pull(hub, FOLDER_REPO, "--revision", "v1")
    assert main != tagged and (tagged / "tokenizer_config.json").read_text() == (repos["tagged"] / "tokenizer_config.json").read_text()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with rsgl.Engine(FOLDER_REPO, revision="v1", threads=1, progress=False) as engine:
        assert engine.model.source == str(tagged) and engine.model.chat_template.startswith("v1:")
    with rsgl.Engine(FOLDER_REPO, revision=tagged.name[:12], threads=1, progress=False) as engine:  # a commit, abbreviated
        assert engine.model.source == str(tagged)
    with pytest.raises(rsgl.ModelLoadError, match="holds test-org/tiny-llama but not its revision 'v2'"):
        rsgl.Engine(FOLDER_REPO, revision="v2", progress=False)
    with pytest.raises(rsgl.InvalidRequestError, match="revision='v1' picks a version of a Hugging Face Hub repo"):
        rsgl.Engine(str(repos["folder"]), revision="v1", progress=False)
    gone = rsgl_cli("pull", FOLDER_REPO, "--revision", "v9", hub=hub)
    assert gone.returncode == 1 and "test-org/tiny-llama has no revision 'v9'" in gone.stderr


def test_a_gguf_repo_serves_the_quantization_asked_for(hub, repos, cache, monkeypatch):
    hub.downloads.clear()
    chosen = pull(hub, f"{GGUF_REPO}:q8_0")  # any case, as llama.cpp takes it
    # The repo's projector file comes with its model (once), as llama.cpp's -hf fetches it.
    assert chosen.name == "tiny-llama-Q8_0.gguf" and sorted(hub.downloads) == ["mmproj-tiny-llama-f16.gguf", "tiny-llama-Q8_0.gguf"]
    assert (chosen.parent / "mmproj-tiny-llama-f16.gguf").is_file()
    default = pull(hub, GGUF_REPO)
    assert default.name == "tiny-llama-Q4_K_M.gguf" and hub.downloads[2:] == ["tiny-llama-Q4_K_M.gguf"]
    shards = pull(hub, f"{GGUF_REPO}:F16")
    assert shards.name == "tiny-llama-F16-00001-of-00002.gguf"
    assert sorted(hub.downloads[3:]) == ["tiny-llama-F16-00001-of-00002.gguf", "tiny-llama-F16-00002-of-00002.gguf"]
    missing = rsgl_cli("pull", f"{GGUF_REPO}:Q5_K_M", hub=hub)
    assert missing.returncode == 1 and f"{GGUF_REPO} has no Q5_K_M GGUF file; it has: F16, Q4_K_M, Q8_0." in missing.stderr
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    whole = greedy(repos["ggufs"] / "tiny-llama-Q8_0.gguf")
    assert greedy(f"{GGUF_REPO}:Q8_0") == whole
    assert greedy(f"{GGUF_REPO}:f16") == whole  # two shards, one model
    with rsgl.Engine(f"{GGUF_REPO}:F16", threads=1, progress=False) as engine:
        assert engine.served_model_name == f"{GGUF_REPO}:F16"
    with pytest.raises(rsgl.ModelLoadError, match="has no IQ2_XS GGUF file; it has: F16, Q4_K_M, Q8_0"):
        rsgl.Engine(f"{GGUF_REPO}:IQ2_XS", progress=False)


def test_repos_the_hub_refuses_are_clear_errors(hub, cache):
    gated = rsgl_cli("pull", "test-org/gated", hub=hub)
    assert gated.returncode == 1 and "test-org/gated is a gated repo" in gated.stderr and "HF_TOKEN" in gated.stderr
    unknown = rsgl_cli("pull", "test-org/no-such-model", hub=hub)
    assert unknown.returncode == 1 and "test-org/no-such-model is neither a local path nor a model repo on the Hugging Face Hub" in unknown.stderr
    not_an_id = rsgl_cli("pull", "./local/folder")
    assert not_an_id.returncode == 2 and "is not a Hugging Face Hub id" in not_an_id.stderr


def test_hub_ids_and_gguf_quantization_names_are_read_as_llama_cpp_reads_them():
    assert parse_hub_id("Qwen/Qwen3-0.6B") == HubId("Qwen/Qwen3-0.6B", None)
    assert parse_hub_id("unsloth/gemma-3-1b-it-GGUF:q4_k_m") == HubId("unsloth/gemma-3-1b-it-GGUF", "q4_k_m")
    for not_an_id in ("./models/x", "~/x/y", "a/b/c", "model.gguf", "../x/y", "/abs/path"):
        assert parse_hub_id(not_an_id) is None, not_an_id
    files = [
        "Qwen3-8B-Q4_K_M.gguf",
        "Qwen3-8B.Q8_0.gguf",
        "Qwen3-8B-UD-Q4_K_XL.gguf",
        "Qwen3-8B-IQ4_XS.gguf",
        "BF16/Qwen3-8B-BF16-00002-of-00002.gguf",
        "BF16/Qwen3-8B-BF16-00001-of-00002.gguf",
        "mmproj-F16.gguf",
        "README.md",
    ]
    assert gguf_models(files) == {
        "BF16": ["BF16/Qwen3-8B-BF16-00001-of-00002.gguf", "BF16/Qwen3-8B-BF16-00002-of-00002.gguf"],
        "IQ4_XS": ["Qwen3-8B-IQ4_XS.gguf"],
        "Q4_K_M": ["Qwen3-8B-Q4_K_M.gguf"],
        "Q4_K_XL": ["Qwen3-8B-UD-Q4_K_XL.gguf"],
        "Q8_0": ["Qwen3-8B.Q8_0.gguf"],
    }
    assert projector_of(files) == "mmproj-F16.gguf"
    assert projector_of(["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf", "mmproj-m-bf16.gguf", "mmproj_m_f32.gguf"]) == "mmproj-m-bf16.gguf", "F16, BF16, F32, Q8_0"
    assert projector_of(["m-Q4_K_M.gguf", "mmproj-m-Q8_0.gguf"]) == "mmproj-m-Q8_0.gguf" and projector_of(["m-Q4_K_M.gguf"]) is None
