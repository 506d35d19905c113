"""`python -m bench.gpu ...`: the GPU benchmark's command line (bench.gpu.driver)."""

from bench.gpu.driver import main

main()
