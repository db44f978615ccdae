"""Quantized checkpoints made once, offline: `convert` (int8 W8A8 after SmoothQuant, 4-bit w4a8 and AWQ after AWQ's
scale search) and the 4-bit layouts and search (`w4a8`). `python -m rsgl.quantize` is the command over them."""
