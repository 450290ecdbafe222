"""`sparkctl doctor`: the known SGLang / NCCL / GB10 failure signatures (sparkctl/sglang/signatures.py, as data;
matched by sparkctl/sglang/findings.py into typed findings with bounded, escaped evidence) looked for in what a
failed deployment left (collect.py: rank logs, failure, journal, preflight facts, kernel logs) or in files the
user names (run.py), and a redacted support bundle (bundle.py).

The catalogue and its matching sit in sglang/, below deploy/: `up` cites a finding in its failure message
(deploy/boot.py, deploy/apply.py: `findings.finding_lines`), and the doctor reads deployments through deploy/.
"""
