"""`make serve` / `flywheel-serve`: the review service on FLYWHEEL_API_HOST:FLYWHEEL_API_PORT
(127.0.0.1:8765 unless told otherwise).

    flywheel-serve [--host HOST] [--port PORT]

Without FLYWHEEL_API_TOKEN it makes a token and prints it, with the page to paste it into (a token
never goes in a URL, and the access log redacts one that does).
"""

from __future__ import annotations

import argparse
import copy
import logging
import re
import sys

from outcome_flywheel.settings import PROJECT_ROOT, validate_environment

# The service launches the code location's jobs (pipelines/, assets/, resources/ at the project
# root): the same working directory `dagster dev -w workspace.yaml` gives the code location.
if str(PROJECT_ROOT) not in sys.path:
    sys.path.insert(0, str(PROJECT_ROOT))


TOKEN_IN_QUERY = re.compile(r"(?i)(\b(?:token|access_token)=)[^&\s]*")


class RedactTokens(logging.Filter):
    """uvicorn's access log names each request's path and query: a `token=` in it is written `token=<hidden>`."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(TOKEN_IN_QUERY.sub(r"\1<hidden>", a) if isinstance(a, str) else a for a in record.args)
        return True


def log_config() -> dict:
    """uvicorn's logging, with tokens redacted from the access log."""
    from uvicorn.config import LOGGING_CONFIG

    config = copy.deepcopy(LOGGING_CONFIG)
    config.setdefault("filters", {})["redact_tokens"] = {"()": RedactTokens}
    config["handlers"]["access"]["filters"] = ["redact_tokens"]
    return config


def banner(config) -> str:
    lines = [f"outcome-flywheel service on http://{config.host}:{config.port}  (API schema: /openapi.json)"]
    if config.token_generated:
        lines.append(f"  token (FLYWHEEL_API_TOKEN unset, made for this start): {config.token}")
        lines.append(f"  review pages: sign in at http://{config.host}:{config.port}/login by pasting it")
    else:
        lines.append("  token: FLYWHEEL_API_TOKEN")
    if not config.is_loopback:
        lines.append(
            f"  WARNING: bound to {config.host}, not loopback: anyone who can reach this address can read the pages"
        )
    return "\n".join(lines)


def start_in_thread(state, port: int = 0):
    """The service on `state` in a daemon thread of this process, on `state.config.host` and `port`
    (0: a free one), for the browser test and the tests: (uvicorn server, base URL)."""
    import threading
    import time

    import uvicorn

    from service.app import create_app

    server = uvicorn.Server(
        uvicorn.Config(
            create_app(state), host=state.config.host, port=port, log_level="warning", log_config=log_config()
        )
    )
    threading.Thread(target=server.run, daemon=True).start()
    deadline = time.time() + 30
    while not server.started:
        if time.time() > deadline:
            raise RuntimeError("the service did not start in 30 s")
        time.sleep(0.05)
    host, bound_port = server.servers[0].sockets[0].getsockname()[:2]
    return server, f"http://{host}:{bound_port}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="flywheel-serve", description="The outcome flywheel's review pages and REST API."
    )
    parser.add_argument("--host", default=None, help="default FLYWHEEL_API_HOST (127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="default FLYWHEEL_API_PORT (8765)")
    args = parser.parse_args(argv)
    validate_environment()
    import warnings

    import dagster as dg
    import uvicorn

    # Dagster's notes that an API the definitions use is beta say nothing to the person starting the service.
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)

    from service.app import create_app
    from service.config import ServiceConfig
    from service.state import ServiceState

    config = ServiceConfig.from_env()
    config.host = args.host or config.host
    config.port = args.port or config.port
    app = create_app(ServiceState.from_env(config))
    print(banner(config), flush=True)
    uvicorn.run(app, host=config.host, port=config.port, log_level="info", log_config=log_config())
    return 0


if __name__ == "__main__":
    sys.exit(main())
