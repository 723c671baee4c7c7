# syntax=docker/dockerfile:1
#
# One image for the three sessionmem processes; the command picks the component:
#
#   python -m sessionmem_proxy       the state-layer proxy (the default command)
#   python -m sessionmem_operator    the kopf operator
#   python -m sessionmem_launcher    the launcher sidecar the operator injects into agent pods
#
# Build: docker build -t ghcr.io/ctxmesh/sessionmem:0.1.0 .   (or podman build / buildah bud)
#
# Runs as the numeric user 10001, with nothing written outside /tmp: works with
# readOnlyRootFilesystem and runAsNonRoot (the chart mounts an emptyDir on /tmp).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: a virtualenv with the pinned dependencies and the sessionmem wheel -------------------
FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore

# A build whose traffic to the package index passes a TLS-intercepting proxy passes the path of a CA
# bundle it mounts into the build (tools/e2e/image.sh does); unset, pip trusts its own bundle. Build
# arguments live only in this stage: nothing of them reaches the runtime image.
ARG PIP_CERT

WORKDIR /src
# python3, not python: a Debian-made base (tools/e2e) has no unversioned `python`; the venv has both.
RUN python3 -m venv /opt/sessionmem

# Dependencies first (pinned in requirements.txt, their own dependencies in constraints.txt), so source
# edits reuse this layer.
COPY requirements.txt constraints.txt ./
RUN /opt/sessionmem/bin/pip install --no-cache-dir -r requirements.txt -c constraints.txt

COPY pyproject.toml README.md ./
COPY core ./core
COPY infra ./infra
COPY proxy ./proxy
COPY launcher ./launcher
COPY operator ./operator
COPY demo ./demo
COPY client ./client
# A real wheel (not an editable install), then its bytecode compiled here: the runtime root is read-only.
RUN /opt/sessionmem/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /tmp/wheels . \
    && /opt/sessionmem/bin/pip install --no-cache-dir --no-deps /tmp/wheels/sessionmem-*.whl \
    && /opt/sessionmem/bin/python -m compileall -q /opt/sessionmem/lib \
    && /opt/sessionmem/bin/python -c "import sessionmem_core, sessionmem_infra, sessionmem_proxy, sessionmem_launcher, sessionmem_operator"

# A passwd entry for the numeric user, copied into the runtime stage: kopf names its peering identity
# after getpass.getuser(), which raises "getpwuid(): uid not found: 10001" without one (the operator
# crash-looped in a real cluster). Made here so the runtime stage runs no build step.
RUN groupadd --system --gid 10001 sessionmem \
    && useradd --system --uid 10001 --gid 10001 --home-dir /tmp --no-create-home \
       --shell /usr/sbin/nologin sessionmem

# ---- runtime: the same Python, the virtualenv, no build tools ---------------------------------------
FROM ${PYTHON_IMAGE} AS runtime

LABEL org.opencontainers.image.title="sessionmem" \
      org.opencontainers.image.description="sessionmem operator, state-layer proxy and launcher" \
      org.opencontainers.image.licenses="Apache-2.0"

# PYTHONSAFEPATH: never put the working directory on sys.path (nothing but site-packages is imported).
# LOGNAME: getpass.getuser() (kopf's peering identity) reads it before the passwd file, so the image also
# runs under a uid the platform picks (OpenShift's restricted-v2), which has no passwd entry.
ENV PATH=/opt/sessionmem/bin:$PATH \
    LOGNAME=sessionmem \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONSAFEPATH=1 \
    HOME=/tmp

COPY --from=builder /opt/sessionmem /opt/sessionmem
COPY --from=builder /etc/passwd /etc/group /etc/

USER 10001:10001
WORKDIR /opt/sessionmem

# proxy 8000, launcher 8080 (serving) and 2998 (127.0.0.1 memory endpoint), operator health 8080.
EXPOSE 8000 8080

CMD ["python", "-m", "sessionmem_proxy"]
