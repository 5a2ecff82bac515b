"""Serving side of fa4-tune: the results database (``service.db``) and, later, the REST API."""
