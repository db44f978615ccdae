"""Image input for vision-language models.

- `rsgl.vision.images`: a request's image (bytes, data URL, base64, file, PIL image) decoded, within limits, to RGB.
- `rsgl.vision.smolvlm`: SmolVLM / Idefics3 preprocessing (tiles, pixel values) and prompt expansion, as transformers does them.
"""
