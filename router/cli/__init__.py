"""The `tierroute` command line: one composition root (`main`) that puts every package's commands
together; `keys`, `ledger` and `report` hold the service's own command groups."""

from router.cli.main import main

__all__ = ["main"]
