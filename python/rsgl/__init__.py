"""rsgl: an SGLang-class LLM serving engine for CPUs, with a Rust core.

import rsgl
with rsgl.Engine() as llm:
    print(llm.chat([{"role": "user", "content": "Name three primary colors."}])["text"])
"""

from rsgl import lang
from rsgl._core import __version__, kernel_isa
from rsgl.engine import Engine
from rsgl.errors import EngineClosedError, InvalidRequestError, ModelLoadError, RsglError, UnsupportedModelError
from rsgl.lang import *  # noqa: F403  (the program frontend: rsgl.function, rsgl.gen, ...)

__all__ = [
    "Engine",
    "EngineClosedError",
    "InvalidRequestError",
    "ModelLoadError",
    "RsglError",
    "UnsupportedModelError",
    "__version__",
    "kernel_isa",
    *lang.__all__,
]
