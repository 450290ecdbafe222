"""``python -m sparkctl.sim <SGLang launch_server argv>``: run the SGLang engine emulator."""
import sys

from sparkctl.sim.engine import main

sys.exit(main())
