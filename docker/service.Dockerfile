# The results service (fa4-serve): REST API over the results database.
#
#   docker build -f docker/service.Dockerfile -t fa4-service .          # from the repository root
#   docker run -p 127.0.0.1:8000:8000 -e FA4_API_TOKEN=... -e FA4_DB=postgresql+psycopg://... fa4-service
#
# Without FA4_DB the service keeps a SQLite file in the /data volume. Without FA4_API_TOKEN it is
# read-only (POST /v1/results answers 403).
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src
# torch is a dependency of the package (the kernels import it); the service never runs a kernel,
# so the CPU wheel keeps the image small. Pinned like CI.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY fa4 ./fa4
COPY store ./store
COPY providers ./providers
COPY tuner ./tuner
COPY service ./service
COPY dashboards ./dashboards
RUN pip install '.[serve]' && rm -rf /src

RUN useradd --create-home --uid 10001 fa4 && mkdir /data && chown fa4:fa4 /data
USER fa4
WORKDIR /home/fa4
VOLUME ["/data"]
ENV FA4_DB=sqlite:////data/results.db
EXPOSE 8000

HEALTHCHECK --interval=30s --timeout=3s --start-period=30s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2).status != 200)"]

# 0.0.0.0 inside the container; publish the port on the host's loopback unless it must be reachable.
CMD ["fa4-serve", "--host", "0.0.0.0", "--port", "8000"]
