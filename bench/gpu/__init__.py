"""rayeval on real GPUs: replica scaling, tensor parallel and orchestration overhead.

One package does the whole GPU measurement, one workload per call on a lent GPU machine (1 to 8 GPUs). Run
it from the project root (or with the root on PYTHONPATH):

    python -m bench.gpu --workload A --out $OUT   # random ~1.1B Llama, 2048 x 256 random tokens in, 256 out:
                                                  # vllm.LLM.generate on 1 GPU and on 2 (two processes),
                                                  # rayeval 1 replica, 2 replicas, 1 x TP=2
    python -m bench.gpu --workload B --out $OUT   # SmolLM2-135M-Instruct, IFEval 541 prompts x 8 samples:
                                                  # rayeval 2 replicas and 1 replica, through cluster.api.evaluate;
                                                  # Ray-call cost alone; 2 replicas with vLLM's engine stats
    python -m bench.gpu --workload all --out $OUT # both, one after the other (more than one 10-minute call)
    python -m bench.gpu --workload A --configs rayeval-1,rayeval-2 --out $OUT   # a chosen subset, in that order
    python -m bench.gpu --workload A --configs rayeval-1-vs-vllm,rayeval-2-vs-1,vllm-2-vs-1 --repeats 3 --out $OUT
                                                  # the three A comparisons as paired, interleaved turns
    python -m bench.gpu --workload B --configs ifeval-2-vs-1 --repeats 2 --out $OUT   # B's scaling, paired
    python -m bench.gpu --workload A --configs rayeval-1-vs-vllm,rayeval-2-vs-1 --repeats 9 --budget-s 550 --out $OUT
                                                  # up to 9 pairs each, as many as fit in 550 s for the call
    python -m bench.gpu --workload A --configs rayeval-4-vs-1,layout-2x2-vs-1x4,layout-2x2-vs-4x1 --repeats 3 --out $OUT
                                                  # four GPUs: 4 replicas against 1, 2 replicas of TP=2 against
                                                  # 1 of TP=4 and against 4 of TP=1 (bench.gpu.layouts)
    python -m bench.gpu --workload B --configs ifeval-4-vs-1 --repeats 2 --out $OUT   # B: 4 replicas against 1

Every configuration runs in its own process (`--config NAME` is what the driver calls), one after the other,
so none shares an engine, a Ray session or GPU memory with another. Each writes one JSON line; the driver
collects them into $OUT/<workload>.json and every process's output into $OUT/<workload>.log. While a
configuration runs, the (otherwise idle) driver samples every process's CPU time from /proc, and each row
gets `cpu_during_generation`: the busiest processes over the generation window, in cores (and how much of
it in the kernel), and `host_cpu_during_generation`: the logical CPUs' busy, kernel, interrupt and steal time
from /proc/stat (steal: time the hypervisor ran something else on a vCPU that wanted to run) and the softirqs
and interrupts per second of the most interrupted one. Before the first
configuration, `bench/host_probe.py` measures whether the host slows two replicas' engine cores when both
run (a Python loop on their vCPUs, tiny kernel launches on the two GPUs; about 30 s), in $OUT/<workload>.json.

Workload A is the same work everywhere: token-id prompts (no tokenisation), greedy, `ignore_eos`, 256
output tokens each, same engine settings (bf16, max_model_len 1024, max_num_seqs 256, prefix caching on,
CUDA graphs on). rayeval goes through its real request runner, dispatcher and engine actors
(`cluster.run.runner.RequestRunner`, what `cluster.api.evaluate` uses underneath), with no result store.
Generation time excludes engine start for all (the clock starts when the engines are up).

The `-vs-` configurations compare two ways of generating in turns on engines that stay up (bench/paired.py):
on these hosts a vCPU's speed drifts by up to 2x within seconds, so configurations run minutes apart differ
by the host as much as by what they do; pairs of turns seconds apart, in ABBA order, give a ratio per pair.

`rayeval-1-vs-vllm` runs on one GPU as on several: with two or more visible (CUDA_VISIBLE_DEVICES, else
`nvidia-smi -L`) each side has a GPU of its own, on one the sides share it with half its memory each, started
one after the other; the row's `gpus` and `gpu_memory_utilization` say which. `vllm-2` and `vllm-2-vs-1`
compare one GPU with two and refuse fewer.

The modules, by job: `settings` (the environment variables every process reads, and how the driver starts a
configuration's process), `placement` (the GPU and memory share of each side of a paired configuration),
`workloads` (the random model, A's prompts and requests, B's run configuration),
`configurations` (what each `--config NAME` runs), `layouts` (replica counts and tensor-parallel layouts
against each other), `turns` (rayeval's runner for a pass, and the sides of a paired configuration as
processes taking turns), `rows` (the JSON row each configuration prints),
`samplers` (CPU and GPU use sampled by the driver while a configuration runs) and `driver` (the command line,
the child processes, the call's time budget, the ratios and the files written).
"""
