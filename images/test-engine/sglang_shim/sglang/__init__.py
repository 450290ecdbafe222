"""Test-image shim standing in for SGLang: `sglang.launch_server` runs the sparkctl emulator.

Never installed outside the sparkctl test engine image (images/test-engine/).
"""
SPARKCTL_SHIM = True
