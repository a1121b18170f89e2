"""A throwaway PostgreSQL server for the scale-out tests (a session fixture; import it into a test module).

``initdb`` and ``pg_ctl`` run as user ``postgres`` (initdb refuses root) in a fresh temporary directory, on a
free loopback port, with the socket in that directory; the server is stopped and the directory removed at
the end of the session. The binaries come from ``/usr/lib/postgresql/<version>/bin`` (Debian; installed in
CI by ``.ci/services/postgres.sh``) or ``PATH``; without them the tests skip and say why.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["postgres_url", "pg_bindir"]


def pg_bindir() -> Path | None:
    """The newest PostgreSQL bin directory that has initdb and pg_ctl."""
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin"),
        key=lambda p: int(Path(p).parent.name) if Path(p).parent.name.isdigit() else 0,
    )
    candidates = [Path(p) for p in reversed(found)]
    if shutil.which("initdb"):
        candidates.append(Path(shutil.which("initdb")).parent)  # type: ignore[arg-type]
    return next((d for d in candidates if (d / "initdb").exists() and (d / "pg_ctl").exists()), None)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres() -> tuple[list[str], int | None]:
    """The command prefix that runs a binary as user postgres (root), or nothing (already a normal user)."""
    if os.geteuid() != 0:
        return [], None
    try:
        uid = pwd.getpwnam("postgres").pw_uid
    except KeyError:
        pytest.skip("running as root and there is no 'postgres' user for initdb (it refuses root)")
    return ["runuser", "-u", "postgres", "--"], uid


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    bindir = pg_bindir()
    if bindir is None:
        pytest.skip(
            "PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/initdb nor initdb on PATH); "
            "apt-get install -y postgresql, or run .ci/services/postgres.sh"
        )
    psycopg2 = pytest.importorskip("psycopg2", reason="psycopg2-binary is not installed")
    prefix, uid = _as_postgres()
    root = Path(tempfile.mkdtemp(prefix="autotune-pg-"))
    if uid is not None:
        os.chown(root, uid, -1)
    data = root / "data"
    subprocess.run(
        [
            *prefix,
            str(bindir / "initdb"),
            "-D",
            str(data),
            "-U",
            "postgres",
            "--auth=trust",
            "--no-sync",
            "-E",
            "UTF8",
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
    port = _start(prefix, bindir, root, data)
    try:
        conn = psycopg2.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres")
        conn.autocommit = True
        conn.cursor().execute("CREATE DATABASE autotune")
        conn.close()
        yield f"postgresql+psycopg2://postgres@127.0.0.1:{port}/autotune"
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
            capture_output=True,
            timeout=60,
        )
        shutil.rmtree(root, ignore_errors=True)


def _start(prefix: list[str], bindir: Path, root: Path, data: Path) -> int:
    """Start on a free port (another free one if something took it meanwhile); the port."""
    for _ in range(3):
        port = _free_port()
        opts = f"-c listen_addresses=127.0.0.1 -p {port} -k {root} -c fsync=off -c max_connections=200"
        done = subprocess.run(
            [
                *prefix,
                str(bindir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                opts,
                "-l",
                str(root / "server.log"),
                "-w",
                "-t",
                "60",
                "start",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode == 0:
            return port
    log = (root / "server.log").read_text(errors="replace")[-2000:] if (root / "server.log").exists() else ""
    pytest.fail(f"PostgreSQL did not start: {done.stderr.strip()}\n{log}")
