# syntax=docker/dockerfile:1
# textgen: the Rust router, the torch shards and the launcher in one CUDA image.
#
#   docker build --build-arg TEXTGEN_GIT_SHA=$(git rev-parse HEAD) -t textgen .
#   docker run --gpus all --shm-size 1g -p 8080:80 -v $PWD/data:/data textgen --model-id X
#
# Stages: `builder` compiles the router's Rust dependencies from the lock file alone (a layer
# that survives source edits), installs the Python dependencies into /opt/textgen from
# pyproject.toml alone, then runs the README's install command (`make install`) on the
# sources. `runtime` copies that virtual environment onto a CUDA runtime base.

ARG RUST_VERSION=1.95
ARG UBUNTU_VERSION=24.04
ARG CUDA_RUNTIME_IMAGE=nvidia/cuda:12.8.1-runtime-ubuntu24.04

FROM rust:${RUST_VERSION}-slim-bookworm AS rust-toolchain

# Ubuntu, like the runtime base, so the virtual environment's python3 is the same one.
FROM ubuntu:${UBUNTU_VERSION} AS builder
ENV DEBIAN_FRONTEND=noninteractive
# Ubuntu's archive keeps only the newest build of each package, so pinned versions would stop
# resolving at the next security update: the base image's tag is the pin.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends \
        build-essential ca-certificates make pkg-config python3 python3-dev python3-venv \
    && rm -rf /var/lib/apt/lists/*
COPY --from=rust-toolchain /usr/local/cargo /usr/local/cargo
COPY --from=rust-toolchain /usr/local/rustup /usr/local/rustup
ENV CARGO_HOME=/usr/local/cargo RUSTUP_HOME=/usr/local/rustup \
    PATH=/usr/local/cargo/bin:$PATH PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src

# 1. Rust dependencies, keyed on the manifest, the lock file and the proto only: an empty
#    crate builds every dependency once, then its own artifacts are dropped so the real
#    sources recompile against the cached dependencies.
COPY router/Cargo.toml router/Cargo.lock router/build.rs router/
COPY proto proto
RUN mkdir -p router/src \
    && echo 'fn main() {}' > router/src/main.rs \
    && touch router/src/lib.rs \
    && cargo build --release --locked --manifest-path router/Cargo.toml \
    && rm -rf router/src router/target/release/.fingerprint/textgen-router-* \
        router/target/release/build/textgen-router-* router/target/release/deps/*textgen_router*

# 2. Python dependencies, keyed on pyproject.toml only (torch is most of the image).
COPY Makefile pyproject.toml ./
COPY scripts/list-dependencies.py scripts/
RUN make venv VENV=/opt/textgen \
    && python3 scripts/list-dependencies.py pyproject.toml > /tmp/requirements.txt \
    && /opt/textgen/bin/pip install --no-cache-dir -r /tmp/requirements.txt

# 3. textgen itself: the README's install command, into the same virtual environment. The
#    context has no .git, so the commit for textgen_build_info comes as a build argument:
#    docker build --build-arg TEXTGEN_GIT_SHA=$(git rev-parse HEAD) ...
COPY . .
ARG TEXTGEN_GIT_SHA=unknown
RUN make install VENV=/opt/textgen

FROM ${CUDA_RUNTIME_IMAGE} AS runtime
ENV DEBIAN_FRONTEND=noninteractive
# python3 runs the launcher and the shards; gcc and the Python headers let Triton compile its
# GPU launcher stubs at run time. Unpinned for the reason given in the builder stage.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates gcc libc6-dev python3 python3-dev \
    && rm -rf /var/lib/apt/lists/*
# Ubuntu 24.04 images ship a user `ubuntu` with uid 1000: textgen takes that uid instead.
RUN if id ubuntu >/dev/null 2>&1; then userdel --remove ubuntu; fi \
    && useradd --create-home --uid 1000 --user-group textgen \
    && mkdir -p /data \
    && chown textgen:textgen /data
COPY --from=builder /opt/textgen /opt/textgen

# TGI's conventions: every launcher flag also reads its SCREAMING_SNAKE env twin (MODEL_ID,
# NUM_SHARD, MAX_TOTAL_TOKENS, ...), HF_TOKEN authenticates Hub downloads, the Hub cache
# lives in the /data volume and the server listens on port 80. Docker sets HOSTNAME (the
# --hostname env twin) to the container id unless the image sets it: listen everywhere.
ENV PATH=/opt/textgen/bin:$PATH \
    HF_HOME=/data \
    HOSTNAME=0.0.0.0 \
    PORT=80 \
    PYTHONUNBUFFERED=1 \
    TRITON_CACHE_DIR=/data/triton
VOLUME /data
EXPOSE 80
# Numeric, so Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 1000:1000
WORKDIR /home/textgen
ENTRYPOINT ["textgen-launcher"]
