"""Image input for vision-language models.

- `rsgl.vision.images`: a request's image (bytes, data URL, base64, file, PIL image) decoded, within limits, to RGB; its hash.
- `rsgl.vision.pixels`: the resize, rescale and normalize steps the processors share, as transformers' PIL backend does them.
- `rsgl.vision.smolvlm`: SmolVLM / Idefics3 preprocessing (tiles, pixel values) and prompt expansion, as transformers does them.
- `rsgl.vision.qwen2_vl`: Qwen2-VL / Qwen2.5-VL preprocessing (patches, grids), prompt expansion and M-RoPE positions.
- `rsgl.vision.gemma3`: Gemma 3 preprocessing (pan and scan too) and prompt expansion.
"""
