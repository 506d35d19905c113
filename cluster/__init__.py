"""Everything that touches Ray or vLLM: engine actors, the replica pool, the coordinator and the CLI.

Modules import ray and vllm lazily where they can, so `rayeval --help`, `validate` and `--dry-run` stay fast.
"""
