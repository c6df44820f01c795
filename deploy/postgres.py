"""PostgreSQL for the production instance: Debian's `postgresql` binaries (installed with apt-get when
missing), one cluster under the data dir, listening on 127.0.0.1 only, its unix socket inside the
cluster's folder (mode 0700), a `dagster` role and database. Started and stopped with `pg_ctl`.

`initdb` refuses to run as root, so when `make up` runs as root the cluster belongs to the
`postgres` system user the Debian package creates, and every server command runs as that user.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

SERVER_OS_USER = "postgres"  # the system user of Debian's package; used only when running as root
SUPERUSER = "postgres"  # the cluster's superuser: local socket only (trust), never over TCP
SEARCH = ("/usr/lib/postgresql/*/bin", "/usr/local/pgsql/bin")


class PostgresError(RuntimeError):
    """PostgreSQL could not be installed, initialised or started; the message says why and what to do."""


def server_user_problem() -> str | None:
    """Why PostgreSQL cannot run here as `make up` runs it, or None: as root it needs the `postgres` user."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam(SERVER_OS_USER)
    except KeyError:
        return (
            f"running as root, PostgreSQL needs the `{SERVER_OS_USER}` system user (initdb refuses root); Debian's "
            "postgresql package creates it: install the package, or run `make up` as a normal user"
        )
    return (
        None
        if shutil.which("runuser")
        else "running as root, PostgreSQL is started through `runuser`, which is missing"
    )


def find_binaries() -> Path | None:
    """The folder holding initdb and pg_ctl: PATH first, then Debian's versioned folders (newest)."""
    found = shutil.which("initdb")
    if found and shutil.which("pg_ctl"):
        return Path(os.path.realpath(found)).parent
    candidates = [
        p
        for pattern in SEARCH
        for p in Path("/").glob(pattern.lstrip("/"))
        if (p / "initdb").exists() and (p / "pg_ctl").exists()
    ]

    def version(p: Path) -> tuple:
        return tuple(int(x) if x.isdigit() else 0 for x in p.parent.name.split("."))

    return max(candidates, key=version) if candidates else None


def ensure_installed() -> Path:
    """The binaries' folder, installing Debian's `postgresql` package first when there are none."""
    found = find_binaries()
    if found:
        return found
    if not shutil.which("apt-get"):
        raise PostgresError(
            "PostgreSQL is not installed and this machine has no apt-get: install PostgreSQL (15 or later; "
            "initdb and pg_ctl on PATH), then run `make up` again"
        )
    sudo = [] if os.geteuid() == 0 else ["sudo"]
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    print("PostgreSQL not found: installing Debian's postgresql package", flush=True)
    if subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "postgresql"], env=env).returncode != 0:
        subprocess.run(sudo + ["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(sudo + ["apt-get", "install", "-y", "-q", "postgresql"], env=env, check=True)
    found = find_binaries()
    if not found:
        raise PostgresError(
            "apt-get installed postgresql but no initdb/pg_ctl was found under /usr/lib/postgresql/*/bin"
        )
    return found


@dataclass
class Cluster:
    """One PostgreSQL cluster in `data_dir`, served on 127.0.0.1:`port`."""

    data_dir: Path
    port: int
    bin_dir: Path

    @property
    def as_root(self) -> bool:
        return os.geteuid() == 0

    def _server_command(self, *args: str) -> list[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        return ["runuser", "-u", SERVER_OS_USER, "--", *command] if self.as_root else command

    @property
    def log_file(self) -> Path:
        return self.data_dir / "server.log"  # inside the cluster: the server's user can write there

    @property
    def initialised(self) -> bool:
        return (self.data_dir / "PG_VERSION").exists()

    def init(self) -> None:
        if self.initialised:
            return
        problem = server_user_problem()
        if problem:
            raise PostgresError(problem)
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.data_dir.chmod(0o700)
        if self.as_root:
            shutil.chown(self.data_dir, SERVER_OS_USER, SERVER_OS_USER)
            if (
                subprocess.run(["runuser", "-u", SERVER_OS_USER, "--", "test", "-w", str(self.data_dir)]).returncode
                != 0
            ):
                raise PostgresError(
                    f"PostgreSQL runs as the `{SERVER_OS_USER}` user here (initdb refuses root) and cannot reach "
                    f"{self.data_dir}: make its parent folders traversable (chmod o+x) or set FLYWHEEL_PG_DIR "
                    "to a folder it can reach"
                )
        result = subprocess.run(
            self._server_command(
                "initdb",
                "-D",
                str(self.data_dir),
                f"--username={SUPERUSER}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--locale=C",
            ),
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            raise PostgresError(f"initdb failed in {self.data_dir}:\n{result.stdout}{result.stderr}")

    def running(self) -> bool:
        return (
            self.initialised
            and subprocess.run(
                self._server_command("pg_ctl", "-D", str(self.data_dir), "status"), capture_output=True
            ).returncode
            == 0
        )

    def postmaster_pid(self) -> int | None:
        try:
            return int((self.data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
        except (FileNotFoundError, ValueError):
            return None

    def start(self, timeout_s: int = 120) -> None:
        # Loopback only, the socket inside the cluster's folder (0700): nothing else on the machine reaches it.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories='{self.data_dir}' "
            "-c unix_socket_permissions=0700"
        )
        result = subprocess.run(
            self._server_command(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-l",
                str(self.log_file),
                "-w",
                "-t",
                str(timeout_s),
                "-o",
                options,
                "start",
            ),
            capture_output=True,
            text=True,
        )
        if result.returncode != 0:
            tail = self.log_file.read_text(errors="replace")[-2000:] if self.log_file.exists() else ""
            raise PostgresError(f"pg_ctl start failed (port {self.port}):\n{result.stdout}{result.stderr}\n{tail}")

    def stop(self, timeout_s: int = 60) -> str:
        result = subprocess.run(
            self._server_command("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "-t", str(timeout_s), "stop"),
            capture_output=True,
            text=True,
        )
        return (result.stdout + result.stderr).strip()

    def ready(self) -> bool:
        pg_isready = self.bin_dir / "pg_isready"
        command = [
            str(pg_isready) if pg_isready.exists() else "pg_isready",
            "-h",
            "127.0.0.1",
            "-p",
            str(self.port),
            "-q",
        ]
        return subprocess.run(command).returncode == 0

    def ensure_database(self, user: str, password: str, db_name: str) -> None:
        """Create (or update the password of) the login role and its database: idempotent."""
        import psycopg2

        conn = psycopg2.connect(host=str(self.data_dir), port=self.port, user=SUPERUSER, dbname="postgres")
        conn.autocommit = True  # CREATE DATABASE refuses to run inside a transaction
        try:
            with conn.cursor() as cur:
                cur.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (user,))
                verb = "ALTER" if cur.fetchone() else "CREATE"
                cur.execute(f'{verb} ROLE "{user}" WITH LOGIN PASSWORD %s', (password,))
                cur.execute("SELECT 1 FROM pg_database WHERE datname = %s", (db_name,))
                if not cur.fetchone():
                    cur.execute(f'CREATE DATABASE "{db_name}" OWNER "{user}"')
        finally:
            conn.close()
