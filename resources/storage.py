"""The warehouse resource: where the Parquet tables live (FLYWHEEL_WAREHOUSE_URL: the data dir's
`warehouse/` folder, another folder, or s3://bucket/prefix with FLYWHEEL_S3_ENDPOINT), and the data
dir (FLYWHEEL_DATA_DIR) that keeps the DuckDB views, checkpoints, adapters and models."""

from outcome_flywheel.storage import Warehouse
from resources.settings import DataclassResource, env_or_default, mirrored


class WarehouseResource(DataclassResource[Warehouse]):
    """Parquet files per table and partition (`$FLYWHEEL_DATA_DIR/warehouse` or FLYWHEEL_WAREHOUSE_URL, a
    folder or an S3 bucket), DuckDB views over them in `$FLYWHEEL_DATA_DIR/warehouse.duckdb`."""

    plain = Warehouse
    variables = {"warehouse_url": "FLYWHEEL_WAREHOUSE_URL", "s3_endpoint": "FLYWHEEL_S3_ENDPOINT"}
    data_dir: str = mirrored(Warehouse, "data_dir")
    warehouse_url: str = mirrored(Warehouse, "warehouse_url")
    s3_endpoint: str = mirrored(Warehouse, "s3_endpoint")
    lock_wait_s: float = mirrored(Warehouse, "lock_wait_s")

    @classmethod
    def from_env(cls) -> "WarehouseResource":
        return cls(
            data_dir=env_or_default("FLYWHEEL_DATA_DIR"),
            warehouse_url=env_or_default("FLYWHEEL_WAREHOUSE_URL", ""),
            s3_endpoint=env_or_default("FLYWHEEL_S3_ENDPOINT", ""),
        )
