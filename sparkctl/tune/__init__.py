"""`sparkctl tune`: grid search over launch flags, each trial a full deploy + bench, confirmed A B A B (run.py)."""
