"""The `rayeval` command: a parser whose `run` flags come from the config's fields, and one thin module per
command that builds a config, calls the API and prints."""

from cluster.cli.app import build_parser, entry, main

__all__ = ["build_parser", "entry", "main"]
