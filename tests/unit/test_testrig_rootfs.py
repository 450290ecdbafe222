"""testrig.rootfs finds a node root's overlay by its upper directory, wherever the mount point moved to: `down` of a
session pytest stopped (its directory since renamed to garbage-*) unmounts every node root it made."""
from __future__ import annotations

from testrig.rootfs import overlays_with_upper

# /proc/self/mountinfo lines as the kernel writes them (fields: id, parent, dev, root, mount point, options,
# optional fields, "-", fstype, source, super options); the first two are node roots of a stopped session whose
# directory pytest renamed after the mount
MOUNTINFO = """\
31 1 0:26 / / rw,relatime - ext4 /dev/vda rw
812 31 0:91 / /tmp/pytest-of-root/garbage-4d2e/popen-gw1/cluster0/spark-a/root rw,relatime shared:402 - overlay \
overlay rw,lowerdir=/root/.cache/sparkctl/node-rootfs/lower-3f2,upperdir=/tmp/pytest-of-root/pytest-37/popen-gw1/\
cluster0/spark-a/rootfs-upper,workdir=/tmp/pytest-of-root/pytest-37/popen-gw1/cluster0/spark-a/rootfs-work
813 31 0:92 / /tmp/pytest-of-root/garbage-4d2e/popen-gw1/cluster0/spark-b/root rw,relatime shared:403 - overlay \
overlay rw,lowerdir=/root/.cache/sparkctl/node-rootfs/lower-3f2,upperdir=/tmp/pytest-of-root/pytest-37/popen-gw1/\
cluster0/spark-b/rootfs-upper,workdir=/tmp/pytest-of-root/pytest-37/popen-gw1/cluster0/spark-b/rootfs-work
900 31 0:95 / /var/lib/docker/overlay2/abc/merged rw - overlay overlay rw,lowerdir=/x,upperdir=/var/lib/up,workdir=/w
901 31 0:96 / /with\\040space/root rw - overlay overlay rw,lowerdir=/x,upperdir=/s/rootfs-upper,workdir=/s/w
"""


def test_a_node_root_is_found_by_its_upper_directory_after_its_workdir_was_renamed() -> None:
    upper = "/tmp/pytest-of-root/pytest-37/popen-gw1/cluster0/spark-b/rootfs-upper"
    assert overlays_with_upper(upper, MOUNTINFO) == [
        "/tmp/pytest-of-root/garbage-4d2e/popen-gw1/cluster0/spark-b/root"]


def test_only_that_upper_directory_matches_and_escaped_spaces_are_read() -> None:
    assert overlays_with_upper("/tmp/pytest-of-root/pytest-37/popen-gw1/cluster0/spark-c/rootfs-upper",
                               MOUNTINFO) == []
    assert overlays_with_upper("/tmp/pytest-of-root/pytest-37/popen-gw1/cluster0", MOUNTINFO) == []   # no prefix
    assert overlays_with_upper("/s/rootfs-upper", MOUNTINFO) == ["/with space/root"]
    assert overlays_with_upper("/var/lib/up", "garbage line\n\n") == []
