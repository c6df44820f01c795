"""The people-facing service of the flywheel: a REST API (FastAPI) and server-rendered review pages
over the same logs, warehouse and Dagster instance the assets use.

It sits above `pipelines/` (it launches the code location's jobs), like `scripts/`:
`service.app.create_app` builds the app, `service.main` (`make serve`, the `flywheel-serve` console
script) runs it with uvicorn. docs/service.md describes the endpoints and pages.
"""
