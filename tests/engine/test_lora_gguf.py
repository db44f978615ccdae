"""GGUF LoRA adapters as llama.cpp's convert_lora_to_gguf.py writes them from PEFT folders (what `llama-server --lora`
takes), over tiny random Llama and Qwen3 models: an f32 file gives the greedy tokens and logprobs of the PEFT folder it
was made from, on the Hugging Face folder and on the base model converted to an f32 GGUF file alike (Llama's files
permute the rows of the q and k updates' B as they do the base model's q and k rows: rsgl reads them back in order);
those equal transformers + peft's tokens. A Q8_0 file (A in Q8_0, B in F16) gives the tokens and logprobs of a PEFT
folder holding its values as gguf-py dequantizes them. A file that is not a LoRA adapter, or was made for another
architecture, is refused naming it; an adapter file given as the model too. Over tiny random Phi-3 and GLM-4 models, the
converter's attn_qkv and fused ffn_up updates give the tokens and logprobs of the qkv_proj and gate_up_proj updates of
the PEFT folders they were made from.

llama.cpp scales an adapter by `adapter.lora.alpha / r`, whatever PEFT's config said of rsLoRA (the converter keeps
alpha only): the adapters here leave rsLoRA off."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import rsgl
from gguf_convert import convert, convert_lora
from lora_adapters import ALL_PROJECTIONS, greedy, save_adapter, with_adapter
from tiny_models import TINY, build_tiny
from zoo_models import build_family, zoo_tokenizer

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}
# Adapter a: every projection at rank 8; adapter b: q, k and v at rank 4 (alpha / r = 1.5).
ADAPTERS = {"a": dict(r=8, lora_alpha=16, target_modules=ALL_PROJECTIONS), "b": dict(r=4, lora_alpha=6, target_modules=["q_proj", "k_proj", "v_proj"])}
PROMPTS = [np.random.default_rng(seed).integers(3, 256, size=length).tolist() for seed, length in [(0, 9), (1, 20), (2, 4)]]


def build_base(architecture: str, path: Path):
    """tiny_models' random model with a tokenizer llama.cpp's converter takes (zoo_models.zoo_tokenizer)."""
    tokenizer = zoo_tokenizer()
    model = build_tiny(architecture, path, vocab_size=tokenizer.get_vocab_size())
    tokenizer.save(str(path / "tokenizer.json"))
    (path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"}))
    return model


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def converted(request, tmp_path_factory):
    """(architecture, base folder, base f32 GGUF file, {name: PEFT folder}, {name: f32 GGUF file}, {None: transformers
    model, name: with that adapter})."""
    root = tmp_path_factory.mktemp(f"lora-gguf-{request.param}")
    base = build_base(request.param, root / "base")
    folders, models = {}, {None: base}
    for seed, (name, config) in enumerate(ADAPTERS.items()):
        save_adapter(base, root / name, seed, **config)
        folders[name], models[name] = root / name, with_adapter(base, root / name)
    # Each conversion spends most of its time starting Python and torch: they run side by side.
    with ThreadPoolExecutor() as pool:
        base_file = pool.submit(convert, root / "base", root / "base.gguf")
        files = {name: pool.submit(convert_lora, folder, root / "base", root / f"{name}.gguf") for name, folder in folders.items()}
        return request.param, root / "base", base_file.result(), folders, {name: file.result() for name, file in files.items()}, models


def run(base: Path, lora_paths: dict[str, Path]) -> dict[str | None, list[tuple[list[int], list[float]]]]:
    """The greedy tokens and their logprobs of each prompt under the base model and each adapter, all in one batch."""
    names = [None, *lora_paths]
    cases = [(ids, name) for name in names for ids in PROMPTS]
    options = dict(dtype="float32", threads=2, max_total_tokens=2048, progress=False)
    with rsgl.Engine(str(base), lora_paths={name: str(path) for name, path in lora_paths.items()}, **options) as engine:
        outs = engine.generate(input_ids=[ids for ids, _ in cases], sampling_params=GREEDY, lora_path=[name for _, name in cases], return_logprob=True)
    results: dict[str | None, list[tuple[list[int], list[float]]]] = {name: [] for name in names}
    for (_, name), out in zip(cases, outs):
        results[name].append((out["output_ids"], [logprob for logprob, _, _ in out["meta_info"]["output_token_logprobs"]]))
    return results


@pytest.mark.parametrize("base_format", ["folder", "gguf"])
def test_gguf_adapters_give_the_peft_folders_tokens_and_logprobs(converted, base_format):
    _, folder, base_file, folders, files, models = converted
    base = folder if base_format == "folder" else base_file
    results = run(base, {**folders, **{f"{name}-gguf": file for name, file in files.items()}})
    for name in ADAPTERS:
        assert results[f"{name}-gguf"] == results[name], name
        assert [tokens for tokens, _ in results[name]] == [greedy(models[name], ids, GREEDY["max_new_tokens"]) for ids in PROMPTS], name
    # The adapters change what the model says (else this test could not fail).
    assert len({tuple(tuple(tokens) for tokens, _ in results[name]) for name in [None, *ADAPTERS]}) == 3


# Checkpoints that fuse projections, whose updates the converter writes as attn_qkv (Phi-3's qkv_proj) and ffn_up
# (Phi-3's and GLM-4's gate_up_proj).
FUSED = {"phi3": ["qkv_proj", "o_proj", "gate_up_proj", "down_proj"], "glm4": ["q_proj", "v_proj", "gate_up_proj", "down_proj"]}


@pytest.mark.parametrize("family", list(FUSED))
def test_gguf_adapters_of_fused_projections_give_the_peft_folders_tokens_and_logprobs(family, tmp_path):
    base = build_family(family, tmp_path / family)
    save_adapter(base, tmp_path / "a", 0, r=8, lora_alpha=16, target_modules=FUSED[family])
    file = convert_lora(tmp_path / "a", tmp_path / family, tmp_path / "a.gguf")
    results = run(tmp_path / family, {"a": tmp_path / "a", "a-gguf": file})
    assert results["a-gguf"] == results["a"]
    assert [tokens for tokens, _ in results["a"]] == [greedy(with_adapter(base, tmp_path / "a"), ids, GREEDY["max_new_tokens"]) for ids in PROMPTS]
    assert results["a"] != results[None]


def dequantized_folder(file: Path, peft_folder: Path, out: Path, architecture: str) -> Path:
    """A copy of `peft_folder` holding the values of its GGUF file `file` as gguf-py dequantizes them, the rows of Llama's
    q/k updates' B put back in order (convert_hf_to_gguf.py's LlamaModel.permute undone)."""
    import gguf
    from gguf.quants import dequantize
    from safetensors.numpy import save_file

    layer_modules = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
                     "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}  # fmt: skip
    heads = {"attn_q": TINY["num_attention_heads"], "attn_k": TINY["num_key_value_heads"]}
    tensors = {}
    for tensor in gguf.GGUFReader(file).tensors:
        module, matrix = tensor.name.split(".weight.lora_")
        layer, base = module.removeprefix("blk.").split(".")
        values = dequantize(tensor.data, tensor.tensor_type).astype(np.float32).reshape([int(d) for d in reversed(tensor.shape)])
        if architecture == "llama" and matrix == "b" and base in heads:
            n = heads[base]
            values = values.reshape(n, values.shape[0] // n // 2, 2, -1).swapaxes(1, 2).reshape(values.shape)
        tensors[f"base_model.model.model.layers.{layer}.{layer_modules[base]}.lora_{matrix.upper()}.weight"] = values
    out.mkdir()
    (out / "adapter_config.json").write_text((peft_folder / "adapter_config.json").read_text())
    save_file(tensors, out / "adapter_model.safetensors", metadata={"format": "pt"})
    return out


def test_a_q8_0_file_gives_the_tokens_and_logprobs_of_its_dequantized_values(converted, tmp_path):
    import gguf

    architecture, folder, _, folders, files, _ = converted
    q8_0 = convert_lora(folders["a"], folder, tmp_path / "a-q8_0.gguf", outtype="q8_0")
    kinds = {tensor.name.rsplit(".", 1)[-1]: tensor.tensor_type.name for tensor in gguf.GGUFReader(q8_0).tensors}
    assert kinds == {"lora_a": "Q8_0", "lora_b": "F16"}  # B's rows (rank 8) are shorter than a Q8_0 block
    values = dequantized_folder(q8_0, folders["a"], tmp_path / "a-q8_0-values", architecture)
    results = run(folder, {"q8_0": q8_0, "values": values, "f32": files["a"]})
    assert results["q8_0"] == results["values"]
    assert results["q8_0"] != results["f32"]  # the rounding shows in the logprobs


def test_a_gguf_file_that_is_not_a_lora_adapter_is_refused(converted):
    _, folder, base_file, _, files, _ = converted
    with pytest.raises(rsgl.ModelLoadError, match=rf'LoRA adapter "base": {re.escape(str(base_file))} is not a LoRA adapter but a "model" file'):
        rsgl.Engine(str(folder), progress=False, lora_paths={"base": str(base_file)})
    # Nor is an adapter taken for a model.
    with pytest.raises(rsgl.ModelLoadError, match=rf"{re.escape(str(files['a']))} is an adapter .*, not a model"):
        rsgl.Engine(str(files["a"]), progress=False)


def test_an_adapter_for_another_architecture_is_refused(converted, tmp_path):
    architecture, folder, _, _, _, _ = converted
    other = "qwen2" if architecture == "llama" else "llama"
    other_base = build_tiny(other, tmp_path / other)
    save_adapter(other_base, tmp_path / "adapter", 0, **ADAPTERS["b"])
    file = convert_lora(tmp_path / "adapter", tmp_path / other, tmp_path / f"{other}-adapter.gguf")
    refusal = rf'LoRA adapter "other": {re.escape(str(file))} was made for a "{other}" model, but the base model is a {architecture}'
    with pytest.raises(rsgl.ModelLoadError, match=refusal):
        rsgl.Engine(str(folder), progress=False, lora_paths={"other": str(file)})
