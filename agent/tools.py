"""Tools for model-backed agents: plain Python callables, registered by import
path (``package.module:function``), described to the model as function
schemas built from their signatures, run with a time limit each.

::

    def weather(city: str, unit: Literal["C", "F"] = "C") -> str:
        \"\"\"The current weather in a city.\"\"\"
        ...

The schema comes from pydantic (the parameters' types and defaults); the
description is the docstring's first paragraph. Sync functions run in a thread,
async ones on the loop.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError, create_model

__all__ = ["Tool", "ToolLoadError", "load_tool"]

log = logging.getLogger(__name__)


class ToolLoadError(ValueError):
    """The tool spec names nothing that can be called as a tool."""


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    function: Callable[..., Any]
    arguments: type[BaseModel]

    @classmethod
    def from_function(cls, function: Callable[..., Any], name: str | None = None) -> Tool:
        signature = inspect.signature(function)
        try:
            # Resolved, not as text: modules with `from __future__ import annotations`.
            hints = typing.get_type_hints(function, include_extras=True)
        except (NameError, TypeError) as exc:
            raise ToolLoadError(f"tool {function.__name__!r} has unresolvable types") from exc
        fields: dict[str, Any] = {}
        for parameter in signature.parameters.values():
            if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
                raise ToolLoadError(f"tool {function.__name__!r} cannot take *args or **kwargs")
            annotation = hints.get(parameter.name, str)
            default = parameter.default if parameter.default is not parameter.empty else ...
            fields[parameter.name] = (annotation, default)
        tool_name = name or function.__name__
        model = create_model(f"{tool_name}_arguments", **fields)
        doc = inspect.getdoc(function) or ""
        return cls(tool_name, doc.split("\n\n", 1)[0].strip(), function, model)

    def schema(self) -> dict[str, Any]:
        """The OpenAI ``tools`` entry for this tool."""
        parameters = self.arguments.model_json_schema()
        parameters.pop("title", None)
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    async def invoke(self, arguments_json: str, timeout: float) -> str:
        """The tool's result as text for the model. A bad call, a failure or
        a timeout is a result too (``error: ...``), so the model can recover;
        the exception's own text stays in the worker's log."""
        try:
            raw = json.loads(arguments_json or "{}")
            arguments = self.arguments.model_validate(raw).model_dump()
        except (json.JSONDecodeError, ValidationError) as exc:
            return f"error: invalid arguments for {self.name}: {_first_problem(exc)}"
        try:
            if inspect.iscoroutinefunction(self.function):
                result = await asyncio.wait_for(self.function(**arguments), timeout)
            else:
                result = await asyncio.wait_for(
                    asyncio.to_thread(self.function, **arguments), timeout
                )
        except TimeoutError:
            return f"error: {self.name} did not finish within {timeout:g} seconds"
        except Exception as exc:
            log.warning("tool %s raised", self.name, exc_info=exc)
            return f"error: {self.name} failed ({type(exc).__name__})"
        return result if isinstance(result, str) else json.dumps(result, default=str)


def _first_problem(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        error = exc.errors()[0]
        where = ".".join(str(p) for p in error["loc"]) or "arguments"
        return f"{where}: {error['msg']}"
    return "not a JSON object"


def load_tool(spec: str) -> Tool:
    """``package.module:function`` as a Tool."""
    module_name, _, attribute = spec.strip().partition(":")
    if not module_name or not attribute:
        raise ToolLoadError(f"invalid tool {spec!r}: expected 'package.module:function'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ToolLoadError(f"cannot import module {module_name!r} for tool {spec!r}") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ToolLoadError(f"{spec!r} is not a function")
    return Tool.from_function(function)
