"""LLM-as-judge tasks: judge prompts, verdict parsers and the statistics of judged samples (no Ray, no vLLM)."""
