"""`python -m cluster.cli ...`: the same as the `rayeval` command."""

from cluster.cli.front import entry

raise SystemExit(entry())
