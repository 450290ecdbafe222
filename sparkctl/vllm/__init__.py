"""vLLM as sparkctl's second engine: its flag dialect per version (dialects/<version>.json, generated from vLLM's
own `vllm serve` parser), its rendering of a profile, its log lines and metric names (issue 34)."""
