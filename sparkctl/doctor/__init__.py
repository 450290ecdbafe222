"""`sparkctl doctor`: known SGLang / NCCL / GB10 failure signatures (catalogue.py, as data), matched in what a
failed deployment left (collect.py: rank logs, failure, journal, preflight facts, kernel logs) or in files the
user names (match.py: typed findings with bounded, escaped evidence), and a redacted support bundle (bundle.py).

`up` cites the doctor's finding in its failure message (deploy/boot.py, deploy/apply.py: `match.finding_lines`).
"""
