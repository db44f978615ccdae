"""Converting a Hugging Face checkpoint folder to GGUF with llama.cpp's own convert_hf_to_gguf.py, and a PEFT LoRA
adapter folder to a GGUF LoRA file with its convert_lora_to_gguf.py, which scripts/llama-cpp-converter.sh fetches once
(a pinned version) into a cache outside the clone.

`convert(folder, out)` runs the converter in a subprocess through this file, which first lets it take
the tests' byte-level tokenizers (zoo_models.zoo_tokenizer), which no released model has:
- llama.cpp recognizes a BPE pre-tokenizer by the hash of how a sample text tokenizes; an unknown one
  that splits text like GPT-2 (ByteLevel with its regex) is written as "gpt-2";
- the converters of Gemma 2 and Phi-3 read only SentencePiece tokenizer.model files, and GLM-4's looks up
  GLM's special tokens: without those, they store the byte-level BPE vocabulary, as Gemma 3's does.
Checkpoints the converter knows convert as with the plain converter.

`folder_with_projector_values(folder, projector, out, hf_tensor)` copies a vision-language folder with the values of a
projector file the converter wrote (`--mmproj`) in place of its vision tower's and projector's: the folder whose tokens
a GGUF model with that projector should give. `siglip_name` names a SigLIP tower's tensors (SmolVLM's, Gemma 3's) as
the folder does.
"""

from __future__ import annotations

import functools
import json
import os
import runpy
import subprocess
import sys
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

FETCH_SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "llama-cpp-converter.sh"


class ConversionError(RuntimeError):
    pass


@functools.cache
def converter() -> Path:
    """The path of convert_hf_to_gguf.py, fetched on first use."""
    done = subprocess.run(["bash", str(FETCH_SCRIPT)], capture_output=True, text=True, env={**os.environ, "PYTHON": sys.executable})
    if done.returncode != 0:
        raise ConversionError(f"{FETCH_SCRIPT.name} failed (exit {done.returncode}):\n{done.stderr}")
    return Path(done.stdout.split()[-1])


def convert(hf_folder, out_path, outtype: str = "f32", options: tuple[str, ...] = ()) -> Path:
    """Converts the checkpoint in `hf_folder` to the GGUF file `out_path` (f32, f16, bf16, q8_0...), with the
    converter's further `options`; returns its path."""
    return _run(converter(), hf_folder, out_path, outtype, options)


def convert_lora(peft_folder, base_folder, out_path, outtype: str = "f32") -> Path:
    """Converts the PEFT LoRA adapter in `peft_folder`, made for the checkpoint in `base_folder` (whose config the
    converter reads), to the GGUF LoRA file `out_path` (f32, f16, bf16, q8_0), as llama-server's --lora takes; returns
    its path."""
    return _run(converter().with_name("convert_lora_to_gguf.py"), peft_folder, out_path, outtype, ("--base", str(base_folder)))


def _run(script: Path, folder, out_path, outtype: str, options: tuple[str, ...]) -> Path:
    out_path = Path(out_path)
    command = [sys.executable, __file__, str(script), str(folder), "--outfile", str(out_path), "--outtype", outtype, *options]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0 or not out_path.is_file():
        log = done.stderr.strip().splitlines() or ["(no output)"]
        raise ConversionError(f"llama.cpp's {script.name} failed on {folder}: {log[-1]}\n" + "\n".join(log[-40:]))
    return out_path


# The converter's names of a SigLIP tower's tensors, and the Hugging Face checkpoint's past the tower's prefix.
SIGLIP_NAMES = {"v.patch_embd": "embeddings.patch_embedding", "v.position_embd": "embeddings.position_embedding", "v.post_ln": "post_layernorm"}
SIGLIP_LAYER_NAMES = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj", "attn_out": "self_attn.out_proj",
                      "ln1": "layer_norm1", "ln2": "layer_norm2", "ffn_up": "mlp.fc1", "ffn_down": "mlp.fc2"}  # fmt: skip


def siglip_name(gguf_name: str, tower: str) -> str | None:
    """The Hugging Face name of the projector file's SigLIP tower tensor `gguf_name` under the prefix `tower` (e.g.
    "model.vision_model."); None for a tensor outside the tower."""
    module, kind = gguf_name.rsplit(".", 1)
    if module.startswith("v.blk."):
        layer, base = module.removeprefix("v.blk.").split(".", 1)
        return f"{tower}encoder.layers.{layer}.{SIGLIP_LAYER_NAMES[base]}.{kind}"
    return f"{tower}{SIGLIP_NAMES[module]}.{kind}" if module in SIGLIP_NAMES else None


def folder_with_projector_values(folder: Path, projector: Path, out: Path, hf_tensor: Callable[[str, Any], tuple[str, Any]]) -> Path:
    """A copy of the Hugging Face `folder` (one model.safetensors) at `out` whose vision tower and projector hold
    `projector`'s values, dequantized by gguf-py to float32: `hf_tensor(gguf_name, values)` gives each tensor's name in
    the folder and its values as the folder stores them."""
    import shutil

    import gguf
    import numpy as np
    from gguf.quants import dequantize
    from safetensors.numpy import load_file, save_file

    shutil.copytree(folder, out)
    tensors = load_file(folder / "model.safetensors")
    for tensor in gguf.GGUFReader(projector).tensors:
        name, values = hf_tensor(tensor.name, dequantize(tensor.data, tensor.tensor_type).astype(np.float32))
        tensors[name] = values.reshape(tensors[name].shape)
    save_file(tensors, out / "model.safetensors", metadata={"format": "pt"})
    return out


def convert_with_projectors(hf_folder, text_out, projector_outs: Mapping[str, Path]) -> tuple[Path, dict[str, Path]]:
    """The language model of the vision-language checkpoint in `hf_folder` converted to the f32 GGUF file `text_out`,
    and its projector file (--mmproj) to each {outtype: path} of `projector_outs`; returns their paths. The conversions
    run side by side: each spends most of its time starting Python and torch."""
    with ThreadPoolExecutor() as pool:
        text_file = pool.submit(convert, hf_folder, text_out)
        projectors = {outtype: pool.submit(convert, hf_folder, out, outtype, ("--mmproj",)) for outtype, out in projector_outs.items()}
        return text_file.result(), {outtype: file.result() for outtype, file in projectors.items()}


# ---- in the subprocess -------------------------------------------------------------------------


def _splits_like_gpt2(tokenizer) -> bool:
    pre = json.loads(tokenizer.backend_tokenizer.to_str()).get("pre_tokenizer") or {}
    return pre.get("type") == "ByteLevel" and pre.get("use_regex", True) and not pre.get("add_prefix_space")


def _has_sentencepiece_model(folder: Path) -> bool:
    return (folder / "tokenizer.model").is_file()


def _has_glm_tokens(folder: Path) -> bool:
    added = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", [])
    return any(token["content"] == "<|endoftext|>" for token in added)


def _teach_byte_level_tokenizers() -> None:
    from conversion import base, gemma, glm, phi

    known_pre = base.TextModel.get_vocab_base_pre

    def get_vocab_base_pre(self, tokenizer) -> str:
        try:
            return known_pre(self, tokenizer)
        except NotImplementedError:
            if not _splits_like_gpt2(tokenizer):
                raise
            base.logger.warning("gguf_convert: this byte-level BPE tokenizer splits text like GPT-2: writing pre-tokenizer 'gpt-2'")
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = get_vocab_base_pre

    own_vocabulary_test = {gemma.Gemma2Model: _has_sentencepiece_model, phi.Phi3MiniModel: _has_sentencepiece_model, glm.Glm4Model: _has_glm_tokens}
    for model_class, has_own_vocabulary in own_vocabulary_test.items():

        def set_vocab(self, own=model_class.set_vocab, has_own_vocabulary=has_own_vocabulary) -> None:
            if has_own_vocabulary(self.dir_model):
                own(self)
            else:
                self._set_vocab_gpt2()

        model_class.set_vocab = set_vocab


def _run_converter(script: str, args: list[str]) -> None:
    """Runs convert_hf_to_gguf.py (or convert_lora_to_gguf.py) with its vendored gguf-py (the installed one may be older), and the
    sentencepiece the fetch script put beside it if this Python lacks one."""
    folder = Path(script).parent
    deps = folder / f"deps-py{sys.version_info[0]}.{sys.version_info[1]}"
    sys.path[0] = str(folder)  # instead of this file's folder
    sys.path[1:1] = [str(folder / "gguf-py"), str(deps)]
    _teach_byte_level_tokenizers()
    sys.argv = [script, *args]
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    _run_converter(sys.argv[1], sys.argv[2:])
