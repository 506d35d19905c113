"""Request scheduling for rayeval: dispatch, ordering, retries and the result store.

Plain Python and asyncio only: nothing here imports ray or vllm, so every piece tests with plain async
callables in milliseconds.
"""
