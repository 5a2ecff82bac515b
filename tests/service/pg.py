"""A throw-away PostgreSQL server for the storage and service tests (Debian's postgresql package).

    python3 tests/service/pg.py start /tmp/fa4pg     # prints a SQLAlchemy URL; export it as FA4_TEST_PG_URL
    python3 tests/service/pg.py stop /tmp/fa4pg

or let the test session do it: ``FA4_TEST_PG=auto python3 -m pytest tests/service`` starts one
server per session (per xdist worker), runs every ``db_url`` test on SQLite and PostgreSQL, and
stops it at the end. PostgreSQL refuses to run as root; as root the server runs as the
``postgres`` system user that the package creates.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path


def _bin(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    # Debian keeps the server binaries off PATH, under /usr/lib/postgresql/<major>/bin.
    hits = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if not hits:
        raise RuntimeError(f"{name} not found: install PostgreSQL (apt-get install postgresql)")
    return hits[-1]


def available() -> bool:
    try:
        _bin("initdb")
        _bin("pg_ctl")
    except RuntimeError:
        return False
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(argv: list[str], as_postgres: bool) -> None:
    if as_postgres:
        argv = ["su", "postgres", "-s", "/bin/sh", "-c", " ".join(f"'{a}'" for a in argv)]
    r = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed:\n{r.stdout}\n{r.stderr}")


def start(root: str | Path) -> str:
    """Create a cluster under ``root``, start it on a free loopback port, return its URL."""
    root = Path(root).resolve()
    root.mkdir(parents=True, exist_ok=True)
    as_postgres = os.geteuid() == 0
    if as_postgres:
        shutil.chown(root, "postgres", "postgres")
    data, port = root / "data", _free_port()
    _run([_bin("initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"], as_postgres)
    opts = f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off"
    _run([_bin("pg_ctl"), "-D", str(data), "-o", opts, "-l", str(root / "server.log"), "-w", "start"], as_postgres)
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    deadline = time.monotonic() + 30
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return url
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL did not start; see {root / 'server.log'}")
            time.sleep(0.2)


def stop(root: str | Path) -> None:
    data = Path(root).resolve() / "data"
    if data.exists():
        _run([_bin("pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"], os.geteuid() == 0)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("start", "stop"):
        sys.exit("usage: pg.py start|stop DIR")
    if sys.argv[1] == "start":
        print(start(sys.argv[2]))
    else:
        stop(sys.argv[2])
