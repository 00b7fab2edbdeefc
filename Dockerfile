# syntax=docker/dockerfile:1
# One image for the control plane (`raylane-server serve`) and for every Ray node
# (`ray start`): Ray drivers run `python -m raylane.jobs.run`, so the nodes need the same
# Raylane as the API (the runner checks its version against the control plane's at
# start) and the same Ray (2.60.0, pinned in constraints.txt). The distribution
# installs only the `raylane` namespace; the examples (`examples.train:main`, ...)
# sit on PYTHONPATH under /opt/raylane-examples, as a user's own code would arrive
# with `--working-dir`.
#
#   docker build -t raylane:0.1.0 .
#
# For GPU work that needs CUDA libraries in the image, build on a CUDA base with
# Python 3.11: --build-arg PYTHON_IMAGE=<your CUDA + Python 3.11 image>.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# --- build: resolve and install the pinned dependency set ----------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml constraints.txt alembic.ini README.md ./
COPY raylane/ raylane/
COPY client/ client/
COPY api/ api/
COPY orchestrator/ orchestrator/
COPY jobs/ jobs/
COPY migrations/ migrations/
# --prefix: the install lands in /install/{bin,lib}, copied to /usr/local below,
# so `ray`, `raylane` and `python` are on the default PATH even in a login shell
# (KubeRay starts Ray with `bash -lc`, and /etc/profile resets PATH).
RUN pip install --prefix=/install -c constraints.txt ".[server]"

# --- runtime: no compiler, no sources, a non-root user -------------------------
FROM ${PYTHON_IMAGE} AS runtime
ENV PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAYLANE_DATA_DIR=/var/lib/raylane \
    RAYLANE_HOST=0.0.0.0 \
    RAYLANE_PORT=8000 \
    PYTHONPATH=/opt/raylane-examples
COPY --from=build /install /usr/local
COPY examples/ /opt/raylane-examples/examples/
# A fixed numeric uid/gid, so Kubernetes' runAsNonRoot can verify it.
RUN groupadd --gid 1000 raylane \
    && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash raylane \
    && mkdir -p /var/lib/raylane /srv/raylane-storage \
    && chown raylane:raylane /var/lib/raylane /srv/raylane-storage \
    && raylane --help >/dev/null
USER 1000:1000
WORKDIR /home/raylane
EXPOSE 8000
# Ray nodes override this with `ray start ...` (compose `command`, KubeRay).
CMD ["raylane-server", "serve"]
