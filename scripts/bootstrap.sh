#!/usr/bin/env bash
# Installs what pytest-storagescale needs on a Debian machine, then builds .venv/.
#  1. system packages (xrootd server and client, the XRootD Python bindings, gfal2),
#     installed with apt-get when run as root, otherwise named with the command to run;
#  2. .venv/ from Debian's own python3 with --system-site-packages, so that the
#     Debian-built bindings (python3-xrootd, python3-gfal2) are importable;
#  3. the plugin itself (editable) with its test extras.
# Re-running it is cheap: every step is skipped when already done.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(xrootd-server xrootd-server-plugins xrootd-client python3-xrootd
          gfal2 gfal2-plugin-file gfal2-plugin-http gfal2-plugin-xrootd python3-gfal2
          python3-venv openssl)
SYSTEM_PYTHON=/usr/bin/python3

missing=()
for pkg in "${PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ]; then
        echo "bootstrap: installing system packages: ${missing[*]}"
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq "${missing[@]}" >/dev/null
    elif command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
        echo "bootstrap: installing system packages with sudo: ${missing[*]}"
        sudo apt-get update -qq
        sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "bootstrap: missing system packages: ${missing[*]}" >&2
        echo "bootstrap: install them with: sudo apt-get install ${missing[*]}" >&2
        exit 1
    fi
fi

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
