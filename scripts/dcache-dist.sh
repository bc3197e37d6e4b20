#!/usr/bin/env bash
# Fills the dCache distribution cache that `--storage-embedded dcache` starts releases
# from, once per machine, outside the checkout:
#
#   $STORAGESCALE_DCACHE_DIST, else $XDG_CACHE_HOME/pytest-storagescale/dcache/
#   (default ~/.cache)   dcache-10.2.25.tar.gz  dcache-11.2.5.tar.gz
#
# The tarballs are assembled by the shared dCache folder's `assemble VERSION DIR`
# ($STORAGESCALE_SHARED/dcache, default <checkout>/../shared, then /work/shared): its
# thin tarball plus the third-party jars fetched from Maven Central, each checked by
# its sha256 (about 2 minutes the first time). `assemble` writes a tarball under a
# temporary name and renames it last, so a tarball of the final name is whole; one
# that does not list as a gzip'd tar (a disk filled up, a copy by hand) is removed and
# assembled again. Without the shared folder it says so and does nothing: a site gives
# its own tarball with --storage-embedded-version PATH. Needs java 17 and maven (the
# set-up installs them). Run by scripts/bootstrap.sh servers|all (make test's set-up).
#
# Options: --print-dir prints the cache folder and exits; --dry-run prints what it
# would do.
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$(pwd)

VERSIONS=(10.2.25 11.2.5)
DRY_RUN=
for arg in "$@"; do
    case "$arg" in
        --print-dir) PRINT=1 ;;
        --dry-run) DRY_RUN=1 ;;
        *) echo "dcache-dist: unknown argument '$arg' (--print-dir, --dry-run)" >&2; exit 2 ;;
    esac
done
DIST=${STORAGESCALE_DCACHE_DIST:-${XDG_CACHE_HOME:-$HOME/.cache}/pytest-storagescale/dcache}
if [ -n "${PRINT:-}" ]; then echo "$DIST"; exit 0; fi

SHARED=${STORAGESCALE_SHARED:-}
if [ -z "$SHARED" ]; then
    for candidate in "$CHECKOUT/../shared" /work/shared; do
        if [ -x "$candidate/dcache/assemble" ]; then SHARED=$candidate; break; fi
    done
fi
ASSEMBLE=${SHARED:+$SHARED/dcache/assemble}
if [ -z "$ASSEMBLE" ] || [ ! -x "$ASSEMBLE" ]; then
    echo "dcache-dist: no shared dCache folder (\$STORAGESCALE_SHARED/dcache/assemble," \
         "../shared, /work/shared): the cache $DIST is left as it is; give a dCache" \
         "tarball with --storage-embedded-version PATH"
    exit 0
fi
for tool in java mvn python3; do
    command -v "$tool" >/dev/null || {
        echo "dcache-dist: $tool is missing: 'sudo apt-get install openjdk-17-jdk-headless" \
             "maven' (scripts/bootstrap.sh servers installs them)" >&2
        exit 1
    }
done

run() {  # a command, or with --dry-run the command printed
    if [ -n "$DRY_RUN" ]; then echo "dcache-dist (dry run): $*"; else "$@"; fi
}
run mkdir -p "$DIST"
for version in "${VERSIONS[@]}"; do
    tarball=$DIST/dcache-$version.tar.gz
    if [ -f "$tarball" ] && ! tar tzf "$tarball" >/dev/null 2>&1; then
        echo "dcache-dist: $tarball is broken or partial: assembling it again"
        run rm -f "$tarball"
    fi
    if [ ! -f "$tarball" ]; then
        echo "dcache-dist: assembling dCache $version into $DIST (Maven Central, ~2 min)"
        run "$ASSEMBLE" "$version" "$DIST" >/dev/null
    fi
done
