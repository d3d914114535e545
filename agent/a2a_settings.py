"""Where a ``kind: a2a`` agent's remote A2A agent is and how to call it:
``remote:`` in its agent file, checked when the worker starts (a bad field
stops it, named). Apart from the connection (``a2a_link``), so reading an
agent file never loads the a2a-sdk.

The worker may call only URLs under the ``allow`` prefixes (default: the
url's own origin), checked with the rules webhooks' destinations pass
(``runtime.outbound``); loopback or a private host is allowed only where a
prefix names it.
"""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from turnmesh.runtime.outbound import shape_problem, under
from turnmesh.runtime.webhook_trust import parse_prefixes

__all__ = ["MAX_TOKEN_BYTES", "RemoteSettings", "read_token"]

# A token longer than this is not a bearer token.
MAX_TOKEN_BYTES = 8192


class RemoteSettings(BaseModel):
    """Where the remote A2A agent is and how to call it (``remote:`` in the file)."""

    model_config = ConfigDict(extra="forbid")

    url: str = Field(
        description="the agent's base URL (its card is <url>/.well-known/agent-card.json), "
        "or its card's own URL (ending .json)"
    )
    # URL prefixes the worker may call: the card and the interface it names.
    # None: the url's own origin (scheme://host:port).
    allow: list[str] | None = Field(default=None, max_length=64)
    bearer_token_env: str | None = Field(default=None, min_length=1)
    bearer_token_file: str | None = Field(default=None, min_length=1)
    # Seconds without a byte from the remote before the turn fails (a
    # streamed task may run longer than this as long as it says something).
    timeout_seconds: float = Field(default=120.0, gt=0, le=3600)
    connect_timeout_seconds: float = Field(default=10.0, gt=0, le=300)
    # How long a cancelled turn waits for the remote to take its CancelTask.
    cancel_timeout_seconds: float = Field(default=5.0, gt=0, le=60)

    @field_validator("url")
    @classmethod
    def _is_a_url(cls, value: str) -> str:
        if problem := shape_problem(value):
            raise ValueError(problem)
        return value

    @field_validator("allow")
    @classmethod
    def _are_prefixes(cls, value: list[str] | None) -> list[str] | None:
        if value is None:
            return None
        for prefix in value:
            if problem := shape_problem(prefix):
                raise ValueError(f"{prefix!r} {problem}")
        return list(parse_prefixes(",".join(value)))

    @model_validator(mode="after")
    def _one_token(self) -> RemoteSettings:
        if self.bearer_token_env and self.bearer_token_file:
            raise ValueError("give bearer_token_env or bearer_token_file, not both")
        if self.bearer_token_env and not os.environ.get(self.bearer_token_env):
            raise ValueError(f"bearer_token_env: ${self.bearer_token_env} is not set")
        if self.bearer_token_file:
            read_token(Path(self.bearer_token_file))  # readable now, or say so
        if not any(under(self.card_url, prefix) for prefix in self.allowed):
            raise ValueError("allow: the agent's card URL is under none of its prefixes")
        return self

    @property
    def card_url(self) -> str:
        """Where the card is read: the url, if it is the card's own."""
        url = self.url.rstrip("/")
        return url if url.endswith(".json") else f"{url}/.well-known/agent-card.json"

    @property
    def allowed(self) -> list[str]:
        if self.allow is not None:
            return self.allow
        parts = urlsplit(self.url)
        return [f"{parts.scheme}://{parts.netloc}"]


def read_token(path: Path) -> str:
    try:
        with path.open("rb") as file:
            raw = file.read(MAX_TOKEN_BYTES + 1)
        token = raw.decode("ascii").strip()
    except (OSError, UnicodeDecodeError):
        raise ValueError(f"bearer_token_file: cannot read an ASCII token from {path}") from None
    if not token or len(raw) > MAX_TOKEN_BYTES or any(c.isspace() for c in token):
        raise ValueError(f"bearer_token_file: {path} does not hold one bearer token")
    return token
