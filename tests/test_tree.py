"""``storagescale tree write`` / ``verify``: a seeded tree written before an upgrade and
checked after it (issue 34, first part). The memory driver for the command's logic,
the embedded xrootd (root:// and davs://) for real doors and damage done on the
server's own data directory."""

from __future__ import annotations

import json
import shutil
import tempfile
import uuid
import zlib
from pathlib import Path

import pytest

from pytest_storagescale.cli import main
from pytest_storagescale.drivers.registry import driver_spec
from pytest_storagescale.tree import MARKER, build_tree, load_manifest


def _memory_url() -> str:
    return f"memory://tree-{uuid.uuid4().hex[:8]}/area"


def _write(capsys, urls, manifest, *extra):
    code = main(["tree", "write", *urls, "--manifest", str(manifest), *extra])
    return code, capsys.readouterr()


def _verify(capsys, urls, manifest, *extra):
    code = main(["tree", "verify", *urls, "--manifest", str(manifest), *extra])
    return code, capsys.readouterr()


def _folder(manifest) -> str:
    return json.loads(manifest.read_text())["written"]["folder"]


def _client(url: str, folder: str):
    """A client allowed to write in the tree folder only (to damage it on purpose)."""
    spec = driver_spec(url)
    root = f"{spec.endpoint.path.rstrip('/')}/{folder}"
    return driver_spec(url, writable_root=root).connect("tree-test", timeout=10), root


# -- the tree itself ------------------------------------------------------------------
def test_same_seed_same_tree_byte_for_byte():
    first, again, other = build_tree(7), build_tree(7), build_tree(8)
    assert [(f.path, f.data) for f in first.files] == [(f.path, f.data) for f in again.files]
    assert first.description() == again.description()
    assert [f.data for f in first.files] != [f.data for f in other.files]


def test_the_tree_holds_the_edge_cases():
    tree = build_tree(1)
    sizes = {f.path: len(f.data) for f in tree.files}
    adlers = {f.path: f.checksums["adler32"] for f in tree.files}
    assert sum(1 for size in sizes.values() if size == 0) >= 2  # 0-byte files
    assert adlers["nested/adler32 leading zeros.bin"].startswith("00")
    assert int(adlers["nested/adler32 leading zeros.bin"], 16) == zlib.adler32(
        next(f.data for f in tree.files if f.path == "nested/adler32 leading zeros.bin"))
    assert any(" " in path for path in sizes) and any(not path.isascii() for path in sizes)
    assert "empty directory" in tree.directories
    assert len([p for p in tree.directories if p.count("/") >= 2]) >= 1  # nested
    assert sum(sizes.values()) > 4 * 2**20  # the larger files: 4 MiB by default
    assert max(sizes.values()) > 2**20  # across the 1 MiB read chunk
    assert sum(len(f.data) for f in build_tree(1, size=0).files) < 100_000


def test_same_seed_twice_identical_manifest_contents(tmp_path, capsys):
    url = _memory_url()
    one, two = tmp_path / "one.json", tmp_path / "two.json"
    assert _write(capsys, [url], one, "--seed", "42")[0] == 0
    assert _write(capsys, [url], two, "--seed", "42")[0] == 0
    a, b = json.loads(one.read_text()), json.loads(two.read_text())
    assert a["tree"] == b["tree"] and a["tree_digest"] == b["tree_digest"]
    assert a["reported"] == b["reported"]
    assert a["written"]["folder"] != b["written"]["folder"]  # two trees, never one reused
    three = tmp_path / "three.json"
    assert _write(capsys, [url], three, "--seed", "43")[0] == 0
    assert json.loads(three.read_text())["tree_digest"] != a["tree_digest"]


# -- write then verify on the memory driver --------------------------------------------
def test_write_then_verify_memory(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    code, out = _write(capsys, [url], manifest, "--size", "100k")
    assert code == 0, out
    record = json.loads(manifest.read_text())
    assert record["tree"]["seed"] == 1
    first = record["tree"]["files"][0]
    assert {"path", "size", "adler32", "md5"} <= set(first)
    assert record["reported"]["memory"][first["path"]]["adler32"] == first["adler32"]
    assert record["reported"]["memory"][first["path"]]["md5"] is None  # not offered there
    code, out = _verify(capsys, [url], manifest)
    assert code == 0, out.out
    assert f"{len(record['tree']['files'])} files" in out.out and "ok" in out.out


def test_a_deleted_file_is_missing_by_name(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "10k")[0] == 0
    client, root = _client(url, _folder(manifest))
    client.delete(f"{root}/with space/a file with spaces.txt")
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    assert "missing    with space/a file with spaces.txt" in out.out
    # the directory's listing lacks it too
    assert "changed    with space/: memory: listing lacks 'a file with spaces.txt'" in out.out


def test_same_size_other_content_is_corrupted_not_changed(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "10k")[0] == 0
    client, root = _client(url, _folder(manifest))
    path = f"{root}/ünïcödé 目录/файл ünïcode.bin"
    data = bytearray(client.read(path, 0, 4096))
    data[10] ^= 0xFF
    client.put(path, bytes(data))
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    line = next(line for line in out.out.splitlines() if "файл" in line)
    assert line.startswith("corrupted  ünïcödé 目录/файл ünïcode.bin: memory: content read back")


def test_an_extra_entry_changes_its_directory(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "0")[0] == 0
    client, root = _client(url, _folder(manifest))
    client.put(f"{root}/nested/intruder", b"x")
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    assert "changed    nested/: memory: listing adds 'intruder'" in out.out


# -- bad input: one paragraph, exit 4 ----------------------------------------------------
def _one_paragraph(err: str) -> None:
    assert err.startswith("ERROR: ") and err.count("\n") == 1 and "Traceback" not in err


def test_garbled_manifest_is_one_paragraph_exit_4(tmp_path, capsys):
    manifest = tmp_path / "tree.json"
    manifest.write_text('{"format": "storagescale-tree/1", "tree": ')
    code, out = _verify(capsys, [_memory_url()], manifest)
    assert code == 4
    _one_paragraph(out.err)
    assert str(manifest) in out.err and "not JSON" in out.err


def test_edited_manifest_is_refused(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "0")[0] == 0
    record = json.loads(manifest.read_text())
    record["tree"]["files"][3]["size"] += 1
    manifest.write_text(json.dumps(record))
    code, out = _verify(capsys, [url], manifest)
    assert code == 4
    _one_paragraph(out.err)
    assert "not the tree of its seed 1" in out.err


def test_manifest_of_another_tree_is_refused(tmp_path, capsys):
    url, one, two = _memory_url(), tmp_path / "one.json", tmp_path / "two.json"
    assert _write(capsys, [url], one, "--size", "0")[0] == 0
    assert _write(capsys, [url], two, "--size", "0")[0] == 0
    record = json.loads(one.read_text())
    record["written"]["folder"] = _folder(two)  # points at the other tree's folder
    one.write_text(json.dumps(record))
    code, out = _verify(capsys, [url], one)
    assert code == 4
    _one_paragraph(out.err)
    assert "manifest of another tree" in out.err and MARKER in out.err


@pytest.mark.parametrize("args, names", [
    (["nosuch://host/area"], "no driver serves nosuch://"),
    (["--timeout", "0"], "--timeout 0"),
    (["--size", "lots"], "'lots' is not a size"),
    (["--size", "300MiB"], "at most 268435456 bytes"),
    (["--seed", "-1"], "--seed -1"),
    (["--driver-option", "novalue"], "'novalue' is not KEY=VALUE"),
])
def test_bad_write_input_is_one_paragraph(tmp_path, capsys, args, names):
    urls = [] if args[0].startswith("-") else [args.pop(0)]
    code, out = _write(capsys, urls or [_memory_url()], tmp_path / "m.json", *args)
    assert code == 4, out
    _one_paragraph(out.err)
    assert names in out.err
    assert not (tmp_path / "m.json").exists()


def test_an_existing_manifest_is_never_overwritten(tmp_path, capsys):
    manifest = tmp_path / "kept.json"
    manifest.write_text("the site's manifest")
    url = _memory_url()
    code, out = _write(capsys, [url], manifest)
    assert code == 4
    _one_paragraph(out.err)
    assert manifest.read_text() == "the site's manifest"
    client, _ = _client(url, "x")
    assert not [n for n in client.ls("/area") if n.startswith("storagescale-tree-")]


def test_a_missing_test_area_is_one_paragraph(tmp_path, capsys, embedded_xrootd):
    url = embedded_xrootd.url + "/no-such-area"
    code, out = _write(capsys, [url], tmp_path / "m.json")
    assert code == 4
    _one_paragraph(out.err)
    assert "does not exist" in out.err and "xrdfs" in out.err


# -- the embedded xrootd: real doors, damage on the server's data directory ------------
@pytest.fixture
def xrootd_tree(embedded_xrootd, tmp_path, capsys):
    """A tree written over root:// (and one file over davs://); its folder on disk."""
    server = embedded_xrootd
    urls = [server.url, server.https_url]
    manifest = tmp_path / "tree.json"
    code, out = _write(capsys, urls, manifest, "--size", "1MiB",
                       "--driver-option", f"ca_dir={server.ca_dir}")
    assert code == 0, out
    folder = server.directory / "data" / "storagescale" / _folder(manifest)
    assert (folder / MARKER).is_file()
    yield urls, manifest, folder
    shutil.rmtree(folder, ignore_errors=True)


def _verify_xrootd(capsys, server, urls, manifest):
    return _verify(capsys, urls, manifest, "--driver-option", f"ca_dir={server.ca_dir}")


def test_write_then_verify_over_root_and_davs(embedded_xrootd, xrootd_tree, capsys):
    urls, manifest, _ = xrootd_tree
    record = load_manifest(manifest)
    # what the embedded xrootd offers (xrootd.chksum adler32), through both doors
    for scheme in ("root", "davs"):
        reported = record["reported"][scheme]
        assert all(values["adler32"] for values in reported.values())
        assert reported["nested/adler32 leading zeros.bin"]["adler32"].startswith("00")
    code, out = _verify_xrootd(capsys, embedded_xrootd, urls, manifest)
    assert code == 0, out.out
    assert "through 2 door(s)" in out.out
    code, out = _verify_xrootd(capsys, embedded_xrootd, urls[:1], manifest)
    assert code == 0, out.out


def test_a_file_deleted_on_the_server_is_missing(embedded_xrootd, xrootd_tree, capsys):
    urls, manifest, folder = xrootd_tree
    (folder / "nested" / "deeper" / "small-04.bin").unlink(missing_ok=True)
    (folder / "one byte.bin").unlink()
    code, out = _verify_xrootd(capsys, embedded_xrootd, urls, manifest)
    assert code == 1
    assert "missing    one byte.bin: root: not found; davs: not found" in out.out


def test_a_flipped_byte_on_disk_is_corrupted(embedded_xrootd, xrootd_tree, capsys):
    urls, manifest, folder = xrootd_tree
    path = folder / "large" / "large-1.bin"
    with open(path, "r+b") as handle:
        handle.seek(123_456)
        byte = handle.read(1)
        handle.seek(123_456)
        handle.write(bytes([byte[0] ^ 0x01]))
    code, out = _verify_xrootd(capsys, embedded_xrootd, urls, manifest)
    assert code == 1
    bad = [line for line in out.out.splitlines()[1:]]
    assert len(bad) == 1 and bad[0].startswith("corrupted  large/large-1.bin: root: content")
    assert "davs: content read back" in bad[0]


def test_a_truncated_file_is_changed(embedded_xrootd, xrootd_tree, capsys):
    """Truncation is ``changed``: the size is compared first (documented)."""
    urls, manifest, folder = xrootd_tree
    path = folder / "with space" / "a file with spaces.txt"
    size = path.stat().st_size
    with open(path, "r+b") as handle:
        handle.truncate(size // 2)
    code, out = _verify_xrootd(capsys, embedded_xrootd, urls, manifest)
    assert code == 1
    assert (f"changed    with space/a file with spaces.txt: root: size {size // 2}, was {size}"
            in out.out)


def test_a_checksum_in_another_form_is_changed(tmp_path, capsys):
    """The storage answering the same adler32 without its leading zeros (a form change
    that broke clients after releases) is ``changed``, naming both forms."""
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "0")[0] == 0
    record = json.loads(manifest.read_text())
    reported = record["reported"]["memory"]["one byte.bin"]
    assert reported["adler32"].startswith("00")
    reported["adler32"] = reported["adler32"].lstrip("0")  # as if written so then
    manifest.write_text(json.dumps(record))
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    assert (f"changed    one byte.bin: memory: adler32 {reported['adler32'].rjust(8, '0')}, "
            f"was {reported['adler32']}") in out.out


# -- an upgrade in place: XRootD 5.5.3 writes, 6.2.1 serves the same data directory ----
@pytest.fixture
def kept_data():
    """A data directory outside any server's own folder (the server's user is given it)."""
    folder = Path(tempfile.mkdtemp(prefix="storagescale-inplace-"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.integration
def test_xrootd_upgrade_in_place_keeps_every_file(kept_data, tmp_path, capsys):
    """Write the tree through 5.5.3 (root:// and davs://), stop it, start 6.2.1 on the
    same data directory, verify through both of its doors: every file is there and the
    same; then a file removed on disk is named ``missing`` by the new release too."""
    from pytest_storagescale.servers.xrootd import EmbeddedXRootD
    from pytest_storagescale.servers.xrootd_releases import BUILT_VERSION, built_prefix

    if built_prefix() is None:
        pytest.skip(f"XRootD {BUILT_VERSION} is not built on this machine: run "
                    f"'bash scripts/build-xrootd6.sh' (make setup runs it)")
    manifest = tmp_path / "tree.json"
    old = EmbeddedXRootD(data_directory=kept_data)
    with old:
        assert old.version == "5.5.3"
        code, out = _write(capsys, [old.url, old.https_url], manifest,
                           "--driver-option", f"ca_dir={old.ca_dir}")
        assert code == 0, out
    folder = kept_data / "storagescale" / _folder(manifest)
    assert (folder / MARKER).is_file()  # the old server's stop() kept the data
    new = EmbeddedXRootD(data_directory=kept_data)
    new.requested_version = BUILT_VERSION
    with new:
        assert new.version == BUILT_VERSION
        urls, ca = [new.url, new.https_url], f"ca_dir={new.ca_dir}"
        code, out = _verify(capsys, urls, manifest, "--driver-option", ca)
        assert code == 0, out.out
        assert "through 2 door(s)" in out.out
        (folder / "nested" / "adler32 leading zeros.bin").unlink()
        code, out = _verify(capsys, urls, manifest, "--driver-option", ca)
    assert code == 1
    assert "missing    nested/adler32 leading zeros.bin: root: not found; davs: not found" \
        in out.out


def test_a_tree_folder_gone_is_every_entry_missing(tmp_path, capsys):
    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "0")[0] == 0
    client, root = _client(url, _folder(manifest))
    client.remove_tree(root, not_before=0)
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    record = json.loads(manifest.read_text())
    entries = len(record["tree"]["files"]) + len(record["tree"]["directories"])
    assert f": {entries} missing" in out.out.splitlines()[0]
    assert "missing    (tree folder): memory: not found" in out.out


def test_no_credential_of_the_url_is_written_or_printed(tmp_path, capsys):
    store = f"tree-{uuid.uuid4().hex[:8]}"
    url, manifest = f"memory://alice:s3cr3tpw@{store}/area", tmp_path / "tree.json"
    code, out = _write(capsys, [url], manifest, "--size", "0")
    assert code == 0, out
    code, verified = _verify(capsys, [url], manifest, "-v")
    assert code == 0
    for text in (manifest.read_text(), out.out, out.err, verified.out, verified.err):
        assert "s3cr3tpw" not in text


def test_ctrl_c_is_one_line_and_exit_130(tmp_path, capsys, monkeypatch):
    from pytest_storagescale import tree

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(tree, "verify_tree", interrupted)
    code, out = _verify(capsys, [_memory_url()], tmp_path / "m.json")
    assert code == 130
    assert out.err.startswith("storagescale tree: interrupted (Ctrl-C)") and "Traceback" not in out.err


def test_ascii_names_are_the_same_files_under_ascii_names(tmp_path, capsys):
    """``--ascii-names``: the tree of the same seed with every name ASCII (dCache's
    xrootd and GridFTP doors answer a non-ASCII character as '?'); its manifest says so
    and verifies; a manifest whose ``names`` is edited is another tree, refused."""
    utf8, ascii_tree = build_tree(5, 1000, 2), build_tree(5, 1000, 2, ascii_names=True)
    assert [f.data for f in utf8.files] == [f.data for f in ascii_tree.files]
    assert any(not f.path.isascii() for f in utf8.files)
    assert all(path.isascii() for path in [*ascii_tree.directories,
                                           *(f.path for f in ascii_tree.files)])
    url, manifest = _memory_url(), tmp_path / "tree.json"
    code, out = _write(capsys, [url], manifest, "--seed", "5", "--ascii-names")
    assert code == 0, out
    record = json.loads(manifest.read_text())
    assert record["tree"]["names"] == "ascii"
    assert _verify(capsys, [url], manifest)[0] == 0
    del record["tree"]["names"]
    manifest.write_text(json.dumps(record))
    code, out = _verify(capsys, [url], manifest)
    assert code == 4 and "is not the tree of its seed 5" in out.err


def test_a_door_added_after_the_write_is_asked_the_types_offered_then(tmp_path, capsys,
                                                                     monkeypatch):
    """A door the tree was not written through (dCache's GridFTP door beside the WebDAV
    and xrootd doors it was written through) is asked only the checksum types the
    storage offered at write time: dCache stores adler32 only, and its GridFTP door
    answers an md5 request with '500 Operation failed due to internal error: null', an
    error, not 'not offered'; asking it would make every file 'unreadable'. Its
    adler32 is still compared with the content's."""
    from pytest_storagescale.drivers.memory import MemoryDriver
    from pytest_storagescale.errors import StorageError

    url, manifest = _memory_url(), tmp_path / "tree.json"
    assert _write(capsys, [url], manifest, "--size", "0")[0] == 0
    record = json.loads(manifest.read_text())
    record["reported"] = {"davs": record["reported"].pop("memory")}  # written through davs
    manifest.write_text(json.dumps(record))
    answered = MemoryDriver._checksum

    def gridftp_checksum(self, path, algorithm):
        if algorithm.lower() == "md5":
            raise StorageError("500 Operation failed due to internal error: null",
                               driver="gfal2", endpoint="gsiftp://localhost:2811",
                               operation="checksum", path=path,
                               error_class="server")
        return answered(self, path, algorithm)
    monkeypatch.setattr(MemoryDriver, "_checksum", gridftp_checksum)
    code, out = _verify(capsys, [url], manifest)
    assert code == 0, out.out + out.err
    assert out.out.splitlines()[0].endswith(" ok"), out.out
    assert "unreadable" not in out.out
    # its adler32 is still asked and compared with the content's
    monkeypatch.setattr(MemoryDriver, "_checksum",
                        lambda self, path, algorithm: "00000001")
    code, out = _verify(capsys, [url], manifest)
    assert code == 1
    assert "memory: adler32 00000001, the content's is" in out.out
