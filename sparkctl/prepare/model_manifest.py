#!/usr/bin/env python3
"""Checksum manifest of one model directory, written next to it (``<dir>.sha256``, ``sha256sum -c`` format).

Runs ON a node (standard library only): ``python3 model_manifest.py DIR [--no-write]``. The playbooks copy
this file to the node; preflight runs it as ``python3 -c <this source> DIR``. A manifest is reused while
nothing under DIR (files or directories, by ctime: a rename or deletion changes its directory's, and ctime
cannot be set back) is newer than the manifest; otherwise it is recomputed and rewritten atomically.
Prints one JSON line: ``{"status": "cached"|"computed"|"missing", "manifest": PATH, "files": {relpath:
sha256}}``; ``--no-write`` (check mode, facts) computes a stale manifest without writing it. rsync's
partial directory (``.rsync-partial``) is ignored.
"""
import hashlib
import json
import os
import sys

SKIP = ".rsync-partial"


def newer_than(root, stamp):
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d != SKIP]
        for name in [dirpath, *(os.path.join(dirpath, f) for f in filenames)]:
            if os.lstat(name).st_ctime > stamp:
                return True
    return False


def compute(root):
    files = {}
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != SKIP)
        for name in sorted(filenames):
            path = os.path.join(dirpath, name)
            if not os.path.isfile(path) or os.path.islink(path):
                continue
            h = hashlib.sha256()
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    h.update(block)
            files[os.path.relpath(path, root)] = h.hexdigest()
    return files


def read(manifest):
    files = {}
    with open(manifest) as f:
        for line in f:
            digest, _, rel = line.rstrip("\n").partition("  ")
            if rel:
                files[rel] = digest
    return files


def main(argv):
    write = "--no-write" not in argv
    root = os.path.abspath(next(a for a in argv if a != "--no-write")).rstrip("/")
    manifest = root + ".sha256"
    if not os.path.isdir(root):
        return {"status": "missing", "manifest": manifest, "files": {}}
    if os.path.exists(manifest) and not newer_than(root, os.stat(manifest).st_ctime):
        return {"status": "cached", "manifest": manifest, "files": read(manifest)}
    files = compute(root)
    if not write:
        return {"status": "computed", "manifest": manifest, "files": files}
    tmp = f"{manifest}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        f.writelines(f"{digest}  {rel}\n" for rel, digest in sorted(files.items()))
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, manifest)     # standalone on the node: sparkctl.statefiles.replace_durably's steps, inline
    dfd = os.open(os.path.dirname(manifest) or ".", os.O_RDONLY)
    try:
        os.fsync(dfd)
    except OSError:
        pass                      # a file system that cannot fsync a directory: the rename is done
    finally:
        os.close(dfd)
    return {"status": "computed", "manifest": manifest, "files": files}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1:]), sort_keys=True))
