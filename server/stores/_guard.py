"""Errors of a store's driver translated at the store's edge: every public
coroutine of a store class runs under one ``translate`` (the Redis and
PostgreSQL clients give theirs), so a driver's exception never reaches a
caller as an internal error or with its own text."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

T = TypeVar("T")

# A driver's exception -> the store's error to raise instead, or None to let
# it go up as it is (a mistake of ours: internal, logged as such).
Translate = Callable[[Exception], Exception | None]


def translating(translate: Translate) -> Callable[[type[T]], type[T]]:
    """A class decorator: each public coroutine of the class (inherited ones
    too) raises ``translate(exc)`` in place of an exception it maps."""

    def decorate(cls: type[T]) -> type[T]:
        members = {name: getattr(cls, name) for name in dir(cls) if not name.startswith("_")}
        for name, member in members.items():
            if inspect.iscoroutinefunction(member):
                setattr(cls, name, _guarded(member, translate))
        return cls

    return decorate


def _guarded(
    method: Callable[..., Awaitable[Any]], translate: Translate
) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(method)
    async def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            return await method(*args, **kwargs)
        except Exception as exc:
            mapped = translate(exc)
            if mapped is None:
                raise
            raise mapped from exc

    return guarded
