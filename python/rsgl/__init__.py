"""rsgl: an SGLang-class LLM serving engine for CPUs, with a Rust core.

    import rsgl
    with rsgl.Engine() as llm:
        print(llm.chat([{"role": "user", "content": "Name three primary colors."}])["text"])
"""

from rsgl._core import __version__, kernel_isa
from rsgl.engine import Engine
from rsgl.errors import EngineClosedError, InvalidRequestError, ModelLoadError, RsglError, UnsupportedModelError
from rsgl.lang import (
    Program,
    ProgramState,
    RuntimeEndpoint,
    assistant,
    function,
    gen,
    select,
    set_default_backend,
    system,
    user,
)

__all__ = [
    "Engine",
    "Program",
    "ProgramState",
    "RuntimeEndpoint",
    "assistant",
    "function",
    "gen",
    "select",
    "set_default_backend",
    "system",
    "user",
    "EngineClosedError",
    "InvalidRequestError",
    "ModelLoadError",
    "RsglError",
    "UnsupportedModelError",
    "__version__",
    "kernel_isa",
]
