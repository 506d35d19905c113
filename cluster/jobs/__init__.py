"""Ray Jobs: submitting a `rayeval` command to a cluster through Ray's Job Submission API, following it, and
the token authentication that Ray's clients need (`auth`, plain Python, also used by `cluster.session`).
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "auth": ("enable_token_auth", "token_source", "TOKEN_HELP"),
    "client": ("JobsClient", "JobSpec", "JobRow", "dashboard_address", "exit_code", "DEFAULT_DASHBOARD"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
