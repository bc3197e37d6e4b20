"""XRootD scalability suite (seed 003_b9e7cdb63bd75fe8.txt, CERN xrootd tests).

What the seed measured by hand, as steps whose concurrencies and rules come from
``thresholds/xrootd/<version>.toml``:

- namespace: ``stat`` and ``ls`` rates at each concurrency; and at offered rates (an
  open loop: requests at a fixed rate whatever the server does, response times from
  each request's intended start, so a stall is not hidden; docs/open-loop.md);
- small files: N clients writing 1 MB files (``put``), then reading them (``get``),
  as files/s with the transfer-time distribution (mean, p50, p99 in the results);
- mixed: readers and writers at once, each side's throughput reported;
- authentications/s: a new connection and login per operation (``auth``) with the
  session's security protocol: ``pytest suites/xrootd --storage-embedded-login krb5``
  (or ``gsi``, ``token``; ``unix`` by default) runs that protocol's scan, the other
  three are skipped with the option that runs them.

Run it against your server::

    pytest suites/xrootd --storage-endpoint root://host:1094//store/test/storagescale
"""

from __future__ import annotations

import zlib

import pytest

pytestmark = pytest.mark.storagescale_system("xrootd")


def test_round_trip_with_checksum(storage_client, storage_test_dir):
    """A 1 MB file written and read back is intact, and the server's adler32 agrees."""
    data = bytes(range(256)) * 4096
    path = f"{storage_test_dir}/round-trip.dat"
    assert storage_client.put(path, data) == len(data)
    assert storage_client.stat(path).size == len(data)
    assert storage_client.read(path, 0, len(data)) == data
    assert storage_client.checksum(path, "adler32") == f"{zlib.adler32(data):08x}"


@pytest.mark.storagescale_op("stat")
def test_stat_scan(storage_load, storage_clients):
    """stat of one file, back to back, by each client."""
    storage_load.run()


@pytest.mark.storagescale_op("ls")
def test_ls_scan(storage_load, storage_clients):
    """Listing of a small directory, back to back, by each client."""
    storage_load.run()


@pytest.mark.storagescale_op("stat_open")
def test_stat_open_loop(storage_load, storage_arrival_rate):
    """stat requests arriving at the offered rate whatever the server does: achieved
    rate, dropped requests, response times from each request's intended start."""
    storage_load.run()


@pytest.mark.storagescale_op("ls_open")
def test_ls_open_loop(storage_load, storage_arrival_rate):
    """Listings of a small directory arriving at the offered rate (open loop)."""
    storage_load.run()


@pytest.mark.storagescale_op("put")
def test_small_file_writes(storage_load, storage_clients):
    """N clients writing new 1 MB files: files/s and transfer times (seed: writerate.jpg)."""
    storage_load.run()


@pytest.mark.storagescale_op("get")
def test_small_file_reads(storage_load, storage_clients):
    """N clients reading 1 MB files: files/s and transfer times (seed: readratex.jpg)."""
    storage_load.run()


@pytest.mark.storagescale_op("mixed")
def test_mixed_readers_and_writers(storage_load, storage_clients):
    """Readers and writers at once; each side's throughput (seed: read-write-rw-xrootd.jpg)."""
    storage_load.run()


# -- authentication rates (seed 003, Test Series 3 and 4, "Follow-up on Kerberos V") --------
def _auth_scan(login: str, storage_endpoint, storage_load) -> None:
    """Run the ``auth_<login>`` scan when the session's clients log in with ``login``."""
    driver = storage_load.door.spec.driver_class  # the door the steps use
    if not hasattr(driver, "new_login"):
        pytest.skip(
            f"authentication rates are XRootD logins: the {driver.name} driver of this "
            f"session's door cannot log in anew per operation; run the scan over root:// "
            f"(--storage-embedded-protocol root, or a root:// --storage-endpoint)")
    session = driver.session_login(storage_endpoint.driver_spec.options,
                                   embedded=storage_endpoint.embedded is not None)
    if session != login:
        how = (f"the session logs in with {session}" if session else
               "the session does not force a security protocol (the server picks it)")
        # one reason for every scan this session cannot run (its login is in the test's
        # name), so that pytest's -rs says them on one line with their count
        pytest.skip(
            f"an authentication-rate scan needs the login it measures (its name says "
            f"which) and {how}: run 'pytest suites/xrootd --storage-embedded-login LOGIN' "
            f"({', '.join(driver.login_protocols)}), or force it with --storage-driver-option "
            f"security_protocol={'|'.join(driver.login_protocols.values())} and its "
            f"credential")
    storage_load.run()


@pytest.mark.storagescale_op("auth_unix")
def test_auth_rate_unix(storage_load, storage_clients, storage_endpoint):
    """New connection + login + stat per operation, no strong authentication (seed:
    "0-copy-operation no auth", 8 x 40 files/s)."""
    _auth_scan("unix", storage_endpoint, storage_load)


@pytest.mark.storagescale_op("auth_krb5")
def test_auth_rate_krb5(storage_load, storage_clients, storage_endpoint):
    """Kerberos 5 authentications/s (seed: 25/s behind the replay-cache mutex, 280/s
    with a cache per process)."""
    _auth_scan("krb5", storage_endpoint, storage_load)


@pytest.mark.storagescale_op("auth_gsi")
def test_auth_rate_gsi(storage_load, storage_clients, storage_endpoint):
    """GSI (X.509 proxy) authentications/s (seed: 7/s for one client, 8/s for 8)."""
    _auth_scan("gsi", storage_endpoint, storage_load)


@pytest.mark.storagescale_op("auth_token")
def test_auth_rate_token(storage_load, storage_clients, storage_endpoint):
    """Bearer-token (ztn over TLS) authentications/s (not in the seed)."""
    _auth_scan("token", storage_endpoint, storage_load)
