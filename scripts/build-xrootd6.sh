#!/usr/bin/env bash
# Builds the XRootD 6.2.1 server that `--storage-embedded-version 6.2.1` runs, once per
# machine, into a cache outside the checkout:
#
#   $XDG_CACHE_HOME/pytest-storagescale/xrootd-6.2.1-<key>/   (default ~/.cache)
#       bin/  xrootd cmsd xrdfs xrdcp xrdadler32
#       lib/  the 6.2.1 libraries and the server's plug-ins (lib...-6.so)
#       .storagescale-built   the marker, written last: what was built and how
#
# <key> is a hash of the version, the CMake options and the targets: a change of any
# gives a new folder. A prefix without the marker is a broken or partial build (the
# machine stopped, the build failed) and is built again from scratch; with the marker
# the script only checks the library search path of every ELF file (below) and
# repairs it when needed. Run by scripts/bootstrap.sh servers|all (make test's
# set-up); its build dependencies are installed there.
#
# The library search path: CMake gives the build tree's programs and libraries a
# RUNPATH into the build tree with an empty element ([<work>/build/lib:], [$ORIGIN:]):
# the build tree is deleted, and an empty element means the working directory, so
# xrootd or xrdcp started from a folder where another user put a libz.so.1 would load
# it. Every ELF file's RUNPATH is set to the prefix's lib/ only (patchelf), checked
# before the marker is written; a build made by an older copy of this script is
# repaired the same way the next time the script runs (its marker gets a runpath=
# line), and the plugin refuses a prefix that still has such a path.
#
# The source is PyPI's xrootd==6.2.1 source distribution (pip download, kept in
# the cache; its sha256 pinned, SDIST_SHA256: another file is refused): it holds the whole XRootD source, server included, but not the
# top-level vendor/ folder (inih, picojson) that XrdThrottle and XrdSciTokens
# include: that comes from the shared material ($STORAGESCALE_SHARED/xrootd6/vendor,
# default <checkout>/../shared, then /work/shared).
#
# Options: --print-prefix prints the prefix and exits; --dry-run prints what it would do;
# --client builds (after the server, when missing) the client environment below, and
# --print-client-prefix prints its prefix.
#
# The client environment (`STORAGESCALE_XROOTD_CLIENT=6.2.1`, xrootd_releases.py): the
# 6.2.1 Python bindings built from the same sdist by its own setup.py (the client
# libraries, XrdCl's security plug-ins and pyxrootd: `pip install --target`, CMake's
# client-only build), into
#
#   $XDG_CACHE_HOME/pytest-storagescale/xrootd-client-6.2.1-<ckey>/
#       python/  XRootD/, pyxrootd/ (client.so, libXrdCl.so.3, libXrdSecgsi-6.so ...),
#                xrootd-6.2.1.dist-info
#       bin/     xrdcp xrdfs xrdadler32: links to the server build's 6.2.1 tools
#       .storagescale-built
#
# <ckey> hashes the version, the server's <key>, the CMake options and the Python
# ABI (cpython-311: the extension is built for this interpreter). Every ELF file's
# RUNPATH is set to exactly $ORIGIN (its own folder), checked before the marker.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$(pwd)

VERSION=6.2.1
# the sha256 of PyPI's xrootd-6.2.1.tar.gz: a download or a cached copy with another is
# refused (measured 2026-11-26: the cache's copy and a fresh pip download agree)
SDIST_SHA256=b959c8c41e948f89272625f2a0a6994008465272027bffec71b01d0c7e278cba
CMAKE_OPTIONS=(-DCMAKE_BUILD_TYPE=RelWithDebInfo -DENABLE_TESTS=OFF -DENABLE_PYTHON=OFF
               -DENABLE_CEPH=OFF -DENABLE_XRDEC=OFF -DENABLE_FUSE=OFF -DENABLE_VOMS=OFF
               -DENABLE_XRDOSSARC=OFF)
TARGETS=(xrootd cmsd xrdfs xrdcp xrdadler32 XrdHttp-6 XrdHttpTPC-6 XrdPfc-6 XrdThrottle-6
         XrdPss-6 XrdSec-6 XrdSecProt-6 XrdSecunix-6 XrdSeckrb5-6 XrdSecgsi-6
         XrdSecgsiGMAPDN-6 XrdSecsss-6 XrdSecztn-6 XrdSecpwd-6 XrdCryptossl-6
         XrdMacaroons-6 XrdAccSciTokens-6 XrdCksCalczcrc32-6)
JOBS=${STORAGESCALE_BUILD_JOBS:-2}

PRINT_PREFIX=
PRINT_CLIENT_PREFIX=
DRY_RUN=
CLIENT=
for arg in "$@"; do
    case "$arg" in
        --print-prefix) PRINT_PREFIX=1 ;;
        --print-client-prefix) PRINT_CLIENT_PREFIX=1 ;;
        --dry-run) DRY_RUN=1 ;;
        --client) CLIENT=1 ;;
        *) echo "build-xrootd6: unknown argument '$arg': write --print-prefix," \
                "--print-client-prefix, --client or --dry-run, or nothing to build" >&2
           exit 2 ;;
    esac
done

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/pytest-storagescale
KEY=$(printf '%s\n' "$VERSION" "${CMAKE_OPTIONS[*]}" "${TARGETS[*]}" | sha256sum | cut -c1-12)
PREFIX=$CACHE/xrootd-$VERSION-$KEY
MARKER=$PREFIX/.storagescale-built
if [ -n "$PRINT_PREFIX" ]; then echo "$PREFIX"; exit 0; fi
PYTHON=python3
[ -x "$CHECKOUT/.venv/bin/python" ] && PYTHON=$CHECKOUT/.venv/bin/python
CLIENT_CMAKE_ARGS="-DENABLE_TESTS=OFF -DENABLE_XRDEC=OFF -DENABLE_FUSE=OFF -DENABLE_VOMS=OFF"
PY_TAG=$("$PYTHON" -c 'import sys; print(sys.implementation.cache_tag)')
CLIENT_KEY=$(printf '%s\n' "$VERSION" "$KEY" "$CLIENT_CMAKE_ARGS" "$PY_TAG" | sha256sum | cut -c1-12)
CLIENT_PREFIX=$CACHE/xrootd-client-$VERSION-$CLIENT_KEY
if [ -n "$PRINT_CLIENT_PREFIX" ]; then echo "$CLIENT_PREFIX"; exit 0; fi
run() { if [ -n "$DRY_RUN" ]; then echo "build-xrootd6 (dry run): $*"; else "$@"; fi; }
elf_files() {  # the regular ELF files (programs, libraries, plug-ins) of bin/ and lib/
    local file
    { find "$PREFIX/bin" "$PREFIX/lib" -type f 2>/dev/null || true; } | sort | while read -r file; do
        if [ "$(od -An -tx1 -N4 "$file" | tr -d ' \n')" = 7f454c46 ]; then
            printf '%s\n' "$file"
        fi
    done
}
runpath_problems() {  # each ELF file whose RUNPATH/RPATH is not exactly $PREFIX/lib
    local file paths
    if ! command -v readelf >/dev/null; then
        echo "readelf is missing (apt-get install binutils)"; return 0
    fi
    elf_files | while read -r file; do
        paths=$(readelf -d "$file" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p')
        if [ -n "$paths" ] && [ "$paths" != "$PREFIX/lib" ]; then echo "$file: [$paths]"; fi
    done
}
fix_runpath() {  # every ELF file's RUNPATH (when it has one) set to $PREFIX/lib only
    local file left
    if [ -z "$DRY_RUN" ] && ! command -v patchelf >/dev/null; then
        echo "build-xrootd6: 'patchelf' is missing: run scripts/bootstrap.sh servers (it" \
             "installs the build dependencies)" >&2
        exit 1
    fi
    elf_files | while read -r file; do
        if readelf -d "$file" | grep -E '\((RUNPATH|RPATH)\)' >/dev/null; then
            run patchelf --set-rpath "$PREFIX/lib" "$file"
        fi
    done
    [ -z "$DRY_RUN" ] || return 0
    left=$(runpath_problems)
    if [ -n "$left" ]; then
        echo "build-xrootd6: the library search path is still wrong: $left" >&2
        exit 1
    fi
}
already_built() {
    [ -f "$MARKER" ] || return 0
    local problems
    problems=$(runpath_problems)
    if [ -z "$problems" ]; then
        echo "build-xrootd6: XRootD $VERSION already built in $PREFIX"; exit 0
    fi
    [ -n "${1:-}" ] || return 0  # repaired under the lock, below
    echo "build-xrootd6: XRootD $VERSION in $PREFIX was built by an older copy of this" \
         "script: its programs and libraries look for libraries in a folder that is gone" \
         "and in the working directory; repairing (RUNPATH $PREFIX/lib):"
    echo "$problems" | sed -n '1,5s/^/  /p'
    fix_runpath
    if [ -n "$DRY_RUN" ]; then echo "build-xrootd6 (dry run): nothing repaired"; exit 0; fi
    grep -v '^runpath=' "$MARKER" >"$MARKER.tmp" || true
    echo "runpath=$PREFIX/lib" >>"$MARKER.tmp"
    mv "$MARKER.tmp" "$MARKER"
    echo "build-xrootd6: XRootD $VERSION in $PREFIX repaired"
    exit 0
}
client_problems() {  # each ELF file of the client environment whose RUNPATH is not $ORIGIN
    local file paths
    find "$CLIENT_PREFIX/python" -type f -name '*.so*' 2>/dev/null | sort | while read -r file; do
        paths=$(readelf -d "$file" | sed -n 's/.*(\(RUNPATH\|RPATH\)).*\[\(.*\)\]$/\2/p')
        if [ -n "$paths" ] && [ "$paths" != '$ORIGIN' ]; then echo "$file: [$paths]"; fi
    done
}
build_client() {
    local work started left tool
    if [ -f "$CLIENT_PREFIX/.storagescale-built" ] && [ -z "$(client_problems)" ]; then
        echo "build-xrootd6: the XRootD $VERSION client environment is already built in" \
             "$CLIENT_PREFIX"
        return 0
    fi
    for tool in cmake make g++ patchelf readelf; do
        command -v "$tool" >/dev/null || { echo "build-xrootd6: '$tool' is missing: run" \
            "scripts/bootstrap.sh servers (it installs the build dependencies)" >&2; exit 1; }
    done
    "$PYTHON" -c 'import sysconfig, os, sys; sys.exit(not os.path.isfile(os.path.join(
        sysconfig.get_paths()["include"], "Python.h")))' || { echo "build-xrootd6: the" \
        "Python headers are missing (Python.h): run scripts/bootstrap.sh servers (it" \
        "installs python3-dev)" >&2; exit 1; }
    started=$(date +%s)
    work=$CACHE/build-xrootd-client-$VERSION-$CLIENT_KEY
    echo "build-xrootd6: building the XRootD $VERSION client environment (Python bindings)" \
         "into $CLIENT_PREFIX (5-15 minutes on 2 busy cores)"
    run rm -rf "$CLIENT_PREFIX" "$work"
    run mkdir -p "$work" "$CLIENT_PREFIX/bin"
    # the sdist's own setup.py: XRDCL_LIB_ONLY, the libraries and plug-ins beside the
    # extension (RUNPATH $ORIGIN); TMPDIR: its build folder in the work folder
    if [ -n "$DRY_RUN" ]; then
        echo "build-xrootd6 (dry run): pip install --target $CLIENT_PREFIX/python $SDIST"
    else
        CMAKE_ARGS="$CLIENT_CMAKE_ARGS" CMAKE_BUILD_PARALLEL_LEVEL=$JOBS TMPDIR=$work \
            nice -n 19 "$PYTHON" -m pip install --no-deps --no-build-isolation \
            --no-cache-dir --no-compile --target "$CLIENT_PREFIX/python" "$SDIST" \
            >"$work/pip.log" 2>&1 || { echo "build-xrootd6: the client build failed: see" \
                                       "$work/pip.log" >&2; tail -30 "$work/pip.log" >&2; exit 1; }
    fi
    for tool in xrdcp xrdfs xrdadler32; do
        run ln -sfn "$PREFIX/bin/$tool" "$CLIENT_PREFIX/bin/$tool"
    done
    [ -z "$DRY_RUN" ] || return 0
    find "$CLIENT_PREFIX/python" -type f -name '*.so*' | while read -r file; do
        if readelf -d "$file" | grep -E '\((RUNPATH|RPATH)\)' >/dev/null; then
            patchelf --set-rpath '$ORIGIN' "$file"
        fi
    done
    left=$(client_problems)
    if [ -n "$left" ]; then
        echo "build-xrootd6: the client's library search path is still wrong: $left" >&2
        exit 1
    fi
    PYTHONPATH=$CLIENT_PREFIX/python "$PYTHON" -c 'import XRootD.client, pyxrootd.client, sys
from importlib import metadata
sys.exit(metadata.version("xrootd") != sys.argv[1])' "$VERSION" \
        || { echo "build-xrootd6: the built bindings do not load as $VERSION" >&2; exit 1; }
    {
        echo "version=$VERSION"
        echo "key=$CLIENT_KEY"
        echo "server_prefix=$PREFIX"
        echo "cmake_args=$CLIENT_CMAKE_ARGS"
        echo "python=$PY_TAG"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "build_seconds=$(( $(date +%s) - started ))"
        echo "size_bytes=$(du -sb "$CLIENT_PREFIX" | cut -f1)"
    } >"$CLIENT_PREFIX/.storagescale-built.tmp"
    mv "$CLIENT_PREFIX/.storagescale-built.tmp" "$CLIENT_PREFIX/.storagescale-built"
    rm -rf "$work"
    echo "build-xrootd6: the XRootD $VERSION client environment built in $CLIENT_PREFIX in" \
         "$(( $(date +%s) - started )) s"
}
if [ -n "$CLIENT" ]; then
    # the server's build first (its tools, its sdist), then the client's, one at a time
    bash "$0" ${DRY_RUN:+--dry-run}
    mkdir -p "$CACHE"
    exec 9>"$CACHE/xrootd-$VERSION.lock"
    flock 9
    SDIST=$CACHE/sdist/xrootd-$VERSION.tar.gz
    [ -f "$SDIST" ] || { echo "build-xrootd6: $SDIST is missing: run the script without" \
                              "--client first" >&2; exit 1; }
    [ "$(sha256sum "$SDIST" | cut -d' ' -f1)" = "$SDIST_SHA256" ] || {
        echo "build-xrootd6: $SDIST is not PyPI's xrootd-$VERSION.tar.gz (sha256): delete" \
             "it and run the script again" >&2; exit 1; }
    build_client
    exit 0
fi
already_built
# one build at a time on a machine (two make test set-ups): the second waits, then finds it
mkdir -p "$CACHE"
exec 9>"$CACHE/xrootd-$VERSION.lock"
flock 9
already_built repair

SHARED=${STORAGESCALE_SHARED:-$CHECKOUT/../shared}
[ -d "$SHARED/xrootd6/vendor" ] || SHARED=/work/shared
VENDOR=$SHARED/xrootd6/vendor
if [ ! -f "$VENDOR/inih/INIReader.h" ] || [ ! -f "$VENDOR/picojson/picojson.h" ]; then
    echo "build-xrootd6: the vendored headers are missing: expected" \
         "$VENDOR/inih/INIReader.h and $VENDOR/picojson/picojson.h (set" \
         "STORAGESCALE_SHARED to the folder holding xrootd6/vendor)" >&2
    exit 1
fi
for tool in cmake make g++ pkg-config patchelf readelf; do
    command -v "$tool" >/dev/null || { echo "build-xrootd6: '$tool' is missing: run" \
        "scripts/bootstrap.sh servers (it installs the build dependencies)" >&2; exit 1; }
done
logged() {  # logged FILE WHAT command...: its output into FILE; on failure FILE's tail
    local file=$1 what=$2
    shift 2
    if [ -n "$DRY_RUN" ]; then echo "build-xrootd6 (dry run): $* > $file"; return 0; fi
    "$@" >"$file" 2>&1 || { echo "build-xrootd6: $what failed: see $file" >&2
                            tail -30 "$file" >&2; exit 1; }
}

SDIST_DIR=$CACHE/sdist
SDIST=$SDIST_DIR/xrootd-$VERSION.tar.gz
WORK=$CACHE/build-xrootd-$VERSION-$KEY
started=$(date +%s)
echo "build-xrootd6: building XRootD $VERSION into $PREFIX (15-30 minutes on 2 busy cores)"
verify_sdist() {  # verify_sdist FILE: exit 1 unless FILE has the pinned sha256
    local got
    got=$(sha256sum "$1" | cut -d' ' -f1)
    [ "$got" = "$SDIST_SHA256" ] && return 0
    echo "build-xrootd6: $1 is not PyPI's xrootd-$VERSION.tar.gz: its sha256 is $got," \
         "the pinned one (SDIST_SHA256 in scripts/build-xrootd6.sh) $SDIST_SHA256." \
         "Delete it and run the script again to download it anew; if PyPI's file" \
         "changed, check why before changing the pin." >&2
    exit 1
}
run mkdir -p "$SDIST_DIR"
if [ ! -f "$SDIST" ]; then
    # pip checks the pin as it downloads (--require-hashes); into a folder of its own,
    # moved in place once verified: a partial or foreign file never sits in the cache
    run rm -rf "$SDIST_DIR/download"
    run mkdir -p "$SDIST_DIR/download"
    [ -n "$DRY_RUN" ] || echo "xrootd==$VERSION --hash=sha256:$SDIST_SHA256" \
        >"$SDIST_DIR/download/requirements.txt"
    run "$PYTHON" -m pip download --quiet --no-deps --no-binary :all: --no-build-isolation \
        --require-hashes -r "$SDIST_DIR/download/requirements.txt" --dest "$SDIST_DIR/download"
    [ -n "$DRY_RUN" ] || verify_sdist "$SDIST_DIR/download/xrootd-$VERSION.tar.gz"
    run mv "$SDIST_DIR/download/xrootd-$VERSION.tar.gz" "$SDIST"
    run rm -rf "$SDIST_DIR/download"
fi
# a cached copy too (a dry run checks it as well: it reads, changes nothing)
[ ! -f "$SDIST" ] || verify_sdist "$SDIST"
# a partial earlier attempt is thrown away whole: a prefix without the marker, a build tree
run rm -rf "$PREFIX" "$WORK"
run mkdir -p "$WORK"
run tar -xzf "$SDIST" -C "$WORK"
SRC=$WORK/xrootd-$VERSION
run cp -r "$VENDOR" "$SRC/vendor"
run rm -f "$SRC/vendor/README.vendor"
logged "$WORK/cmake.log" cmake nice -n 19 cmake -S "$SRC" -B "$WORK/build" \
    -DCMAKE_INSTALL_PREFIX="$PREFIX" "${CMAKE_OPTIONS[@]}"
logged "$WORK/make.log" "the build" nice -n 19 make -C "$WORK/build" -j"$JOBS" "${TARGETS[@]}"
run mkdir -p "$PREFIX/bin" "$PREFIX/lib"
run cp -a "$WORK/build/bin/." "$PREFIX/bin/"
run sh -c "cp -a '$WORK/build/lib/'*.so* '$PREFIX/lib/'"
# RelWithDebInfo's debug sections are 9/10 of the size (110 MB -> ~11 MB): dropped
run find "$PREFIX/bin" "$PREFIX/lib" -type f -exec strip --strip-debug {} +
# the build tree's RUNPATH (the deleted build folder, the working directory): lib/ only
fix_runpath
if [ -z "$DRY_RUN" ]; then
    LD_LIBRARY_PATH=$PREFIX/lib "$PREFIX/bin/xrootd" -v 2>&1 | grep -q "v$VERSION" \
        || { echo "build-xrootd6: the built xrootd does not say v$VERSION" >&2; exit 1; }
    # the marker, last: its presence means a whole build
    {
        echo "version=$VERSION"
        echo "key=$KEY"
        echo "cmake_options=${CMAKE_OPTIONS[*]}"
        echo "targets=${TARGETS[*]}"
        echo "runpath=$PREFIX/lib"
        echo "built=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
        echo "build_seconds=$(( $(date +%s) - started ))"
        echo "size_bytes=$(du -sb "$PREFIX" | cut -f1)"
    } >"$MARKER.tmp"
    mv "$MARKER.tmp" "$MARKER"
    rm -rf "$WORK"
fi
[ -n "$DRY_RUN" ] || echo "build-xrootd6: XRootD $VERSION built in $PREFIX in $(( $(date +%s) - started )) s"
