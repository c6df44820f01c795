"""The MLflow tracking server of `make up` (docs/tracking.md, docs/deploy.md).

`mlflow server` on 127.0.0.1:`FLYWHEEL_MLFLOW_PORT` (5050), its runs and registered models in the production
PostgreSQL, in a database of its own (`mlflow`, owned by the instance's `dagster` role; the password reaches it
as PGPASSWORD, never on its command line). It serves the artifacts itself (`--artifacts-destination`): on the
S3-compatible store when the warehouse is there (`s3://<bucket>/<the warehouse prefix's parent>/mlflow-artifacts`,
with FLYWHEEL_S3_ENDPOINT as MLFLOW_S3_ENDPOINT_URL and the deployment's AWS_* credentials), else in
`<data dir>/mlflow/server-artifacts`. The code server, the daemon and the webserver (so every run worker and
step process) get FLYWHEEL_MLFLOW_TRACKING_URI=http://127.0.0.1:<port>, unless it is set when `make up` runs.
"""

from __future__ import annotations

import urllib.request
from pathlib import Path
from typing import Mapping

from outcome_flywheel.object_store import is_s3_url, split_s3_url

NAME = "mlflow"  # the piece's name: its pid file, its log
DATABASE = "mlflow"  # its own database in the production cluster
ARTIFACTS = "mlflow-artifacts"  # beside the warehouse's prefix on S3
LOCAL_ARTIFACTS = ("mlflow", "server-artifacts")  # under the data dir otherwise (the embedded store keeps artifacts/)
WORKERS = 2  # uvicorn workers; MLflow's default (4) is a lot of memory for a training machine


def artifacts_destination(data_dir: Path, environ: Mapping[str, str]) -> str:
    """Where the server keeps the artifacts: beside an s3:// warehouse, else under the data dir."""
    url = environ.get("FLYWHEEL_WAREHOUSE_URL") or ""
    if is_s3_url(url):
        bucket, prefix = split_s3_url(url)
        parent = prefix.strip("/").rpartition("/")[0]
        return f"s3://{bucket}/{parent + '/' if parent else ''}{ARTIFACTS}"
    return str(data_dir.joinpath(*LOCAL_ARTIFACTS))


def backend_store_uri(user: str, host: str, port: int) -> str:
    """The server's store: the `mlflow` database, through psycopg2 (SQLAlchemy 2.1 takes a bare postgresql:// for
    psycopg 3, which is not installed). No password in it: the server reads PGPASSWORD."""
    return f"postgresql+psycopg2://{user}@{host}:{port}/{DATABASE}"


def command(bin_dir: Path, store_uri: str, destination: str, host: str, port: int) -> list[str]:
    return [
        str(bin_dir / "mlflow"),
        "server",
        "--backend-store-uri",
        store_uri,
        "--artifacts-destination",
        destination,
        "--host",
        host,
        "--port",
        str(port),
        "--workers",
        str(WORKERS),
    ]


def environment(base: Mapping[str, str], password: str) -> dict[str, str]:
    """The deployment's environment plus what the server needs: the database password, the S3 endpoint for boto3
    (FLYWHEEL_S3_ENDPOINT; AWS when empty) and its region (AWS_REGION as AWS_DEFAULT_REGION), no job runner."""
    env = {**base, "PGPASSWORD": password, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
    if base.get("FLYWHEEL_S3_ENDPOINT"):
        env["MLFLOW_S3_ENDPOINT_URL"] = base["FLYWHEEL_S3_ENDPOINT"]
    if base.get("AWS_REGION") and not base.get("AWS_DEFAULT_REGION"):
        env["AWS_DEFAULT_REGION"] = base["AWS_REGION"]
    return env


def healthy(url: str) -> bool:
    """GET /health answers OK."""
    with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
        return response.status == 200 and response.read().strip() == b"OK"
