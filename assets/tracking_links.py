"""The MLflow record's links as Dagster metadata: the run's URL clickable, its ids and any failure as text."""

import dagster as dg


def link_metadata(links: dict) -> dict:
    return {k: dg.MetadataValue.url(v) if k == "mlflow_run_url" else v for k, v in links.items()}
