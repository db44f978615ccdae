"""Tool calling for chat models: the functions a request offers, how each model family writes a
call (`formats`), how a template without tool support is told about them (`fallback_prompt`), and
the grammar that forces a call (`ToolCallFormat.constraint`)."""

from rsgl.tools.calls import Function, ToolCall
from rsgl.tools.fallback_prompt import messages_for_template, template_renders_tools
from rsgl.tools.formats import FORMATS, ToolCallFormat, format_for_template

__all__ = ["FORMATS", "Function", "ToolCall", "ToolCallFormat", "format_for_template", "messages_for_template", "template_renders_tools"]
