"""The watcher's page-cache drop (sparkctl/watch/caches.py), judged on what the helper, sudo and the shell really
printed on a test-cluster node (Debian bookworm rootfs, sudo 1.9, over SSH): granted and dropped, not granted (no
helper as root; sudo refusing a user without the rule), granted but unable to write. The real runs, with prepare's
grant and without it, are in tests/cluster/test_cluster_watch.py."""
from __future__ import annotations

from pathlib import Path

from sparkctl.config.inventory import load_inventory
from sparkctl.nodes.ssh import CommandResult
from sparkctl.watch.caches import HELPER, Dropped, drop_argv, drop_caches, parse_drop, summary

REPO = Path(__file__).resolve().parents[2]


def _res(rc: int, out: str = "", err: str = "") -> CommandResult:
    return CommandResult("spark-b", [HELPER], rc, out, err, 0.1)


DROPPED = _res(0, "cached_kb_before=6290552 cached_kb_after=490292\n")
ROOT_NO_HELPER = _res(127, err="bash: /usr/local/sbin/sparkctl-drop-caches: No such file or directory\n")
SUDO_NO_HELPER = _res(1, err="sudo: /usr/local/sbin/sparkctl-drop-caches: command not found\n")
SUDO_NO_RULE = _res(1, err="sudo: a password is required\n")
CANNOT_WRITE = _res(1, err="sparkctl-drop-caches: cannot write /proc/sys/vm/drop_caches (not root, or /proc/sys "
                           "read-only here)\n")


def test_the_helpers_answers_are_sorted_into_dropped_not_granted_and_failed():
    d = parse_drop("spark-b", DROPPED)
    assert (d.granted, d.done, d.cached_before_kb, d.cached_after_kb) == (True, True, 6290552, 490292)
    assert d.line() == "spark-b: dropped (Cached 6.0 GiB -> 0.5 GiB)"
    for res in (ROOT_NO_HELPER, SUDO_NO_HELPER, SUDO_NO_RULE):
        d = parse_drop("spark-b", res)
        assert not d.granted and not d.done and d.detail == res.stderr.strip(), d
    d = parse_drop("spark-b", CANNOT_WRITE)
    assert d.granted and not d.done and d.line().startswith("spark-b: failed (sparkctl-drop-caches: cannot write")


def test_the_command_is_the_helper_as_root_and_sudo_without_a_prompt_otherwise():
    inv = load_inventory(REPO / "inventory" / "sparks.example.yml")
    node = inv.nodes[0]
    want = [HELPER] if node.ssh.user == "root" else ["sudo", "-n", HELPER]
    assert drop_argv(node) == want
    as_root = node.model_copy(update={"ssh": node.ssh.model_copy(update={"user": "root"})})
    assert drop_argv(as_root) == [HELPER]
    other = node.model_copy(update={"ssh": node.ssh.model_copy(update={"user": "deploy"})})
    assert drop_argv(other) == ["sudo", "-n", HELPER]


def test_the_summary_says_what_was_dropped_where_and_how_to_grant_the_rest():
    line = summary([parse_drop("spark-a", DROPPED), parse_drop("spark-b", SUDO_NO_RULE)])
    assert line.startswith("dropped the page cache before the restart (granted by `sparkctl prepare`): "
                           "spark-a: dropped (Cached 6.0 GiB -> 0.5 GiB)")
    assert "page cache not dropped on spark-b: not granted (spark-b: sudo: a password is required)" in line
    assert "`prepare_drop_caches: true` in the inventory and `sparkctl prepare --tags drop-caches` grant it" in line
    assert summary([Dropped("spark-a", True, False, "sparkctl-drop-caches: cannot write")]) == \
        "could not drop the page cache: spark-a: failed (sparkctl-drop-caches: cannot write)"


def test_the_embedded_cluster_is_never_touched(local_cluster):
    results = drop_caches(load_inventory(local_cluster))
    assert results and all(not d.granted and not d.done and d.detail.startswith("embedded cluster") for d in results)
    assert summary(results) == "page cache left alone (embedded cluster: nothing is dropped on this machine)"


def test_nodes_that_accept_and_never_answer_cost_one_deadline_outside_the_lock(tmp_path, state_dir):
    """A node action of the watcher (the page-cache drop, the metrics' node reads) against SSH nodes whose server
    accepts the connection and never says a word: each ends within the watcher's total deadline, says so, and a
    second one does not start while the first still hangs."""
    import io
    import socket
    import time

    import yaml

    from sparkctl.config.inventory import load_inventory
    from sparkctl.deploy.progress import Reporter
    from sparkctl.watch.supervisor import Watcher, WatchOptions

    silent = socket.create_server(("127.0.0.1", 0))          # accepts (the kernel's backlog), never answers
    port = silent.getsockname()[1]
    hosts = {f"spark-{c}": {"ansible_host": "127.0.0.1", "ansible_port": port, "sparkctl_rank": i,
                            "fabric_interface": "lo", "fabric_address": f"127.0.0.{i + 2}"}
             for i, c in enumerate("ab")}
    inv = tmp_path / "sparks.yml"
    inv.write_text(yaml.safe_dump({"all": {"vars": {"sparkctl_cluster": "silent", "ansible_user": "spark"},
                                           "children": {"sparks": {"hosts": hosts}}}}))
    out = io.StringIO()
    w = Watcher(load_inventory(inv), Reporter(out, live=False), WatchOptions(node_deadline_s=1.0))
    try:
        t0 = time.monotonic()
        w.nodes.drop_caches()
        took = time.monotonic() - t0
        assert took < 2.5, took
        assert "page cache not dropped: the nodes did not answer within 1s" in out.getvalue(), out.getvalue()
        t0 = time.monotonic()
        w.nodes.drop_caches()                       # the first drop still hangs on its SSH connect: not a second one
        assert time.monotonic() - t0 < 0.5
        assert not w.c.ledger.root.joinpath("lock.holder").exists()      # no lock was taken for any of it
    finally:
        silent.close()
