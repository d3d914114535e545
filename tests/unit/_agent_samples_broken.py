"""A module that fails while importing, for the loader tests."""

raise RuntimeError("boom at import time")
