"""The tool-call formats by SGLang's `--tool-call-parser` names, and the guess from a chat template."""

from __future__ import annotations

from rsgl.tools.formats.base import ToolCallFormat
from rsgl.tools.formats.harmony import CLUE as HARMONY_CLUE
from rsgl.tools.formats.harmony import HarmonyFormat
from rsgl.tools.formats.hermes import HermesFormat
from rsgl.tools.formats.llama3 import PYTHON_TAG, Llama3Format
from rsgl.tools.formats.mistral import MARKER as MISTRAL_MARKER
from rsgl.tools.formats.mistral import MistralFormat
from rsgl.tools.formats.pythonic import PythonicFormat

FORMATS: dict[str, ToolCallFormat] = {
    "hermes": HermesFormat(),
    "qwen25": HermesFormat(),
    "llama3": Llama3Format(),
    "mistral": MistralFormat(),
    "pythonic": PythonicFormat(),
    "gpt-oss": HarmonyFormat(),
}
# What a template's text gives away about the format its model was trained on, checked in order.
TEMPLATE_CLUES = ((HARMONY_CLUE, "gpt-oss"), ("<tool_call>", "hermes"), (MISTRAL_MARKER, "mistral"), (PYTHON_TAG, "llama3"), ("ipython", "llama3"))
# Also the format rsgl describes to models whose template does not render tools.
DEFAULT_FORMAT = "hermes"


def format_for_template(template: str | None) -> ToolCallFormat:
    """The format a chat template's model writes calls in, guessed from the template's text."""
    name = next((name for clue, name in TEMPLATE_CLUES if template and clue in template), DEFAULT_FORMAT)
    return FORMATS[name].for_template(template)


__all__ = ["DEFAULT_FORMAT", "FORMATS", "ToolCallFormat", "format_for_template"]
