"""The browser playground: one static page (``index.html``: HTML, CSS and
JavaScript, no build step, nothing from the internet) that Envoy serves at
``GET /`` and that talks to the public REST/SSE API only."""

from pathlib import Path

INDEX = Path(__file__).resolve().parent / "index.html"

__all__ = ["INDEX"]
