"""`sparkctl watch`: a long-running supervisor of one cluster.

desired.py   what should run (the ledger's active deployment, a replicated one, or "down") and a check of it
supervisor.py  observe -> decide -> act through deploy's door (`door.deployed(...).restart`, `Deployer.rollback`):
             a TP group restarts as a group, in order, gated; backoff; a crash loop rolls back and stops acting
metrics.py   Prometheus metrics (the `watch` extra: prometheus_client), node memory and GPU sensors
notify.py    a bounded, secret-free webhook POST for restarts and give-ups
systemd.py   the unit `sparkctl watch --install` writes
"""
