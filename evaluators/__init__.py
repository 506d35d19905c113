"""Task definitions, dataset loading, rule scorers, mean@N statistics and reports.

Plain Python: nothing here imports ray or vllm, so a scorer author never touches the cluster.
"""
