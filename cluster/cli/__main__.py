"""`python -m cluster.cli ...`: the same as the `rayeval` command."""

from cluster.cli.app import entry

raise SystemExit(entry())
