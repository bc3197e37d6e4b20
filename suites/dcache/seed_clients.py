"""What of the conformance checks runs through the seeds' own clients
(``test_seed_clients.py``): the tools, and why a check does not run through one.

A load door ``DOOR+CLIENT`` whose client is ``dccp`` or ``globus-url-copy`` runs the
module's checks; the suite's conftest deselects them on every other load door (the
header says so), and a check a tool does not make is skipped saying why
(:data:`NOT_THROUGH`). The reasons are the tools' own: ``man dccp`` and ``dccp -h``
(libdcap 2.47.14), ``globus-url-copy -help`` (10.12).
"""

from __future__ import annotations

from collections.abc import Iterable

#: the seeds' command-line clients (the drivers of ``drivers/commands.py``)
SEED_TOOLS = ("dccp", "globus-url-copy")
#: the test module these name the checks of
MODULE = "test_seed_clients.py"

#: why a conformance check does not run through a tool: check -> tool -> reason
NOT_THROUGH = {
    "delete": {
        "dccp": "dccp deletes nothing (it copies in, copies out and pre-stages, -P)",
        "globus-url-copy": "globus-url-copy deletes nothing (it copies and lists)",
    },
    "rename": {
        "dccp": "dccp renames nothing (nor has the dcap protocol a rename)",
        "globus-url-copy": "globus-url-copy renames nothing (it copies and lists)",
    },
    "stat_fields": {
        "dccp": "dccp asks no stat (its copy's size is checked through the door's "
                "service connection)",
        "globus-url-copy": "globus-url-copy asks no stat: -list prints the names only",
    },
    "mkdir_rmdir": {
        "dccp": "dccp makes and removes no directory (a copy into a missing one is "
                "refused: test_copy_into_a_missing_directory)",
        "globus-url-copy": "globus-url-copy removes no directory; it makes one only as a "
                           "copy's missing parents (-cd: test_copy_into_a_missing_directory)",
    },
    "rmdir_not_empty_error": {
        "dccp": "dccp removes no directory",
        "globus-url-copy": "globus-url-copy removes no directory",
    },
    "readv": {
        "dccp": "dccp copies whole files: no vector read",
        "globus-url-copy": "globus-url-copy has no vector read (a partial copy, -off/-len, "
                           "is one range: test_partial_read)",
    },
    "ls": {"dccp": "dccp lists nothing (and libdcap's listing is never sent: "
                   "docs/servers.md, the dcap door)"},
    "partial_read": {"dccp": "dccp copies whole files: it has no offset or length option"},
    "partial_read_across_the_end": {
        "dccp": "dccp copies whole files: it has no offset or length option"},
    "checksum_of_a_local_copy": {
        "dccp": "dccp has no option comparing its copy with the door's checksum: it sends "
                "the adler32 it computed with its close (test_checksum checks that)"},
    "md5_of_a_local_copy": {
        "dccp": "dccp has no option comparing its copy with the door's checksum (nor "
                "another algorithm than adler32)"},
}
#: the checks neither tool makes: one skipped test each, saying why
NEITHER = ("delete", "rename", "stat_fields", "mkdir_rmdir", "rmdir_not_empty_error", "readv")


def seed_tool(load_door: str | None) -> str | None:
    """The seed tool a load door ``DOOR+CLIENT`` runs (None: the door's own driver, or
    another client)."""
    client = (load_door or "").partition("+")[2]
    return client if client in SEED_TOOLS else None


def not_through(check: str, tool: str) -> str | None:
    """Why ``check`` (``delete``, ``ls``...) does not run through ``tool`` (None: it
    does)."""
    return NOT_THROUGH.get(check, {}).get(tool)


def seed_doors(load_doors: Iterable[str]) -> list[str]:
    """The load doors (``--storage-load-doors``, resolved) that run a seed tool."""
    return [door for door in load_doors if seed_tool(door) is not None]


#: the header's line, and the deselection's reason, when no load door runs a seed tool
NO_SEED_DOOR = (f"storagescale: suites/dcache's checks through the seeds' own clients "
                f"({MODULE}) deselected: no load door runs dccp or globus-url-copy "
                f"(--storage-load-doors dcap+dccp,gsiftp+globus-url-copy names them; 'all' "
                f"names each door through its own driver only)")
