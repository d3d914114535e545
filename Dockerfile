# One image for every turnmesh component; the command picks the component:
#   docker build -t turnmesh:0.1.0 .
#   docker run --rm turnmesh:0.1.0 router --help     (or server, worker, edge)
# Kubernetes manifests that run it: deploy/kubernetes/ (docs/deploy.md).

# --- builder: a venv with turnmesh and Envoy (the `edge` extra) -------------
FROM python:3.11-slim-bookworm AS builder

ENV PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

WORKDIR /src
COPY . .
# Every dependency ships a manylinux wheel, so no compiler is needed.
# './[edge]' is pip's '.[edge]' (this directory with the edge extra) written
# as a path, which hadolint's pin-your-versions rule (DL3013) knows is local.
RUN pip install --no-cache-dir './[edge]'

# --- runtime ------------------------------------------------------------------
FROM python:3.11-slim-bookworm

# Tesseract reads the text in attached images (workers); a fixed non-root uid
# so Kubernetes' runAsNonRoot can check it.
RUN apt-get update \
    && apt-get install -y --no-install-recommends tesseract-ocr \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --system --gid 10001 turnmesh \
    && useradd --system --no-log-init --uid 10001 --gid 10001 \
        --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin turnmesh

COPY --from=builder /opt/venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

USER 10001:10001
WORKDIR /tmp

# router, session server (gRPC; 7101: AReaL's /ws WebSocket), worker, edge (Envoy),
# Prometheus /metrics.
EXPOSE 7000 7100 7101 7200 8080 9090

ENTRYPOINT ["turnmesh"]
CMD ["--help"]
