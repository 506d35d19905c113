"""OpenAI-compatible API clients, for API judges and for a model under test behind an endpoint: Ray actors
that call the API under one cluster-wide rate limiter (`rate_limiter.RateLimiter`), with bounded retries,
failure reasons and API keys that never leave the driver unredacted. `settings` is plain Python; `client`
runs the actors; `logprobs` reads log-likelihoods from a vLLM server's prompt logprobs and probes for them.
"""

from cluster._lazy import lazy_exports

_EXPORTS = {
    "settings": (
        "ApiSettings",
        "ApiUser",
        "NO_KEY",
        "FailureReason",
        "is_transient",
        "read_api_key",
        "redact",
    ),
    "client": (
        "ApiClientActor",
        "ApiClientPool",
        "ApiStats",
        "start_api_clients",
        "classify",
        "check_response",
        "retry_after_s",
        "backoff_s",
        "parse_messages",
        "chat_arguments",
        "completion_arguments",
        "scored_continuation",
        "AttemptFailure",
        "BadResponse",
    ),
    "rate_limiter": ("RateLimiter", "LimiterCore", "LimiterStats"),
    "logprobs": (
        "prompt_logprobs_problem",
        "loglikelihood_arguments",
        "read_prompt_logprobs",
        "continuation_from_choice",
        "NoPromptLogprobs",
    ),
}
__getattr__, __dir__, __all__ = lazy_exports(__name__, _EXPORTS)
