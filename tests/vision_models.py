"""Tiny random vision-language folders, built offline with transformers' own classes: SmolVLM (or Idefics3) and
Qwen2.5-VL (`build_tiny_qwen2_5_vl`).

`build_tiny_smolvlm(folder)` writes config.json and model.safetensors (float32: tiny_models.TINY's text model, a
2-layer vision encoder of 32-pixel tiles in 8-pixel patches, scale_factor 2, so TOKENS_PER_TILE = 4; the text config
names its architecture VLlama3ForCausalLM, as SmolVLM's checkpoints do and llama.cpp's converter reads), the byte-level
tokenizer with SmolVLM's special tokens (on `base_tokenizer`: zoo_models.zoo_tokenizer for a GGUF file), and the
processor (processor_config.json: SmolVLM's image processor, images
scaled to a longest edge of 4 tiles, and image_seq_len; SmolVLM's chat template). It returns the transformers model.

The processor is saved by `Idefics3Processor`, which SmolVLM-256M-Instruct's own folder names and which writes the
same prompt text as `SmolVLMProcessor`: SmolVLMProcessor cannot be built without torchvision (for its video
processor) and num2words, which the test extra does not install.
"""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
import transformers
from PIL import Image
from tiny_models import TINY, byte_tokenizer
from tokenizers import Tokenizer
from transformers.models.smolvlm.processing_smolvlm import DEFAULT_CHAT_TEMPLATE

TILE = 32
PATCH = 8
SCALE_FACTOR = 2
TOKENS_PER_TILE = (TILE // PATCH) ** 2 // SCALE_FACTOR**2
LONGEST_EDGE = 4 * TILE

# SmolVLM's special tokens: the chat template's, the image markers and the tile positions (up to 6 x 6, as the real tokenizer has).
VISION_TOKENS = (
    "<|im_start|>",
    "<end_of_utterance>",
    "<fake_token_around_image>",
    "<image>",
    "<global-img>",
    *(f"<row_{row}_col_{col}>" for row in range(1, 7) for col in range(1, 7)),
)

VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=TILE, patch_size=PATCH, initializer_range=0.15)


def vision_tokenizer(base_tokenizer: Callable[[], Tokenizer] = byte_tokenizer) -> Tokenizer:
    """`base_tokenizer()` (tiny_models.byte_tokenizer: one token per byte, BOS first) with VISION_TOKENS added as special tokens."""
    tokenizer = base_tokenizer()
    tokenizer.add_special_tokens(list(VISION_TOKENS))
    return tokenizer


def build_tiny_smolvlm(folder, model_type: str = "smolvlm", base_tokenizer: Callable[[], Tokenizer] = byte_tokenizer, **image_processor_settings):
    """Saves a random SmolVLM (model_type "smolvlm" or "idefics3") with its tokenizer (`vision_tokenizer(base_tokenizer)`)
    and processor to `folder`; `image_processor_settings` override SmolVLMImageProcessorPil's. Returns the transformers model."""
    folder = Path(folder)
    tokenizer = vision_tokenizer(base_tokenizer)
    text_config = {**TINY, "model_type": "llama", "architectures": ["VLlama3ForCausalLM"], "vocab_size": tokenizer.get_vocab_size(), "pad_token_id": 0}
    config = transformers.AutoConfig.for_model(
        model_type, text_config=text_config, vision_config=VISION, scale_factor=SCALE_FACTOR, image_token_id=tokenizer.token_to_id("<image>"), pad_token_id=0
    )
    torch.manual_seed(sum(map(ord, model_type)))
    model = transformers.AutoModelForImageTextToText.from_config(config, dtype=torch.float32).eval()
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<end_of_utterance>", "pad_token": "<unk>"})
    )
    image_processor = transformers.SmolVLMImageProcessorPil(
        **{"size": {"longest_edge": LONGEST_EDGE}, "max_image_size": {"longest_edge": TILE}, **image_processor_settings}
    )
    processor = transformers.Idefics3Processor(
        image_processor=image_processor,
        tokenizer=transformers.AutoTokenizer.from_pretrained(folder),
        image_seq_len=TOKENS_PER_TILE,
        chat_template=DEFAULT_CHAT_TEMPLATE,
    )
    processor.save_pretrained(folder)
    return model


# ---- Gemma 3 ----------------------------------------------------------------------------------------

# Gemma 3's image markers and image token (the processor writes `<start_of_image>` out as boi, image tokens, eoi).
GEMMA3_TOKENS = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>"}
# A 32-pixel image in 8-pixel patches: 4 x 4 patches, pooled 2 x 2 into 4 image tokens (Gemma 3 4B: 64 x 64 into 256).
GEMMA3_TOKENS_PER_IMAGE = 4
GEMMA3_VISION = dict(hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=2, image_size=TILE, patch_size=PATCH, vision_use_head=False)
# Layers 0 and 2 slide over 3 positions (fewer than an image's tokens: a query's window and its image both bound what it
# sees), layer 1 is global. Three layers let the images, and how their tokens attend, show in the tokens.
GEMMA3_TEXT = dict(
    model_type="gemma3_text",
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    query_pre_attn_scalar=16,
    sliding_window=3,
    layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
    bos_token_id=1,
    eos_token_id=2,
    pad_token_id=0,
)
# Parameters re-drawn as normal(mean, std), by the first name part that matches. Gemma's RMS norms scale by 1 + weight (the
# projector's too), SigLIP's LayerNorms by their weight; q scaled by 1 + 2 as in zoo_models (q_norm flattens a larger q_proj).
GEMMA3_INITS = {
    "q_norm.weight": (2.0, 0.1),
    "vision_tower.*norm.*weight": (1.0, 0.1),
    "norm.weight": (0.0, 0.1),
    "bias": (0.0, 0.05),
    "embed_tokens.weight": (0.0, 0.05),
    "mm_input_projection_weight": (0.0, 0.1),
    "": (0.0, 0.15),
}


def gemma3_prompt(images: int) -> str:
    """A Gemma 3 user turn with `images` image placeholders, as its chat template writes them, and the model's turn."""
    return "<start_of_turn>user\n" + "<start_of_image>" * images + "What is here?<end_of_turn>\n<start_of_turn>model\n"


def build_tiny_gemma3(folder, base_tokenizer: Callable[[], Tokenizer] = byte_tokenizer, **text_config):
    """Saves a random Gemma3ForConditionalGeneration (float32, weights as GEMMA3_INITS draws them; `text_config`
    overriding GEMMA3_TEXT) with a byte-level tokenizer (`base_tokenizer()`: zoo_models.zoo_tokenizer for a GGUF file)
    plus GEMMA3_TOKENS and Gemma3Processor's files (32 x 32 images, GEMMA3_TOKENS_PER_IMAGE tokens each) to `folder`.
    Returns the transformers model."""
    import re

    folder = Path(folder)
    tokenizer = base_tokenizer()
    tokenizer.add_special_tokens(list(GEMMA3_TOKENS.values()))
    token = tokenizer.token_to_id
    config = transformers.Gemma3Config(
        text_config={**GEMMA3_TEXT, **text_config, "vocab_size": tokenizer.get_vocab_size()},
        vision_config=GEMMA3_VISION,
        mm_tokens_per_image=GEMMA3_TOKENS_PER_IMAGE,
        image_token_index=token(GEMMA3_TOKENS["image_token"]),
        boi_token_index=token(GEMMA3_TOKENS["boi_token"]),
        eoi_token_index=token(GEMMA3_TOKENS["eoi_token"]),
    )
    torch.manual_seed(3)
    model = transformers.Gemma3ForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        for name, weight in model.named_parameters():
            mean, std = next(init for pattern, init in GEMMA3_INITS.items() if re.search(pattern, name))
            weight.normal_(mean, std)
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "extra_special_tokens": GEMMA3_TOKENS})
    )
    processor = transformers.Gemma3Processor(
        image_processor=transformers.Gemma3ImageProcessorPil(size={"height": TILE, "width": TILE}),
        tokenizer=transformers.AutoTokenizer.from_pretrained(folder),
        image_seq_length=GEMMA3_TOKENS_PER_IMAGE,
    )
    processor.save_pretrained(folder)
    # As Gemma 3's folders on the Hub have it (transformers 5 nests it in processor_config.json).
    processor.image_processor.save_pretrained(folder)
    return model


# ---- Qwen2.5-VL ---------------------------------------------------------------------------------------------------

QWEN_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>")
QWEN_PATCH = 14
# Windows of 56 pixels: 2 x 2 merged tokens (4 x 4 patches), so a 56 x 84 or 112 x 112 image is cut into several.
QWEN_WINDOW = 56
# Images are shrunk to at most 112 x 112 pixels' worth (16 tokens) and grown to at least 56 x 56 (4 tokens).
QWEN_MIN_PIXELS, QWEN_MAX_PIXELS = 56 * 56, 112 * 112
QWEN_VISION = dict(depth=3, hidden_size=32, intermediate_size=48, num_heads=2, out_hidden_size=48, patch_size=QWEN_PATCH, fullatt_block_indexes=[1])


def build_tiny_qwen2_5_vl(
    folder,
    base_tokenizer: Callable[[], Tokenizer] = byte_tokenizer,
    window_size: int = QWEN_WINDOW,
    min_pixels: int = QWEN_MIN_PIXELS,
    max_pixels: int = QWEN_MAX_PIXELS,
):
    """Saves a random Qwen2.5-VL (float32; a 2-layer language model of 48 wide with 3 heads of 16 over 1 kv head, M-RoPE
    sections 2 + 3 + 3; a 3-block vision tower, the middle one full attention, the others attending within windows of
    `window_size` pixels) with a byte-level tokenizer (`base_tokenizer()`: zoo_models.zoo_tokenizer for a GGUF file) plus
    Qwen's special tokens and the image processor's preprocessor_config.json (images resized to `min_pixels` to
    `max_pixels`) to `folder`. Weights have a std of 0.2 (the language model's) and 0.3 (the vision tower's), enough that
    greedy tokens change when the tower attends to the whole image instead of windows (or the reverse), or the positions
    of image tokens or of output tokens are 1D ones. Returns the transformers model."""
    folder = Path(folder)
    tokenizer = base_tokenizer()
    tokenizer.add_special_tokens(list(QWEN_TOKENS))
    ids = {token: tokenizer.token_to_id(token) for token in QWEN_TOKENS}
    text = dict(
        hidden_size=48, intermediate_size=64, num_hidden_layers=2, num_attention_heads=3, num_key_value_heads=1, vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=1024, bos_token_id=1, eos_token_id=ids["<|im_end|>"], initializer_range=0.2,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]},
    )  # fmt: skip
    config = transformers.Qwen2_5_VLConfig(
        text_config=text,
        vision_config={**QWEN_VISION, "window_size": window_size, "initializer_range": 0.3},
        image_token_id=ids["<|image_pad|>"],
        video_token_id=ids["<|video_pad|>"],
        vision_start_token_id=ids["<|vision_start|>"],
        vision_end_token_id=ids["<|vision_end|>"],
        initializer_range=0.2,
    )
    torch.manual_seed(25)
    model = transformers.Qwen2_5_VLForConditionalGeneration(config).to(torch.float32).eval()
    with torch.no_grad():
        # transformers starts the norms at 1 and the biases at 0: random ones test that they are read.
        for name, parameter in model.named_parameters():
            if name.endswith("bias") or "norm" in name or "ln_q" in name:
                parameter.normal_(1.0 if not name.endswith("bias") else 0.0, 0.1)
    model.save_pretrained(folder)
    tokenizer.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(
        json.dumps({"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "<|im_end|>", "pad_token": "<unk>"})
    )
    transformers.Qwen2VLImageProcessorPil(min_pixels=min_pixels, max_pixels=max_pixels).save_pretrained(folder)
    return model


# ---- what the families' tests share --------------------------------------------------------------------------------


def logprobs(result: dict) -> list[float]:
    """The log-probabilities of a result's output tokens (asked for with return_logprob=True)."""
    return [logprob for logprob, _, _ in result["meta_info"]["output_token_logprobs"]]


def picture(seed: int, size: tuple[int, int]) -> Image.Image:
    """A random RGB picture, smooth enough that resizing keeps it distinct."""
    rng = np.random.default_rng(seed)
    coarse = rng.integers(0, 256, size=(6, 6, 3), dtype=np.uint8)
    return Image.fromarray(coarse).resize(size, Image.Resampling.BILINEAR)


def check_the_cache_keys_images(
    engine, reference: Callable[[list[Image.Image]], list[int]], text: str, greedy: dict, first_image_token: int, size: tuple[int, int] = (64, 64)
) -> int:
    """Two pictures of `size` in `text` (one image placeholder): their tokens equal `reference(images)` (transformers'
    greedy tokens) and differ; the same picture again is read from the prefix cache, its image included, with the same
    tokens; the other shares at most the text before its image (`first_image_token`: the index of the prompt's first
    image token). Returns the tokens the other picture's prompt read from the cache."""
    engine.flush_cache()
    first, other = picture(10, size), picture(11, size)
    expected = reference([first]), reference([other])
    assert expected[0] != expected[1], "the fixture must tell the two pictures apart"
    one = engine.generate(text, greedy, image_data=[first])
    again = engine.generate(text, greedy, image_data=[first.copy()])
    different = engine.generate(text, greedy, image_data=[other])
    assert [one["output_ids"], different["output_ids"]] == list(expected)
    assert again["output_ids"] == one["output_ids"]
    assert again["meta_info"]["cached_tokens"] > first_image_token, "the same picture's prompt is read from the prefix cache, its image included"
    assert different["meta_info"]["cached_tokens"] <= first_image_token, "another picture shares at most the text before it, never its KV"
    return different["meta_info"]["cached_tokens"]
