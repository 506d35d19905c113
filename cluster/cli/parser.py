"""The argument parser of every `rayeval` command line."""

from __future__ import annotations

import argparse
from typing import NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with usage errors in rayeval's one-paragraph style: what is wrong, then where the fix is."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rayeval: error: {message}. `{self.prog} --help` lists every flag and its values.\n")
