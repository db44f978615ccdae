"""A tiny random SmolVLM (or Idefics3) folder, built offline with transformers' own classes.

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

import torch
import transformers
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
