"""Judge APIs: Ray actors that call an OpenAI-compatible API under one cluster-wide rate limiter
(`rate_limiter.RateLimiter`: the judge rate limit lives there), with bounded retries, failure reasons and
API keys that never leave the driver unredacted. `settings` is plain Python; `client` runs the actors.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "settings": ("ApiJudgeSettings", "FailureReason", "is_transient", "read_api_key", "redact"),
    "client": (
        "ApiJudgeActor",
        "ApiJudgePool",
        "ApiJudgeStats",
        "start_api_judges",
        "classify",
        "check_response",
        "retry_after_s",
        "backoff_s",
        "parse_messages",
        "chat_arguments",
        "AttemptFailure",
        "BadResponse",
    ),
    "rate_limiter": ("RateLimiter", "LimiterCore", "LimiterStats"),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
