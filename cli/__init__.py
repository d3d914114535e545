"""The ``turnmesh`` command line: one subcommand per component."""

from turnmesh.cli.main import main

__all__ = ["main"]
