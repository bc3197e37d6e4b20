"""The embedded servers the session starts on loopback when no ``--storage-endpoint`` is
given: one module per kind (``xrootd``, ``ceph``, ``xcache``, ``apache``, ``gridftp``,
``redirector``), their family and registry (:mod:`.family`), the process group and
orphan cleaner (:mod:`.processes`, :mod:`.orphans`), and the throwaway CA, KDC and token
issuer (:mod:`.credentials`). The drivers never import this package."""
