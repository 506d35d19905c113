"""The argument parser of every `rayeval` command line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any, NoReturn


class Parser(argparse.ArgumentParser):
    """argparse with usage errors in rayeval's one-paragraph style: what is wrong, then where the fix is.
    A flag is matched only by its whole name (`--temp` is not taken for `--temperature`: a flag added later
    would change what an abbreviation meant)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"rayeval: error: {message}. `{self.prog} --help` lists every flag and its values.\n")

    def parse_args(self, args: Sequence[str] | None = None, namespace: Any = None) -> argparse.Namespace:  # type: ignore[override]
        """As argparse's, but flags no command takes are named with the command's help, not the top one."""
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            # the innermost command's help lists its flags (`rayeval jobs logs --help`)
            words = [getattr(parsed, name, None) for name in ("command", "action")]
            where = " ".join([self.prog, *(w for w in words if isinstance(w, str))])
            self.exit(
                2,
                f"rayeval: error: unrecognized arguments: {' '.join(extras)}. `{where} --help` lists every flag "
                "and its values.\n",
            )
        return parsed
