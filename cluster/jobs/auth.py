"""Ray's token authentication, on the side that connects to a cluster.

A cluster started by `ray start --head` with Ray's current release requires a token, and Ray's clients send it
only when `RAY_AUTH_MODE=token` is set in the connecting process, even where the token is at hand. rayeval sets
that mode when it finds a token where Ray looks for one, so `rayeval submit`, `rayeval jobs` and
`--address ray://...` work without the variable; an explicit `RAY_AUTH_MODE` is always left as it is.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"

TOKEN_HELP = (
    "The cluster requires its authentication token: copy the head node's ~/.ray/auth_token to this machine "
    f"(same path), or point {TOKEN_PATH_ENV} at a copy, or export {TOKEN_ENV}=<token>. `ray get-auth-token` on "
    "the head prints it."
)


def default_token_path() -> Path:
    return Path.home() / ".ray" / "auth_token"


def token_source() -> str | None:
    """Where Ray would read this process's token from, in Ray's order, or None when there is none."""
    if os.environ.get(TOKEN_ENV, "").strip():
        return f"${TOKEN_ENV}"
    given = os.environ.get(TOKEN_PATH_ENV)
    if given:
        return given if Path(given).is_file() else None
    path = default_token_path()
    return str(path) if path.is_file() else None


def read_token() -> str | None:
    """This process's copy of the cluster's token, read where Ray reads it; None when there is none."""
    value = os.environ.get(TOKEN_ENV, "").strip()
    if value:
        return value
    source = token_source()
    if source is None:
        return None
    try:
        return Path(source).read_text().strip() or None
    except OSError:
        return None


def enable_token_auth() -> str | None:
    """Turn on token mode for this process (and the Ray clients it starts) when a token is available and
    the mode is not set; returns where the token is, or None when none was found or the mode was set."""
    if MODE_ENV in os.environ:
        return None
    source = token_source()
    if source is not None:
        os.environ[MODE_ENV] = "token"
        _refresh_ray_config()
    return source


def _refresh_ray_config() -> None:
    """Ray reads the mode into its config once, when it is imported; where it is already loaded, read it again
    (what Ray's own token set-up calls after setting the variable)."""
    raylet = sys.modules.get("ray._raylet")
    if raylet is not None:
        raylet.Config.initialize("")
