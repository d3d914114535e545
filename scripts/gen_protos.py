"""Regenerate gen/ from proto/: the only way gen/ is produced.

Writes Python messages, gRPC stubs and .pyi stubs for proto/turnmesh/v1/*.proto,
an ``__init__.py`` that re-exports them, and the descriptor set Envoy's JSON
transcoder loads (``--include_imports``, plus google/rpc/error_details.proto so
that Envoy can print every error detail we send, plus A2A's ``lf.a2a.v1``
exactly as the pinned a2a-sdk ships it).

Usage: python scripts/gen_protos.py [OUT_DIR]   (default: gen/)
"""

from __future__ import annotations

import ast
import os
import shutil
import sys
import tempfile
from importlib import resources
from pathlib import Path

from a2a.types import a2a_pb2
from google.protobuf import descriptor_pb2
from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
THIRD_PARTY_DIR = ROOT / "third_party"
PACKAGE_DIR = Path("turnmesh") / "v1"
DESCRIPTOR_SET = "turnmesh.binpb"
# Types Envoy must know to print google.rpc.Status details in JSON errors.
EXTRA_DESCRIPTOR_PROTOS = ("google/rpc/error_details.proto", "google/rpc/status.proto")
# A2A's contract (package lf.a2a.v1, service A2AService) is the pinned
# a2a-sdk's generated module: the wheel ships no .proto, and a second
# generated copy of lf.a2a.v1 in one process fails ("duplicate file name
# a2a.proto"). Its serialized descriptor joins the set as it is, after the
# files it imports (vendored in third_party/, or protoc's well-known types).
A2A_IMPORTS = tuple(d.name for d in a2a_pb2.DESCRIPTOR.dependencies)
# Envoy's external authorization service, which the session servers serve to
# Envoy's ext_authz filter. Its protos (and their imports: udpa, validate,
# xds) come from the npm package @grpc/grpc-js-xds, pinned in tools/: the PyPI
# package xds-protos would overwrite opentelemetry-proto's and
# googleapis-common-protos' modules with older ones. Only a descriptor set is
# made, which runtime/ext_authz.py loads into a pool of its own.
XDS_DEPS = ROOT / "tools" / "node_modules" / "@grpc" / "grpc-js-xds" / "deps"
ENVOY_AUTH_PROTO = "envoy/service/auth/v3/external_auth.proto"
ENVOY_AUTH_DESCRIPTOR_SET = "envoy_auth.binpb"


def _include_dirs() -> list[str]:
    # googleapis' files come from third_party/ (vendored, as buf and other
    # languages' tools use them); the well-known types from grpc_tools.
    grpc_tools_include = resources.files("grpc_tools") / "_proto"
    return [str(PROTO_DIR), str(THIRD_PARTY_DIR), str(grpc_tools_include)]


def _run_protoc(args: list[str]) -> None:
    code = protoc.main(["grpc_tools.protoc", *[f"-I{d}" for d in _include_dirs()], *args])
    if code != 0:
        raise SystemExit(f"protoc failed with exit code {code}")


def _public_names(module_path: Path) -> list[str]:
    """Top-level public classes and constants a generated module defines."""
    tree = ast.parse(module_path.read_text())
    names: list[str] = []
    for node in tree.body:
        if (isinstance(node, ast.ClassDef) and not node.name.startswith("_")) or (
            isinstance(node, ast.FunctionDef) and not node.name.startswith("_")
        ):
            names.append(node.name)
    return names


def _write_init(package: Path, protos: list[Path]) -> None:
    lines = ['"""Generated from proto/turnmesh/v1 by scripts/gen_protos.py. DO NOT EDIT."""', ""]
    exported: list[str] = []
    for proto in protos:
        stem = proto.stem
        for suffix in ("_pb2", "_pb2_grpc"):
            module = f"{stem}{suffix}"
            if not (package / f"{module}.py").exists():
                continue
            lines.append(f"from turnmesh.v1 import {module}")
            exported.append(module)
    lines.append("")
    # Messages and enums are attributes set at import time, not class
    # statements, so re-export them from the .pyi stubs, which name them all.
    for proto in protos:
        stem = proto.stem
        pyi = package / f"{stem}_pb2.pyi"
        names = [n for n in _public_names(pyi) if n not in {"DESCRIPTOR"}]
        grpc_py = package / f"{stem}_pb2_grpc.py"
        grpc_names = _public_names(grpc_py) if grpc_py.exists() else []
        for name in names:
            lines.append(f"from turnmesh.v1.{stem}_pb2 import {name} as {name}")
            exported.append(name)
        for name in grpc_names:
            lines.append(f"from turnmesh.v1.{stem}_pb2_grpc import {name} as {name}")
            exported.append(name)
    # Enum values of the module-level enums (e.g. RUN_STARTED) stay on their
    # enum classes; only types are re-exported.
    lines.append("")
    lines.append("__all__ = [")
    lines.extend(f'    "{name}",' for name in sorted(set(exported)))
    lines.append("]")
    (package / "__init__.py").write_text("\n".join(lines) + "\n")


def _envoy_auth_descriptors(out: Path) -> None:
    if not XDS_DEPS.is_dir():
        raise SystemExit(f"{XDS_DEPS} is missing: run `make install` (npm ci in tools/)")
    includes = [XDS_DEPS / d for d in ("envoy-api", "xds", "protoc-gen-validate", "googleapis")]
    grpc_tools_include = resources.files("grpc_tools") / "_proto"
    code = protoc.main(
        [
            "grpc_tools.protoc",
            *[f"-I{d}" for d in [*includes, grpc_tools_include]],
            "--include_imports",
            f"--descriptor_set_out={out}",
            ENVOY_AUTH_PROTO,
        ]
    )
    if code != 0:
        raise SystemExit(f"protoc failed on {ENVOY_AUTH_PROTO} with exit code {code}")


def _add_a2a(path: Path) -> None:
    """Append A2A's file, as the pinned a2a-sdk serialized it, to the set."""
    files = descriptor_pb2.FileDescriptorSet.FromString(path.read_bytes())
    names = {f.name for f in files.file}
    missing = [name for name in A2A_IMPORTS if name not in names]
    if missing or a2a_pb2.DESCRIPTOR.name in names:
        raise SystemExit(f"cannot add {a2a_pb2.DESCRIPTOR.name}: missing {missing}")
    files.file.append(
        descriptor_pb2.FileDescriptorProto.FromString(a2a_pb2.DESCRIPTOR.serialized_pb)
    )
    path.write_bytes(files.SerializeToString())


def generate(out_dir: Path) -> None:
    protos = sorted((PROTO_DIR / PACKAGE_DIR).glob("*.proto"))
    rel = [str(p.relative_to(PROTO_DIR)) for p in protos]
    with tempfile.TemporaryDirectory() as tmp:
        tmp_out = Path(tmp)
        bin_dir = Path(sys.executable).parent
        _run_protoc(
            [
                f"--plugin=protoc-gen-mypy={bin_dir / 'protoc-gen-mypy'}",
                f"--plugin=protoc-gen-mypy_grpc={bin_dir / 'protoc-gen-mypy_grpc'}",
                f"--python_out={tmp_out}",
                f"--grpc_python_out={tmp_out}",
                f"--mypy_out={tmp_out}",
                f"--mypy_grpc_out={tmp_out}",
                *rel,
            ]
        )
        _run_protoc(
            [
                "--include_imports",
                "--include_source_info",
                f"--descriptor_set_out={tmp_out / DESCRIPTOR_SET}",
                *rel,
                *EXTRA_DESCRIPTOR_PROTOS,
                *A2A_IMPORTS,
            ]
        )
        _add_a2a(tmp_out / DESCRIPTOR_SET)
        _envoy_auth_descriptors(tmp_out / PACKAGE_DIR / ENVOY_AUTH_DESCRIPTOR_SET)
        package = tmp_out / PACKAGE_DIR
        _write_init(package, protos)
        (package / "py.typed").write_text("")

        target_pkg = out_dir / PACKAGE_DIR
        if target_pkg.exists():
            shutil.rmtree(target_pkg)
        target_pkg.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(package, target_pkg)
        # Inside the package, so that every install (a wheel too) carries it.
        shutil.copyfile(tmp_out / DESCRIPTOR_SET, target_pkg / DESCRIPTOR_SET)
        (out_dir / DESCRIPTOR_SET).unlink(missing_ok=True)
    os.utime(out_dir)  # gen/ is as new as its contents (tools compare it with proto/)


def main() -> None:
    out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "gen"
    generate(out_dir)
    print(f"generated {out_dir}")


if __name__ == "__main__":
    main()
