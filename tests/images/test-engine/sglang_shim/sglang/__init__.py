"""Test-image shim standing in for SGLang: `sglang.launch_server` runs the sparkctl emulator.

Never installed outside the sparkctl test images (tests/images/).
"""
SPARKCTL_SHIM = True
