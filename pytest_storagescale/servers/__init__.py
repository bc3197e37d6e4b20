"""The embedded servers the session starts on loopback when no ``--storage-endpoint`` is
given: one module per kind (``xrootd``, ``ceph``, ``cephfs``, ``xcache``, ``apache``,
``gridftp``, ``redirector``, ``dcache`` with its PostgreSQL cluster ``postgres``), their
family and registry (:mod:`.family`), the releases they run (:mod:`.xrootd_releases`,
:mod:`.tarballs`, :mod:`.site_paths`), the process groups, loopback and orphan cleaner
(:mod:`.processes`, :mod:`.loopback`, :mod:`.orphans`), the plumbing of hosts that
are network namespaces (:mod:`.netns`), one server started alone
(:mod:`.serve`), and the throwaway CA, KDC and token issuer (:mod:`.credentials`). The
servers' side of a step (summary monitoring, process sampling) serves remote storage
too: it is :mod:`pytest_storagescale.load.server_monitor`, which imports nothing of
this package. The drivers, the engine and the settings (``config.py``) never import
this package (the import contracts in pyproject.toml), but for one declared exception:
the gfal2 driver's dcap movers preload :mod:`.loopback` (``drivers/dcap_mover.py``)."""
