"""sparkctl's engine emulator: the only stand-in in the project (it replaces the GPU engine), in two dialects.

SGLang: ``python -m sparkctl.sim <launch_server argv>`` or ``sparkctl.sim.engine.main(argv)``.
vLLM: ``python -m sparkctl.sim serve MODEL <vllm serve flags>`` or ``sparkctl.sim.vllm_engine.main(argv)``.
See ``sparkctl/sim/README.md`` for behaviour and knobs.
"""
