"""Tool calling for any model: one place interprets ``tools`` and ``tool_choice``.

:mod:`.plan` decides how a body's tools are carried (written into the prompt in a
``ToolPromptFormat``, or rendered by a chat template that supports tools) and reads calls back
from the answer; :mod:`.formats` writes and parses the prompt formats. Guide:
``docs/structured.md``.
"""

from .formats import ToolRefusal
from .plan import (
    DEFAULT_FORMAT,
    NativeParser,
    ToolPlan,
    apply_to_body,
    forced_schema,
    mentions_tools,
    plan_tools,
    read_answer,
)

__all__ = [
    "DEFAULT_FORMAT",
    "NativeParser",
    "ToolPlan",
    "ToolRefusal",
    "apply_to_body",
    "forced_schema",
    "mentions_tools",
    "plan_tools",
    "read_answer",
]
