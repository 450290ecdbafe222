"""``python -m sparkctl.sim <SGLang launch_server argv>``: the SGLang engine emulator;
``python -m sparkctl.sim serve MODEL <vLLM argv>``: its vLLM dialect (``vllm serve ...``; SGLang's argv never starts
with a bare word)."""
import sys

if sys.argv[1:2] == ["serve"]:
    from sparkctl.sim.vllm_engine import main as vllm_main
    sys.exit(vllm_main(sys.argv[2:]))

from sparkctl.sim.engine import main  # noqa: E402 - the SGLang dialect, as before

sys.exit(main())
