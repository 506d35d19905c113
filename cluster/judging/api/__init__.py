"""Judge APIs: Ray actors that call an OpenAI-compatible API under one cluster-wide rate limiter
(`rate_limiter.RateLimiter`: the judge rate limit lives there), with bounded retries, failure reasons and
API keys that never leave the driver unredacted. `settings` is plain Python; `client` runs the actors.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "ApiJudgeSettings": "settings",
    "FailureReason": "settings",
    "is_transient": "settings",
    "read_api_key": "settings",
    "redact": "settings",
    "ApiJudgeActor": "client",
    "ApiJudgePool": "client",
    "ApiJudgeStats": "client",
    "start_api_judges": "client",
    "classify": "client",
    "check_response": "client",
    "retry_after_s": "client",
    "backoff_s": "client",
    "parse_messages": "client",
    "chat_arguments": "client",
    "AttemptFailure": "client",
    "BadResponse": "client",
    "RateLimiter": "rate_limiter",
    "LimiterCore": "rate_limiter",
    "LimiterStats": "rate_limiter",
}
__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
