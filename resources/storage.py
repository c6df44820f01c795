"""The warehouse resource: where the Parquet tables and DuckDB views live (FLYWHEEL_DATA_DIR)."""

from outcome_flywheel.storage import Warehouse
from resources.settings import DataclassResource, env_or_default, mirrored


class WarehouseResource(DataclassResource[Warehouse]):
    """Parquet files per table and partition under `$FLYWHEEL_DATA_DIR/warehouse`, DuckDB views over them."""

    plain = Warehouse
    data_dir: str = mirrored(Warehouse, "data_dir")
    lock_wait_s: float = mirrored(Warehouse, "lock_wait_s")

    @classmethod
    def from_env(cls) -> "WarehouseResource":
        return cls(data_dir=env_or_default("FLYWHEEL_DATA_DIR"))
