# A GPU tuner worker (fa4-tune): CUDA, PyTorch, the CuTe DSL, and the reference FA4 as a peer.
#
#   docker build -f docker/tuner.Dockerfile -t fa4-tuner .              # from the repository root
#   docker run --gpus 1 -e FA4_DB=postgresql+psycopg://... fa4-tuner --seqlen 8192 --hdim 128
#
# Needs the NVIDIA container toolkit on the host. The devel image brings ptxas/nvdisasm, which the
# CuTe DSL compile path and the codegen checks use.
FROM nvidia/cuda:12.8.1-cudnn-devel-ubuntu24.04

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev \
    && rm -rf /var/lib/apt/lists/*
# A venv: Ubuntu 24.04's system Python refuses pip installs (PEP 668).
RUN python3 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH

RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128

WORKDIR /src
COPY pyproject.toml README.md ./
COPY fa4 ./fa4
COPY store ./store
COPY providers ./providers
COPY tuner ./tuner
COPY service ./service
COPY dashboards ./dashboards
RUN pip install '.[ref]' && rm -rf /src

RUN useradd --create-home --uid 10001 tuner && mkdir /data && chown tuner:tuner /data
USER tuner
WORKDIR /home/tuner
VOLUME ["/data"]
# Results default to a SQLite file in /data; point FA4_DB at the shared PostgreSQL in a fleet.
ENV FA4_DB=sqlite:////data/results.db

ENTRYPOINT ["fa4-tune"]
CMD ["--seqlen", "8192", "--hdim", "128"]
