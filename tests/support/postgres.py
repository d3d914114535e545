"""A throwaway PostgreSQL server on a free loopback port, from Debian's
packages (``/usr/lib/postgresql/15/bin``, not on PATH; ``make install``
installs them). ``initdb`` and ``postgres`` refuse root, so both run as the
``postgres`` user on a directory chowned to it; durability is off (fsync,
synchronous commit, full-page writes): a test's data dies with the run.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from tests.support.mesh import POLL, READY_TIMEOUT, _free_port

BIN = Path("/usr/lib/postgresql/15/bin")
USER = "postgres"


class PostgresServer:
    def __init__(self) -> None:
        if not (BIN / "postgres").exists():
            raise RuntimeError(f"{BIN}/postgres is installed by `make install` (system-deps)")
        account = pwd.getpwnam(USER)
        # Under /tmp, not pytest's tmp_path: the postgres user must reach it
        # (pytest's directories are root's alone).
        self.root = Path(tempfile.mkdtemp(prefix="turnmesh-pg-"))
        os.chown(self.root, account.pw_uid, account.pw_gid)
        self.data = self.root / "data"
        self.log_path = self.root / "postgres.log"
        uid, gid = account.pw_uid, account.pw_gid
        subprocess.run(
            [
                str(BIN / "initdb"),
                "-D",
                str(self.data),
                "-A",
                "trust",
                "-U",
                USER,
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=self.root,
            user=uid,
            group=gid,
            extra_groups=[],
        )
        self._uid, self._gid = uid, gid
        self.port = _free_port()
        self.start()

    def start(self) -> None:
        """Start the server on its data and port (again, after ``halt``),
        once it accepts connections."""
        with open(self.log_path, "ab") as log:
            # Started directly as the postgres user (Popen's user=), not
            # through runuser: its PID is the postmaster's, stopped by it.
            self.proc = subprocess.Popen(
                [
                    str(BIN / "postgres"),
                    "-D",
                    str(self.data),
                    "-k",
                    str(self.root),
                    "-p",
                    str(self.port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.root,
                user=self._uid,
                group=self._gid,
                extra_groups=[],
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while not self._accepts():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"postgres did not start: {self.log_path.read_text()}")
            time.sleep(POLL)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{USER}@127.0.0.1:{self.port}/{database}"

    def database(self, name: str) -> str:
        """A new, empty database (dropped first if a run before left it): its URL."""
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _accepts(self) -> bool:
        try:
            with psycopg.connect(self.url(), connect_timeout=1):
                return True
        except psycopg.OperationalError:
            return False

    def halt(self) -> None:
        """Stop the server, keeping its data (``start`` brings it back)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # fast shutdown
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        self.halt()
        shutil.rmtree(self.root, ignore_errors=True)


def emptied(url: str) -> str:
    """The database at ``url`` with every table of the store emptied (its
    schema stays): a test starts on no one else's rows. Its URL."""
    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT quote_ident(tablename) FROM pg_tables"
            " WHERE schemaname = 'public' AND tablename <> 'turnmesh_schema'"
        ).fetchall()
        if rows:
            conn.execute(f"TRUNCATE {', '.join(row[0] for row in rows)}".encode())
    return url
