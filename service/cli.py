"""fa4-serve: run the results service with uvicorn.

    fa4-serve --db sqlite:///results.db --host 127.0.0.1 --port 8000
    FA4_API_TOKEN=... fa4-serve --db postgresql+psycopg://user@host/fa4   # writes enabled
"""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="fa4-serve", description="REST API over the fa4-tune results database.")
    p.add_argument("--db", default=None,
                   help="SQLAlchemy URL or SQLite file path (default: $FA4_DB, else the user data dir)")
    p.add_argument("--host", default="127.0.0.1", help="interface to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    p.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    p.add_argument("--no-access-log", action="store_true", help="do not log every request")
    p.add_argument("--demo", action="store_true",
                   help="serve the recorded H200 measurements (service/seed) from a temporary SQLite file")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"fa4-serve: port {args.port} is out of range", file=sys.stderr)
        return 2
    import os

    import uvicorn

    from store import ResultsStore

    if args.demo:
        if args.db:
            print("fa4-serve: --demo serves its own temporary database; drop --db", file=sys.stderr)
            return 2
        from service.demo import temporary_demo_db

        args.db = temporary_demo_db()
        print(f"fa4-serve: demo data in {args.db}; dashboard at http://{args.host}:{args.port}/", file=sys.stderr)

    # Open (and migrate) once up front, so a bad URL or unreachable server is a one-line
    # error here instead of a failing first request.
    try:
        ResultsStore.open(args.db).close()
    except Exception as e:
        print(f"fa4-serve: cannot open the results database: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    if args.db:
        # Worker processes build their own app from the factory; they read the URL from here.
        os.environ["FA4_DB"] = args.db
    uvicorn.run(
        "service.app:app_from_env",
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        log_level=args.log_level,
        access_log=not args.no_access_log,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
