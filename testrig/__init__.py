"""Test doubles and test infrastructure shipped with sparkctl (like ``fabric.testing``).

``testrig.cluster.TestCluster``: a real two-node Spark cluster on one machine (network namespaces,
OpenSSH, Docker Engine), for integration tests. Imported lazily: nothing here loads at ``import sparkctl``.
"""
