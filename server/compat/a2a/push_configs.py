"""A2A push notification configs as a client sends them: checked (bounded
sizes, header-safe secrets, the URL on the webhook allow-list), shown back
without their secrets, and the headers a push carries.

Secrets are write-only: a config's ``token`` and its authentication's
``credentials`` are stored (each push sends them) but never read back (Get,
List and Create answer with them empty) nor named in an error or a log line.
"""

from __future__ import annotations

import re

from a2a.types import a2a_pb2

from turnmesh.runtime.errors import FieldViolation, InvalidParams

# Bounds of one config (a stored one is at most a few KiB).
MAX_CONFIGS_PER_TASK = 5
MAX_CONFIG_ID_CHARS = 256
MAX_URL_CHARS = 2048
MAX_TOKEN_CHARS = 512
MAX_CREDENTIALS_CHARS = 4096
TOKEN_HEADER = "X-A2A-Notification-Token"
AUTHORIZATION_HEADER = "Authorization"
# A header value: visible ASCII, spaces inside (never CR, LF or other
# controls, which would split a header).
_HEADER_VALUE = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")
# An auth scheme: an HTTP token (RFC 9110).
_SCHEME = re.compile(r"[A-Za-z0-9!#$%&'*+.^_`|~-]{1,64}")
_CONFIG_ID = re.compile(r"[^\x00-\x1f\x7f]+")


def _violation(field: str, description: str) -> InvalidParams:
    return InvalidParams([FieldViolation(field, description)])


def checked(config: a2a_pb2.TaskPushNotificationConfig, where: str) -> None:
    """InvalidParams naming the field (under ``where``) a config breaks; its
    URL's allow-list is checked apart (``WebhookSender.check``). Never echoes
    a secret."""
    if len(config.id) > MAX_CONFIG_ID_CHARS or (config.id and not _CONFIG_ID.fullmatch(config.id)):
        raise _violation(
            f"{where}id", f"must be at most {MAX_CONFIG_ID_CHARS} characters, none a control"
        )
    if not config.url:
        raise _violation(f"{where}url", "is required")
    if len(config.url) > MAX_URL_CHARS:
        raise _violation(f"{where}url", f"must be at most {MAX_URL_CHARS} characters")
    if config.token and (
        len(config.token) > MAX_TOKEN_CHARS or not _HEADER_VALUE.fullmatch(config.token)
    ):
        raise _violation(
            f"{where}token",
            f"must be at most {MAX_TOKEN_CHARS} visible ASCII characters (spaces inside)",
        )
    if config.HasField("authentication"):
        auth = config.authentication
        if not _SCHEME.fullmatch(auth.scheme):
            raise _violation(
                f"{where}authentication.scheme", "must be an HTTP auth scheme (e.g. Bearer)"
            )
        if not auth.credentials:
            raise _violation(f"{where}authentication.credentials", "is required with a scheme")
        if len(auth.credentials) > MAX_CREDENTIALS_CHARS or not _HEADER_VALUE.fullmatch(
            auth.credentials
        ):
            raise _violation(
                f"{where}authentication.credentials",
                f"must be at most {MAX_CREDENTIALS_CHARS} visible ASCII characters (spaces inside)",
            )


def stored(
    config: a2a_pb2.TaskPushNotificationConfig, task_id: str, tenant: str
) -> a2a_pb2.TaskPushNotificationConfig:
    """The config as kept: its task's id, and its own id (the task's if it
    has none, as the a2a-sdk's stores do)."""
    kept = a2a_pb2.TaskPushNotificationConfig()
    kept.CopyFrom(config)
    kept.task_id = task_id
    kept.tenant = tenant
    kept.id = config.id or task_id
    return kept


def shown(config: a2a_pb2.TaskPushNotificationConfig) -> a2a_pb2.TaskPushNotificationConfig:
    """The config without its secrets (write-only)."""
    out = a2a_pb2.TaskPushNotificationConfig()
    out.CopyFrom(config)
    out.ClearField("token")
    if out.HasField("authentication"):
        out.authentication.ClearField("credentials")
    return out


def headers(config: a2a_pb2.TaskPushNotificationConfig) -> dict[str, str]:
    """What a push to the config carries beside the outbox's own headers, as
    a2a-sdk's sender sends them."""
    out: dict[str, str] = {}
    if config.token:
        out[TOKEN_HEADER] = config.token
    auth = config.authentication
    if config.HasField("authentication") and auth.scheme and auth.credentials:
        out[AUTHORIZATION_HEADER] = f"{auth.scheme} {auth.credentials}"
    return out
