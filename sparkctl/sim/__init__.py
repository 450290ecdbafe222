"""sparkctl's SGLang engine emulator: the only stand-in in the project (it replaces the GPU engine).

Run it as ``python -m sparkctl.sim <launch_server argv>`` or ``sparkctl.sim.engine.main(argv)``.
See ``sparkctl/sim/README.md`` and ``sparkctl.sim.engine`` for behaviour and knobs.
"""
