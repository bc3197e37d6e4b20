#!/usr/bin/env bash
# Installs what pytest-storagescale needs on a Debian machine, sized to the command:
#
#   bootstrap.sh demo      what `make demo` needs: one xrootd on loopback
#   bootstrap.sh check     the demo's, plus the gfal2 bindings and the test tools (ruff,
#                          mypy, import-linter, pytest-xdist...) for `make check`
#   bootstrap.sh servers   the embedded server farm and the report tools: gfal2,
#                          Kerberos, SciTokens, grid proxies, Apache, GridFTP, Ceph,
#                          Chromium, Java, npm and the Allure command line (`make servers`)
#   bootstrap.sh all       check + servers: everything `make test` runs (the default)
#   bootstrap.sh upgrade   the demo's, plus XRootD 6.2.1 built once into ~/.cache (its
#                          build packages too): what `make upgrade-demo` needs
#
# Add --dry-run to print what would be installed and done, and do nothing.
#  1. system packages, installed with apt-get when run as root (with sudo -n when it
#     works), otherwise named with the command to run. A package's daemons are kept
#     from starting during the install (a policy-rc.d that refuses every start,
#     removed after): the embedded servers start their own private copies on loopback
#     when a test asks, and none is left running on the host;
#  2. .venv/ from Debian's own python3 with --system-site-packages, so that the
#     Debian-built bindings (python3-xrootd, python3-gfal2) are importable;
#  3. the plugin itself (editable): demo with the extras the embedded xrootd and its
#     root:// and davs:// doors need, check and all with the test extra (every extra);
#  4. the xrootd driver's compiled client loop, and the loopback-only library of the
#     embedded servers (pytest_storagescale/servers/loopback.c);
#  5. servers and all: the Allure command line (npm allure-commandline, runs on Java)
#     into .tools/, to turn allure-results into the HTML report.
# Re-running it is cheap: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PART=all
DRY_RUN=
for arg in "$@"; do
    case "$arg" in
        demo|check|servers|all|upgrade) PART=$arg ;;
        --dry-run) DRY_RUN=1 ;;
        *) echo "bootstrap: unknown argument '$arg': write one of demo, check, servers," \
                "all, upgrade (default all), optionally with --dry-run" >&2; exit 2 ;;
    esac
done

# the demo: the xrootd server (root:// and davs:// doors), its client, the bindings,
# the compiled client loop (g++ against libxrootd-client-dev), the HTTP driver
# (pycurl), client CPU (psutil) and the throwaway CA (openssl)
DEMO_PACKAGES=(xrootd-server xrootd-server-plugins xrootd-client python3-xrootd
               libxrootd-client-dev g++ python3-pycurl python3-psutil python3-venv openssl)
# make check: the gfal2 bindings too (the drivers' unit tests load every driver class)
CHECK_PACKAGES=(python3-gfal2)
# the server farm and the report check (Chromium)
SERVER_PACKAGES=(gfal2 gfal2-plugin-file gfal2-plugin-http gfal2-plugin-xrootd python3-gfal2
                 chromium chromium-driver)
# scripts/build-xrootd6.sh: XRootD 6.2.1 from source (--storage-embedded-version)
# (patchelf: the built files' library search path set to the prefix's lib/ only;
# python3-dev: its --client build of the 6.2.1 Python bindings, STORAGESCALE_XROOTD_CLIENT)
XROOTD6_BUILD_PACKAGES=(cmake make pkg-config libssl-dev zlib1g-dev uuid-dev libxml2-dev
                        libcurl4-openssl-dev libkrb5-dev libscitokens-dev libmacaroons-dev
                        libjson-c-dev patchelf python3-dev)
# installed without their recommends (Ceph's would add ceph-mgr and more)
LEAN_SERVER_PACKAGES=("${XROOTD6_BUILD_PACKAGES[@]}"
          # make bench: h2load beside the engine; stress-ng loads the machine while
          # benchmarks/bench_gate.py calibrates the gate (--stress N)
          nghttp2-client stress-ng
          # the embedded family (--storage-embedded): logins, WebDAV, GridFTP, Ceph
          krb5-kdc krb5-admin-server krb5-user xrootd-scitokens-plugins libscitokens0
          globus-proxy-utils voms-clients apache2 globus-gridftp-server-progs
          gfal2-plugin-gridftp ceph-mon ceph-osd ceph-common xrootd-ceph-plugins
          # the embedded CephFS (--storage-embedded cephfs): metadata server, FUSE client
          ceph-mds ceph-fuse
          # the embedded dCache (--storage-embedded dcache): its namespace's PostgreSQL;
          # maven (and java 17) for scripts/dcache-dist.sh
          postgresql maven
          # the embedded dCache's dcap and GridFTP doors: dccp, gfal2's dcap plug-in and
          # libdcap's GSI tunnel (gsidcap://), globus-url-copy
          dcap gfal2-plugin-dcap dcap-tunnel-gsi globus-gass-copy-progs
          # client hosts from a batch system (cluster/slurm.py, tests/test_slurm.py,
          # --storage-cluster embedded-slurm:N: servers/slurm_hosts.py): a SLURM
          # controller and one slurmd per namespace host, with the run's munge key; ip
          # for the namespace hosts' veths and routes
          slurmctld slurmd slurm-client munge iproute2
          # --storage-pushgateway's tests: a real Pushgateway and Prometheus on loopback
          prometheus prometheus-pushgateway)
# commands that may come from elsewhere on the machine (a JDK, nodesource's node):
# their Debian packages are installed only when the command is missing
command -v java >/dev/null || SERVER_PACKAGES+=(default-jre-headless)
command -v npm >/dev/null || SERVER_PACKAGES+=(npm)
SYSTEM_PYTHON=/usr/bin/python3
POLICY=/usr/sbin/policy-rc.d
ALLURE_VERSION=2.46.1

run() {  # a command, or with --dry-run the command printed
    if [ -n "$DRY_RUN" ]; then echo "bootstrap (dry run): $*"; else "$@"; fi
}
quiet() {  # run, its output dropped
    if [ -n "$DRY_RUN" ]; then run "$@"; else "$@" >/dev/null; fi
}
missing_of() {  # the named packages that are not installed
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || printf '%s\n' "$pkg"
    done
}
# Daemons of the installed packages must not start: a policy-rc.d that says 101
# (action forbidden) to invoke-rc.d and deb-systemd-invoke for the install, removed
# after it even when the install fails. A policy-rc.d the machine has already (a
# container's) is left as it is.
own_policy=
forbid_daemons() {
    [ -e "$POLICY" ] && return 0
    run "$@" sh -c "printf '#!/bin/sh\n# pytest-storagescale bootstrap: no daemon starts during its install\nexit 101\n' > $POLICY && chmod 755 $POLICY"
    own_policy=1
    trap allow_daemons EXIT
}
allow_daemons() {
    [ -n "$own_policy" ] || return 0
    run ${SUDO:+"$SUDO"} rm -f "$POLICY"
    own_policy=
}
SUDO=
updated=
install_packages() {  # install_packages [apt options...] -- packages...
    local options=() packages=()
    while [ "$1" != "--" ]; do options+=("$1"); shift; done
    shift
    mapfile -t packages < <(missing_of "$@")
    [ ${#packages[@]} -gt 0 ] || return 0
    if [ "$(id -u)" = 0 ]; then
        SUDO=
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        SUDO=sudo
    else
        echo "bootstrap: missing system packages: ${packages[*]}" >&2
        echo "bootstrap: install them with: sudo apt-get install ${options[*]} ${packages[*]}" >&2
        exit 1
    fi
    echo "bootstrap: installing system packages${SUDO:+ with sudo}: ${packages[*]}"
    forbid_daemons ${SUDO:+"$SUDO"}
    [ -n "$updated" ] || run ${SUDO:+"$SUDO"} apt-get update -qq
    updated=1
    quiet ${SUDO:+"$SUDO"} env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
        "${options[@]}" "${packages[@]}"
    allow_daemons
}

system_packages() {
    case "$PART" in
        demo) install_packages -- "${DEMO_PACKAGES[@]}" ;;
        upgrade) install_packages -- "${DEMO_PACKAGES[@]}"
                 install_packages --no-install-recommends -- "${XROOTD6_BUILD_PACKAGES[@]}" ;;
        check) install_packages -- "${DEMO_PACKAGES[@]}" "${CHECK_PACKAGES[@]}" ;;
        servers) install_packages -- "${SERVER_PACKAGES[@]}"
                 install_packages --no-install-recommends -- "${LEAN_SERVER_PACKAGES[@]}" ;;
        all) install_packages -- "${DEMO_PACKAGES[@]}" "${SERVER_PACKAGES[@]}"  # check's in it
             install_packages --no-install-recommends -- "${LEAN_SERVER_PACKAGES[@]}" ;;
    esac
}

python_environment() {  # .venv/ with the plugin: demo without the test extras (with pytest-xdist:
    # the README's `pytest -n N suites/<system>` runs after `make demo`; with
    # matplotlib, the report extra: make upgrade-demo ends with compare --html)
    local spec='.[xrootd,http,servers,report,xdist]' stamp=.venv/.storagescale-installed
    case "$PART" in demo|upgrade) ;; *) spec='.[test]'; stamp=.venv/.storagescale-installed-test ;; esac
    if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import XRootD' 2>/dev/null; then
        echo "bootstrap: creating .venv from $SYSTEM_PYTHON (with system site-packages)"
        run rm -rf .venv
        run "$SYSTEM_PYTHON" -m venv --system-site-packages .venv
    fi
    # the test install holds the demo's too
    if [ "$stamp" = .venv/.storagescale-installed ] && [ -f .venv/.storagescale-installed-test ] \
            && [ ! pyproject.toml -nt .venv/.storagescale-installed-test ]; then
        stamp=.venv/.storagescale-installed-test
    fi
    if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
        echo "bootstrap: installing pytest-storagescale ($spec) into .venv"
        run .venv/bin/python -m pip install -q --upgrade pip
        # Debian's ceph-mds depends on ceph-mgr, which puts old jaraco.* modules in the
        # system site-packages; setuptools >= 71 imports those before its own vendored
        # copies and fails ("cannot import name 'splat'"): current ones in .venv win
        run .venv/bin/python -m pip install -q --upgrade "jaraco.functools>=4" \
            "jaraco.text>=4" "jaraco.context>=5" "more-itertools>=10"
        run .venv/bin/python -m pip install -q -e "$spec"
        run touch "$stamp"
    fi
    # the xrootd driver's compiled client loop, built once per machine (else before
    # the first step that uses it)
    run .venv/bin/python -m pytest_storagescale.drivers.native
    # the library that keeps the embedded XRootD daemons on loopback (else built at the
    # first server start)
    run .venv/bin/python -m pytest_storagescale.servers.loopback
}

allure_command_line() {
    if [ ! -x .tools/node_modules/.bin/allure ]; then
        echo "bootstrap: installing the Allure command line $ALLURE_VERSION into .tools/"
        run mkdir -p .tools
        quiet npm install --silent --no-audit --no-fund --prefix .tools \
            "allure-commandline@$ALLURE_VERSION"
    fi
}

system_packages
case "$PART" in
    demo|check|upgrade) python_environment ;;
    servers) allure_command_line ;;
    all) python_environment; allure_command_line ;;
esac
# XRootD 6.2.1 into ~/.cache, once per machine (15-30 min the first time, then a no-op);
# then its client environment (the 6.2.1 Python bindings from the same sdist: 20-40 min)
case "$PART" in servers|all|upgrade) run bash scripts/build-xrootd6.sh ;; esac
case "$PART" in servers|all) run bash scripts/build-xrootd6.sh --client ;; esac
# the dCache releases of the shared folder into ~/.cache, once per machine (2 min)
case "$PART" in servers|all) run bash scripts/dcache-dist.sh ;; esac
