"""Flags made from config fields: a field with ``Flag`` metadata
(runtime/config.py) is a flag whose type, help and default are the field's,
and ``TURNMESH_<ENV>`` sets it too (a flag wins over the environment).

A variable is a string default: argparse converts it only for the command
that runs, so a bad one is that command's usage error, never every command's
traceback. Unset, a flag is None and the model's own default applies."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Any, cast, get_args

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from turnmesh.runtime.config import Flag

ENV_PREFIX = "TURNMESH_"


def env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name.upper(), default)


def scalar(annotation: Any) -> Callable[[str], Any]:
    """The type a flag's text is parsed as: the field's (``float | None`` -> float)."""
    for kind in (annotation, *get_args(annotation)):
        if kind in (int, float, str, Path) or (isinstance(kind, type) and issubclass(kind, Enum)):
            return cast(Callable[[str], Any], kind)
    raise TypeError(f"no flag type for {annotation!r}")


@dataclass(frozen=True)
class Setting:
    """A config field that has a flag."""

    field: str
    flag: str
    # Its variable: TURNMESH_<ENV_NAME>.
    env_name: str
    up: bool
    info: FieldInfo

    @property
    def key(self) -> str:
        """Its name in `up`'s TOML file: the flag's (session_ttl for --session-ttl)."""
        return self.flag.removeprefix("--").replace("-", "_")

    @property
    def variable(self) -> str:
        return ENV_PREFIX + self.env_name.upper()


def settings(model: type[BaseModel]) -> dict[str, Setting]:
    """The model's fields that have a flag, by field name, in the model's order."""
    return {
        name: Setting(name, m.name, m.env or name, m.up, info)
        for name, info in model.model_fields.items()
        for m in info.metadata
        if isinstance(m, Flag)
    }


def add_flag(
    parser: argparse.ArgumentParser,
    setting: Setting,
    *,
    dest: str | None = None,
    read_env: bool = True,
    keep_empty: bool = False,
) -> None:
    """The flag of one field. ``read_env=False``: the caller reads the
    environment itself (`up` ranks its config file above it).
    ``keep_empty``: an empty variable is an empty text, not unset (`edge`)."""
    info = setting.info
    raw = env(setting.env_name) if read_env else None
    dest = dest or setting.field
    if info.annotation is bool:  # a switch: on with the flag or TURNMESH_X=1|true|yes
        parser.add_argument(
            setting.flag,
            dest=dest,
            action="store_const",
            const=True,
            default=True if (raw or "").lower() in ("1", "true", "yes") else None,
            help=info.description,
        )
        return
    if info.annotation == list[str]:  # repeated; the variable is comma-separated
        parser.add_argument(
            setting.flag,
            dest=dest,
            action="append",
            default=[v.strip() for v in raw.split(",") if v.strip()] if raw else None,
            help=info.description,
        )
        return
    parse = scalar(info.annotation)
    default = info.get_default(call_default_factory=True)
    shown = "unset" if default is None else default
    options: dict[str, Any]
    if isinstance(parse, type) and issubclass(parse, Enum):
        options = {"choices": [item.value for item in parse]}  # shown in place of a metavar
    else:
        options = {
            "type": parse,
            "metavar": setting.flag.removeprefix("--").upper().replace("-", "_"),
        }
    parser.add_argument(
        setting.flag,
        dest=dest,
        default=raw if keep_empty and raw == "" and parse is str else raw or None,
        help=f"{info.description} (default: {shown})",
        **options,
    )


def add_flags(
    parser: argparse.ArgumentParser,
    model: type[BaseModel],
    *,
    read_env: bool = True,
    keep_empty: bool = False,
) -> None:
    """A flag for each of the model's fields that has one."""
    for setting in settings(model).values():
        add_flag(parser, setting, read_env=read_env, keep_empty=keep_empty)


def given(args: argparse.Namespace, model: type[BaseModel]) -> dict[str, Any]:
    """The model's fields that a flag or the environment set."""
    return {
        name: getattr(args, name)
        for name in model.model_fields
        if getattr(args, name, None) is not None
    }
