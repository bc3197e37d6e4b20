"""How the gfal2 driver reads a gsiftp:// error, without a server: GridFTP's reply 530
(not logged in) and a GSS failure are a refused login; the same digits inside the
request's URL are not (a whole-suite run over every door, 11.2.5, 2026-11-29: the run
folder ``storagescale-run-20261129-190434-fa2a5304e2b7f216`` made the conformance
check's missing file, ENOENT, a 'login refused', and test_missing_file_error[gsiftp]
failed)."""

from __future__ import annotations

import errno

import pytest

gfal2_driver = pytest.importorskip("pytest_storagescale.drivers.gfal2")
gfal2 = pytest.importorskip("gfal2")

RUN = "/storagescale/storagescale-run-20261129-190434-fa2a5304e2b7f216"


def _error(message: str, code: int):
    driver = gfal2_driver.Gfal2Driver(
        gfal2_driver.Gfal2Driver.parse_endpoint("gsiftp://localhost:2811/storagescale"),
        writable_root="/storagescale", timeout=30)
    try:
        return driver._error(gfal2.GError(message, code), "read", f"{RUN}/never-written.dat")
    finally:
        driver.close()


def test_a_missing_file_under_a_path_holding_530_is_not_found():
    url = f"gsiftp://localhost:23761{RUN}/conformance/never-written.dat"
    error = _error(f"gridftp open error : No such file or directory on url {url}",
                   errno.ENOENT)
    assert isinstance(error, gfal2_driver.StorageNotFound), error
    assert error.error_class == "not_found"


@pytest.mark.parametrize("message", [
    "globus_ftp_client: the server responded with an error 530 530-Login incorrect. : "
    "globus_gss_assist: Error invoking callout",
    "the server responded with an error 530 Login incorrect.",
    "globus_gsi_gssapi: GSS Major Status: Authentication Failed",
])
def test_a_530_reply_or_a_gss_failure_is_a_refused_login(message):
    error = _error(message, errno.EACCES)
    assert isinstance(error, gfal2_driver.StoragePermissionDenied), error
    assert error.error_class == "auth" and "login refused by the server" in str(error)
