"""The APIs clients already speak (OpenAI chat completions and Responses,
AG-UI, simple chat and its multipart forms), served by every session server as clients of its own
public SessionService."""

from turnmesh.server.compat._common import Mesh
from turnmesh.server.compat.openai_models import Models
from turnmesh.server.compat.service import ChatUploadServicer, CompatServicer

__all__ = ["ChatUploadServicer", "CompatServicer", "Mesh", "Models"]
