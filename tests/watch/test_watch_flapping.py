"""Issue 31: a deployment that dies a few seconds after every successful restart was restarted forever, back to
back, with no backoff and no alert. Each such death now counts as a failed restart: backed off, counted in
`status`, and at --max-failures a crash loop (rollback, give-up, said everywhere)."""
from __future__ import annotations

import re

from testrig.watchrig import ledger_of, status, up, wait_until


def test_a_deployment_dying_after_every_restart_is_backed_off_then_given_up(cli, local_cluster, watcher,
                                                                           fault_profile):
    name, _ = fault_profile("flappy", {"crash_after_ready_s": 3.0})
    first = up(cli, name)["deployment"]
    run = watcher("--backoff", "1", "--backoff-max", "4")
    run.wait_for(r"gave up: crash loop: 3 failed restarts", timeout=180)
    err = run.stderr
    assert err.count("(flapping)") == 3, err
    # never back to back: each restart after a flap waited out its backoff (1 s, then 2 s)
    waits = [float(x) for x in re.findall(r"next attempt in ([0-9.]+)s \(\d of 3 failed", err)]
    assert waits[:2] == [1.0, 2.0], waits
    assert "rolled back to" in err and "(dflash-off)" in err, err[-3000:]
    code, st = status(cli)
    w = st["watcher"]
    assert w["flaps"] == 3 and w["failures"] >= 3 and w["gave_up"].startswith("crash loop"), w
    assert st["profile"] == "dflash-off" and st["active"] != first
    code, out, _ = cli("status")
    assert "3 died again within the window" in out and "watcher gave up: crash loop" in out
    log = (ledger_of(local_cluster).root / "watch.log").read_text()
    assert log.count("(flapping)") == 3
    restarts = w["restarts"]
    wait_until(lambda: status(cli)[1]["watcher"]["last_check"] != w["last_check"], "another check", 30)
    assert status(cli)[1]["watcher"]["restarts"] == restarts      # gave up: no more restarts
