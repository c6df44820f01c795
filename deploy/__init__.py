"""The production shape on one machine: PostgreSQL, a code server, `dagster-daemon`, `dagster-webserver`
and the review service, started by `make up` (deploy.up) and stopped by `make down` (deploy.down).
docs/deploy.md describes the shape, the instance file (deploy/dagster.yaml) and what was tested."""
