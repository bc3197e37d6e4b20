#!/usr/bin/env bash
# Installs what pytest-storagescale needs on a Debian machine, then builds .venv/.
#  1. system packages (xrootd server and client, the XRootD Python bindings, gfal2),
#     installed with apt-get when run as root, otherwise named with the command to run;
#  2. .venv/ from Debian's own python3 with --system-site-packages, so that the
#     Debian-built bindings (python3-xrootd, python3-gfal2) are importable;
#  3. the plugin itself (editable) with its test extras.
#  4. the Allure command line (npm allure-commandline, runs on Java) into .tools/,
#     to turn allure-results into the HTML report (the tests check it in Chromium).
# Re-running it is cheap: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(xrootd-server xrootd-server-plugins xrootd-client python3-xrootd
          gfal2 gfal2-plugin-file gfal2-plugin-http gfal2-plugin-xrootd python3-gfal2
          python3-venv openssl chromium chromium-driver)
# installed without their recommends (Ceph's would add ceph-mgr and more)
LEAN_PACKAGES=(
          # native HTTP driver and client-CPU accounting
          python3-pycurl python3-psutil
          # make bench: the C++ XrdCl loop and h2load beside the engine
          libxrootd-client-dev g++ nghttp2-client
          # the embedded family (--storage-embedded): logins, WebDAV, GridFTP, Ceph
          krb5-kdc krb5-admin-server krb5-user xrootd-scitokens-plugins libscitokens0
          globus-proxy-utils voms-clients apache2 globus-gridftp-server-progs
          gfal2-plugin-gridftp ceph-mon ceph-osd ceph-common xrootd-ceph-plugins)
# commands that may come from elsewhere on the machine (a JDK, nodesource's node):
# their Debian packages are installed only when the command is missing
command -v java >/dev/null || PACKAGES+=(default-jre-headless)
command -v npm >/dev/null || PACKAGES+=(npm)
SYSTEM_PYTHON=/usr/bin/python3

missing_of() {  # the named packages that are not installed
    for pkg in "$@"; do
        dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" \
            || printf '%s\n' "$pkg"
    done
}
install_packages() {  # install_packages [apt options...] -- packages...
    local options=() packages=()
    while [ "$1" != "--" ]; do options+=("$1"); shift; done
    shift
    mapfile -t packages < <(missing_of "$@")
    [ ${#packages[@]} -gt 0 ] || return 0
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing system packages: ${packages[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${options[@]}" "${packages[@]}" >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        echo "bootstrap: installing system packages with sudo: ${packages[*]}"
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${options[@]}" \
            "${packages[@]}" >/dev/null
    else
        echo "bootstrap: missing system packages: ${packages[*]}" >&2
        echo "bootstrap: install them with: sudo apt-get install ${options[*]} ${packages[*]}" >&2
        exit 1
    fi
}
install_packages -- "${PACKAGES[@]}"
install_packages --no-install-recommends -- "${LEAN_PACKAGES[@]}"

if [ ! -x .venv/bin/python ] || ! .venv/bin/python -c 'import XRootD' 2>/dev/null; then
    echo "bootstrap: creating .venv from $SYSTEM_PYTHON (with system site-packages)"
    rm -rf .venv
    "$SYSTEM_PYTHON" -m venv --system-site-packages .venv
fi
stamp=.venv/.storagescale-installed
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
    echo "bootstrap: installing pytest-storagescale into .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    .venv/bin/python -m pip install -q -e '.[test]'
    touch "$stamp"
fi
# the xrootd driver's compiled client loop, built once per machine (else before the
# first step that uses it)
.venv/bin/python -m pytest_storagescale.drivers.native

ALLURE_VERSION=2.46.1
if [ ! -x .tools/node_modules/.bin/allure ]; then
    echo "bootstrap: installing the Allure command line $ALLURE_VERSION into .tools/"
    mkdir -p .tools
    npm install --silent --no-audit --no-fund --prefix .tools "allure-commandline@$ALLURE_VERSION" >/dev/null
fi
