"""Serving side of fa4-tune: the results database (``store``) and the REST API (``service.app``).

    fa4-serve --db sqlite:///results.db --host 127.0.0.1 --port 8000    # or python3 -m service.cli
    curl '127.0.0.1:8000/v1/configs/best?device=NVIDIA%20H200&head_dim=128&seqlen_q=8192'

Writes (POST /v1/results) need ``Authorization: Bearer $FA4_API_TOKEN``; without a
configured token the service is read-only. OpenAPI: /openapi.json, /docs.
"""
