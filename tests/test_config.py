"""Option value parsers: accepted and rejected inputs."""

from __future__ import annotations

import pytest

from pytest_storagescale.config import (
    parse_choice,
    parse_clients,
    parse_driver_options,
    parse_scale,
)
from pytest_storagescale.errors import StorageScaleUsageError
from pytest_storagescale.units import parse_byte_size, parse_duration


@pytest.mark.parametrize(
    "text, seconds",
    [("10s", 10), ("5m", 300), ("1h", 3600), ("500ms", 0.5), ("2.5", 2.5), (7, 7), (" 3 s ", 3)],
)
def test_duration_accepted(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "ten", "10x", "-5s", "0s", "5 minutes"])
def test_duration_rejected_names_value_and_units(text):
    with pytest.raises(StorageScaleUsageError) as info:
        parse_duration(text, what="--storage-duration")
    message = str(info.value)
    assert "--storage-duration" in message and repr(text) in message
    assert "10s" in message


def test_clients_accepted():
    assert parse_clients("5, 50,200") == (5, 50, 200)


@pytest.mark.parametrize("text", ["", "a,b", "5,-1", "0", "5;50"])
def test_clients_rejected(text):
    with pytest.raises(StorageScaleUsageError, match="positive whole numbers"):
        parse_clients(text)


def test_choice_lists_valid_values():
    assert parse_choice("Threads", ("threads", "processes"), what="--storage-executor") == "threads"
    with pytest.raises(StorageScaleUsageError, match="'fibers'.*threads, processes"):
        parse_choice("fibers", ("threads", "processes"), what="--storage-executor")


@pytest.mark.parametrize(
    "text, size", [("1MB", 10**6), ("10MiB", 10 * 2**20), ("4k", 4000), (0, 0), ("512", 512)]
)
def test_byte_size(text, size):
    assert parse_byte_size(text) == size


def test_byte_size_rejected():
    with pytest.raises(StorageScaleUsageError, match="not a size"):
        parse_byte_size("big")


@pytest.mark.parametrize("text, scale", [("0.05", 0.05), ("5%", 0.05), ("1", 1.0), (0.5, 0.5)])
def test_plan_scale(text, scale):
    assert parse_scale(text) == pytest.approx(scale)


@pytest.mark.parametrize("text", ["0", "1.5", "-0.1", "half", "nan", "150%"])
def test_bad_plan_scale(text):
    with pytest.raises(StorageScaleUsageError, match="is not a plan scale"):
        parse_scale(text)


def test_driver_options_from_flags_and_ini_lines():
    assert parse_driver_options(["token=abc=", "x509_proxy=/tmp/x509up_u0"]) == {
        "token": "abc=", "x509_proxy": "/tmp/x509up_u0"}
    assert parse_driver_options("# a comment\n ca_dir = /etc/grid \n\n") == {"ca_dir": "/etc/grid"}
    for bad in (["token"], ["=x"], ["a b=c"]):
        with pytest.raises(StorageScaleUsageError, match="is not key=value"):
            parse_driver_options(bad)


def test_header_never_shows_credentials_or_url_passwords():
    from pytest_storagescale.config import Setting, Settings

    options = {"token": "s3cr3t", "ca_dir": "/x", "sig": "0xfeed", "my_password": "pw",
               "x509_proxy": "/tmp/x509up_u1", "latency": "0.1"}
    settings = Settings.from_values({
        "storage_driver_options": Setting(options, "--storage-driver-option"),
        "storage_endpoint": Setting("davs://alice:hunter2@door:2880/pnfs/area", "ini storage_endpoint"),
        "storage_embedded": Setting("webdav", "the suite's conftest"),
    })
    # the driver in use says "sig" is a secret of its own
    text = "\n".join(settings.header_lines(secret_options=("sig",)))
    assert "s3cr3t" not in text and "hunter2" not in text and "0xfeed" not in text
    # paths and settings are no secrets (a proxy's path is shown, never its contents)
    assert ("storage_driver_options: token=***, ca_dir=/x, sig=***, my_password=***, "
            "x509_proxy=/tmp/x509up_u1, latency=0.1 (from --storage-driver-option)") in text
    assert "davs://door:2880/pnfs/area" in text
    assert "storage_embedded" not in text  # the endpoint is given: no embedded server


def test_header_shows_defaults_only_when_verbose():
    from pytest_storagescale.config import Setting, Settings

    settings = Settings.from_values({"storage_version": Setting("1.0", "--storage-version"),
                                     "storage_embedded": Setting("xrootd", "default"),
                                     "storage_duration": Setting(None, "default")})

    def given(lines):  # the thresholds folder chosen is said in any case
        return [line for line in lines if not line.startswith("storage_thresholds:")]

    assert given(settings.header_lines()) == ["storage_version: 1.0 (from --storage-version)"]
    assert given(settings.header_lines(verbose=True)) == [
        "storage_version: 1.0 (from --storage-version)", "storage_executor: auto (from default)",
        "storage_client_cpu_limit: 0.9 (from default)",
        "storage_embedded: xrootd (from default)",  # no endpoint: the embedded server runs
        "storage_embedded_hosts: 1 (from default)",
        "storage_embedded_login: unix (from default)", "storage_driver: auto (from default)",
        "storage_scale: 1.0 (from default)"]


def test_settings_have_one_typed_field_per_option_with_its_default():
    """Settings is a frozen dataclass whose fields are the options (OPTIONS drives the
    command line, the ini keys and the docs): each field's default is the option's, a
    read of an unknown name is an AttributeError (no __getattr__: mypy sees every read)."""
    import dataclasses

    from pytest_storagescale.config import OPTIONS, Settings

    defaults = Settings()
    assert {f"storage_{f.name}" for f in dataclasses.fields(Settings)} - set(OPTIONS) == {
        "storage_invocation_path", "storage_sources"}
    for name, (_, _, default, _) in OPTIONS.items():
        assert getattr(defaults, name.removeprefix("storage_")) == default, name
    assert "__getattr__" not in vars(Settings)
    with pytest.raises(AttributeError):
        _ = defaults.no_such_option  # type: ignore[attr-defined]
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.endpoint = "root://elsewhere//x"  # type: ignore[misc]
    changed = defaults.with_value("embedded", "ceph", "the suite's conftest")
    assert (changed.embedded, changed.source("embedded"), defaults.embedded) == (
        "ceph", "the suite's conftest", None)
