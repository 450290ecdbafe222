"""sparkctl bench: the measurement card (decode ON/OFF, acceptance, TTFT, concurrency, G6) from one command.

Library entry points are in ``sparkctl.bench.run`` (``bench``, ``bench_deployment``, ``bench_endpoint``, ``bench_log``);
see ``sparkctl/bench/README.md``. Nothing heavy is imported here so ``sparkctl --help`` stays instant.
"""
