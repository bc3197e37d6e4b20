"""Operations: declared parameters, their kinds and scaling, and the operation registry
(registration, entry points, composites)."""

from __future__ import annotations

import re

import pytest

from pytest_storagescale.errors import StorageScaleUsageError, ThresholdsError
from pytest_storagescale.load import operations
from pytest_storagescale.load.operations import (
    Operation,
    Param,
    get_operation,
    operation_names,
    register_operation,
)
from pytest_storagescale.thresholds import load_thresholds

BUILT_IN = ("stat", "ls", "mkdir", "put", "get", "read", "readv", "delete", "write", "auth",
            "mixed", "ls_under_io")


@pytest.fixture(autouse=True)
def registry():
    """Each test's registrations are undone afterwards."""
    with operations.OPERATIONS.kept():
        operations.OPERATIONS.names()  # the installed entry points read before the test
        yield operations.OPERATIONS


class Copy(Operation):
    """A site's own operation (for the registry tests)."""

    name = "copy"
    parameters = {
        "file_size": Param("bytes", 1000),
        "hops": Param("count", 2),
        "verify": Param("flag", True),
        "mode": Param("choice", "fast", ("fast", "safe")),
    }

    def run(self, driver, client, iteration, context):
        return 0


# --- parameter kinds ---------------------------------------------------------------

@pytest.mark.parametrize(
    "param, value, parsed",
    [
        (Param("bytes", 1), "10MB", 10**7),
        (Param("bytes", 1), "4KiB", 4096),
        (Param("bytes", 1), 0, 0),
        (Param("bytes", 1), 512, 512),
        (Param("count", 1), 3, 3),
        (Param("flag", False), True, True),
        (Param("flag", True), False, False),
        (Param("choice", "a", ("a", "b")), "b", "b"),
    ],
)
def test_param_accepts(param, value, parsed):
    assert param.parse(value, what="[ops.x].key") == parsed


@pytest.mark.parametrize(
    "param, value, message",
    [
        (Param("bytes", 1), "huge", r"\[ops.x\].key: 'huge' is not a size. Write e.g. 1MB"),
        (Param("bytes", 1), -1, r"\[ops.x\].key: -1 must not be negative"),
        (Param("bytes", 1), True, r"True is not a size"),
        (Param("count", 1), 0, r"\[ops.x\].key: 0 must be a positive whole number"),
        (Param("count", 1), 1.5, r"1.5 must be a positive whole number"),
        (Param("count", 1), "3", r"'3' must be a positive whole number"),
        (Param("count", 1), True, r"True must be a positive whole number"),
        (Param("flag", False), "yes", r"\[ops.x\].key: 'yes' must be true or false"),
        (Param("flag", False), 1, r"1 must be true or false"),
        (Param("choice", "a", ("a", "b")), "c",
         r"\[ops.x\].key: unknown value 'c'. Valid values: a, b\."),
    ],
)
def test_param_rejects_with_key_value_and_valid(param, value, message):
    with pytest.raises(StorageScaleUsageError, match=message):
        param.parse(value, what="[ops.x].key")


@pytest.mark.parametrize(
    "kind, default, choices, message",
    [
        ("size", 1, (), "valid kinds are bytes, count, flag, choice"),
        ("choice", "a", (), "choices are given for, and only for, a choice"),
        ("count", 1, ("a",), "choices are given for, and only for, a choice"),
        ("count", 0, (), "must be a positive whole number"),
        ("choice", "c", ("a", "b"), "unknown value 'c'"),
    ],
)
def test_bad_param_declaration_is_refused_where_written(kind, default, choices, message):
    with pytest.raises(ValueError, match=message):
        Param(kind, default, choices)


def test_defaults_and_param_names_come_from_the_declarations():
    copy = Copy()
    assert copy.param_names == ("file_size", "hops", "verify", "mode")
    assert copy.defaults == {"file_size": 1000, "hops": 2, "verify": True, "mode": "fast"}
    assert get_operation("write").defaults == {
        "file_size": 100_000_000, "block_size": 65536, "sync": "none"}
    assert get_operation("mkdir").param_names == ()


def test_parse_params_validates_by_kind_not_by_name():
    # "hops" does not end in "size" yet is a count; "file_size" a size
    params = Copy().parse_params({"file_size": "2kB", "hops": 5, "mode": "safe"}, where="w")
    assert params == {"file_size": 2000, "hops": 5, "verify": True, "mode": "safe"}
    with pytest.raises(StorageScaleUsageError, match=r"w.hops: '5' must be a positive"):
        Copy().parse_params({"hops": "5"}, where="w")
    with pytest.raises(StorageScaleUsageError,
                       match=r"w: unknown parameter 'hop' of operation 'copy'. Valid parameters: "
                             r"file_size, hops, verify, mode\."):
        Copy().parse_params({"hop": 5}, where="w")


def test_parse_params_checks_the_combination():
    with pytest.raises(StorageScaleUsageError,
                       match=r"w: direct I/O needs block_size in multiples of 4096 bytes, not 1000"):
        get_operation("write").parse_params({"sync": "direct", "block_size": "1kB"}, where="w")


# --- scaling -----------------------------------------------------------------------

@pytest.mark.parametrize(
    "param, value, factor, scaled",
    [
        (Param("bytes", 1), 10**7, 0.1, 10**6),
        (Param("bytes", 1), 5, 0.1, 1),        # at least 1 byte
        (Param("bytes", 1), 0, 0.1, 0),        # 0 stays 0
        (Param("bytes", 1), 5, 0.5, 3),        # half up
        (Param("count", 1), 10, 0.25, 3),
        (Param("count", 1), 3, 0.01, 1),       # at least 1
        (Param("flag", False), True, 0.1, True),
        (Param("choice", "a", ("a", "b")), "b", 0.1, "b"),
    ],
)
def test_param_scaling(param, value, factor, scaled):
    assert param.scaled(value, factor) == scaled


def test_scaled_params_scale_every_size_and_count():
    get = get_operation("get")
    assert get.scaled_params({"file_size": 10**7, "files": 10, "to_disk": True}, 0.2) == {
        "file_size": 2 * 10**6, "files": 2, "to_disk": True}


def test_a_scaled_parameter_that_breaks_the_checks_keeps_its_value():
    write = get_operation("write")
    params = {"file_size": 10**8, "block_size": 65536, "sync": "direct"}
    # 6554 bytes is no multiple of 4096: block_size keeps its value, the file still shrinks
    assert write.scaled_params(params, 0.1) == {
        "file_size": 10**7, "block_size": 65536, "sync": "direct"}
    # without direct I/O any block size will do
    assert write.scaled_params({**params, "sync": "none"}, 0.1)["block_size"] == 6554


def test_readv_chunks_that_no_longer_fit_keep_the_file_size():
    readv = get_operation("readv")
    params = {"file_size": 6, "chunks": 3, "chunk_size": 2}
    # 6 * 0.9 = 5.4 -> 5 bytes hold two 2-byte chunks, not three
    assert readv.scaled_params(params, 0.9) == params
    assert readv.scaled_params({"file_size": 10**6, "chunks": 16, "chunk_size": 4096}, 0.1) == {
        "file_size": 10**5, "chunks": 2, "chunk_size": 410}


# --- the registry ------------------------------------------------------------------

def test_built_in_operations_are_registered():
    assert operation_names() == BUILT_IN
    assert all(get_operation(name).name == name for name in BUILT_IN)


def test_unknown_operation_lists_the_known_ones():
    with pytest.raises(StorageScaleUsageError,
                       match=r"unknown operation 'copy'. Known operations: stat, ls, .*ls_under_io\. "
                             r"A site adds one with register_operation\(\) or the "
                             r"pytest_storagescale.operations entry-point group"):
        get_operation("copy")


COPY_SECTION = """
[storage]
system = "xrootd"
versions = ["*"]

[ops.copy]
clients = [2]
hops = 3
file_size = "1kB"

[ops.safecopy]
op = "copy"
clients = [1]
mode = "safe"
"""


def test_a_registered_operation_makes_its_sections_valid(thresholds_dir):
    path = thresholds_dir(COPY_SECTION)
    with pytest.raises(ThresholdsError, match=r"\[ops.copy\]: unknown operation 'copy'"):
        load_thresholds(path)
    register_operation(Copy())
    ts = load_thresholds(path)
    assert ts.section("copy").params == {"file_size": 1000, "hops": 3, "verify": True,
                                         "mode": "fast"}
    assert ts.section("safecopy").operation == "copy"
    assert "copy" in operation_names()
    bad = thresholds_dir(COPY_SECTION.replace("hops = 3", "hops = 0"), name="bad.toml")
    with pytest.raises(ThresholdsError, match=r"\[ops.copy\].hops: 0 must be a positive whole"):
        load_thresholds(bad)


def test_a_taken_name_is_refused_unless_replaced():
    class OtherGet(Copy):
        name = "get"

    with pytest.raises(StorageScaleUsageError,
                       match=r"operation 'get' is already registered "
                             r"\(pytest_storagescale.load.operations.Get\). Choose another name, "
                             r"or pass replace=True"):
        register_operation(OtherGet())
    assert type(get_operation("get")).__name__ == "Get"
    other = OtherGet()
    register_operation(other, replace=True)
    assert get_operation("get") is other


def test_registering_the_same_class_again_takes_its_place():
    register_operation(Copy())
    # a conftest imported again by a second session of one process: a new class object
    again = type("Copy", (Copy,), {"__module__": Copy.__module__, "__qualname__": "Copy"})()
    register_operation(again)
    assert operation_names().count("copy") == 1 and get_operation("copy") is again


@pytest.mark.parametrize(
    "candidate, message",
    [
        (Copy, r"is not an Operation instance; pass one, e.g. register_operation\(MyOperation\(\)\)"),
        (type("Nameless", (Copy,), {"name": ""})(), r"Nameless.name '' is not an operation name"),
        (type("Loose", (Copy,), {"parameters": {"size": 5}})(),
         r"Loose.parameters\['size'\] is 5; declare it as a Param"),
    ],
)
def test_bad_registrations_say_what_to_do(candidate, message):
    with pytest.raises(StorageScaleUsageError, match=message):
        register_operation(candidate)


def test_composites_find_their_sides_in_the_registry():
    mixed = get_operation("mixed")
    assert [(side, op.name, n) for side, op, n in mixed.groups(4)] == [
        ("readers", "get", 4), ("writers", "put", 4)]
    assert mixed.groups(1)[0][1] is get_operation("get")

    class Plain(Copy):
        name = "get"

    replacement = Plain()
    register_operation(replacement, replace=True)
    assert mixed.groups(1)[0][1] is replacement


# --- entry points ------------------------------------------------------------------

def _install(tmp_path, monkeypatch, entry_points: str, module: str) -> None:
    """An installed distribution with entry points: a dist-info folder on sys.path.
    ``site_ops`` in ``entry_points`` names a module new to this process."""
    name = "site_ops_" + re.sub(r"\W", "_", tmp_path.name)
    entry_points = entry_points.replace("site_ops:", f"{name}:")
    (tmp_path / f"{name}.py").write_text(module)
    info = tmp_path / "site_ops-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: site-ops\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        f"[pytest_storagescale.operations]\n{entry_points}\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(operations.OPERATIONS, "_entry_points_read", False)


SITE_OPS = """
from pytest_storagescale.load.operations import Operation, Param

class Touch(Operation):
    name = "touch"
    parameters = {"depth": Param("count", 1)}

class Probe(Operation):
    name = "probe"

probe = Probe()
"""


def test_entry_points_add_operations_once(tmp_path, monkeypatch):
    _install(tmp_path, monkeypatch, "touch = site_ops:Touch\nprobe = site_ops:probe", SITE_OPS)
    assert get_operation("touch").defaults == {"depth": 1}  # a class: instantiated
    assert get_operation("probe").name == "probe"            # an instance: used as is
    assert operation_names()[-2:] in (("touch", "probe"), ("probe", "touch"))
    assert operations.OPERATIONS._entry_points_read


@pytest.mark.parametrize(
    "entry_point, message",
    [
        ("touch = site_ops:Missing",
         r"entry point touch = 'site_ops_\w+:Missing' \(group pytest_storagescale.operations, "
         r"package site-ops\): cannot load: AttributeError: .*Fix or uninstall that package"),
        ("tap = site_ops:Touch", r"entry point tap = .*names 'touch'; name the entry point after"),
        ("get = site_ops:Get", r"entry point get = .*operation 'get' is already registered"),
    ],
)
def test_a_broken_entry_point_names_itself_and_its_package(tmp_path, monkeypatch, entry_point,
                                                            message):
    module = SITE_OPS + "\nclass Get(Touch):\n    name = 'get'\n"
    _install(tmp_path, monkeypatch, entry_point, module)
    with pytest.raises(StorageScaleUsageError, match=message):
        operation_names()
    assert not operations.OPERATIONS._entry_points_read  # every lookup fails until fixed

