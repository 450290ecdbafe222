"""sparkctl: deploy SGLang across two DGX Sparks (GB10) with TP=2, and prove it works."""
__version__ = "0.1.0"
