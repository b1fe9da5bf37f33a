"""A throwaway PostgreSQL cluster for the tests and the benchmarks (scripts.bench.service
--ledger postgresql): initdb into a temp dir, pg_ctl on a free loopback port with a private
socket dir. PostgreSQL refuses to run as root, so as root the server binaries run as the
``postgres`` user (runuser) on a directory it owns. Development tooling: the server never uses it."""

from __future__ import annotations

import glob
import itertools
import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path


def free_port() -> int:
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pg_bin() -> Path | None:
    """The newest /usr/lib/postgresql/<version>/bin holding initdb and pg_ctl, or None."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(found[-1]).parent if found else None


@dataclass
class Cluster:
    bin: Path
    data: Path
    port: int
    listen: str = "127.0.0.1"  # listen_addresses (comma-separated)
    shared_buffers: str = "32MB"  # small for the tests' many clusters; benchmarks use PostgreSQL's default
    _names = itertools.count()

    def _run(self, *cmd: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        return subprocess.run(_as_postgres(cmd), check=check, capture_output=True, text=True, timeout=60)

    def spawn(self, program: str, *args: str) -> subprocess.Popen[str]:
        """One of the cluster's programs (e.g. ``pgbench``) in the background, as ``postgres`` when
        root; its output, stdout and stderr together, is the Popen's ``stdout``."""
        return subprocess.Popen(
            _as_postgres((str(self.bin / program), *args)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )

    def postmaster_pid(self) -> int:
        return int((self.data / "db" / "postmaster.pid").read_text().split()[0])

    def url(self, db: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{db}"

    def start(self, attempts: int = 3) -> None:
        """Starts the postmaster and waits for it. On a loaded host a restart right after a crash
        can find the old postmaster's socket or lock not yet released, or outlast the wait: tried
        again, then refused with the server log's last lines."""
        opts = (
            f"-p {self.port} -k {self.data / 'sock'} -c listen_addresses={self.listen} -c synchronous_commit=on "
            f"-c max_connections=200 -c shared_buffers={self.shared_buffers}"
        )
        cmd = ("pg_ctl", "start", "-w", "-t", "60", "-D", str(self.data / "db"), "-l", str(self.data / "log"))
        for attempt in range(attempts):
            done = self._run(str(self.bin / cmd[0]), *cmd[1:], "-o", opts, check=False)
            if done.returncode == 0:
                return
            if attempt + 1 < attempts:
                self.stop("fast")  # a postmaster that came up after pg_ctl gave up
                time.sleep(1.0)
        log = (self.data / "log").read_text(errors="replace").splitlines()[-8:] if (self.data / "log").exists() else []
        raise RuntimeError(f"PostgreSQL did not start on port {self.port}: {done.stderr.strip()}\n" + "\n".join(log))

    def stop(self, mode: str = "fast") -> None:
        self._run(str(self.bin / "pg_ctl"), "stop", "-w", "-D", str(self.data / "db"), "-m", mode, check=False)

    def trust(self, cidr: str) -> None:
        """Lets clients from ``cidr`` log in (call before ``start``): replicas on other hosts."""
        with open(self.data / "db" / "pg_hba.conf", "a") as f:
            f.write(f"host all all {cidr} trust\n")

    def password_role(self, role: str, password: str) -> None:
        """A login role that must give ``password`` (scram-sha-256) however it connects; every
        other role keeps trust. The rule goes first in pg_hba.conf (the first match wins)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(
                sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), sql.Literal(password))
            )
            hba = self.data / "db" / "pg_hba.conf"
            hba.write_text(f"host all {role} all scram-sha-256\nlocal all {role} scram-sha-256\n" + hba.read_text())
            conn.execute("SELECT pg_reload_conf()")

    def new_database(self) -> str:
        """A fresh, empty database; its URL."""
        import psycopg

        name = f"t{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


def _as_postgres(cmd: tuple[str, ...]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *cmd] if os.geteuid() == 0 else list(cmd)


def start_cluster(listen: str = "127.0.0.1", trust: tuple[str, ...] = (), shared_buffers: str = "32MB") -> Cluster:
    binaries = pg_bin()
    assert binaries is not None
    data = Path(tempfile.mkdtemp(prefix="recsvc-pg-"))
    (data / "sock").mkdir()
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
        shutil.chown(data / "sock", "postgres", "postgres")
    cluster = Cluster(binaries, data, free_port(), listen, shared_buffers)
    cluster._run(
        str(binaries / "initdb"),
        "-D",
        str(data / "db"),
        "-U",
        "postgres",
        "-A",
        "trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C",
    )
    for cidr in trust:
        cluster.trust(cidr)
    cluster.start()
    return cluster


def remove_cluster(cluster: Cluster) -> None:
    cluster.stop("immediate")
    shutil.rmtree(cluster.data, ignore_errors=True)
