#!/usr/bin/env bash
# Installs the Debian packages whose real programs the tests and the demo start,
# only when their binaries are missing.
set -euo pipefail
need=()
command -v prometheus >/dev/null 2>&1 || need+=(prometheus)
command -v promtool >/dev/null 2>&1 || need+=(prometheus)
command -v prometheus-alertmanager >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v amtool >/dev/null 2>&1 || need+=(prometheus-alertmanager)
command -v haproxy >/dev/null 2>&1 || need+=(haproxy)
# the real-engine tests freeze only llama.cpp's inference-loop thread with gdb (non-stop mode)
command -v gdb >/dev/null 2>&1 || need+=(gdb)
# `make engines` builds llama.cpp's server from its pinned sdist
command -v cmake >/dev/null 2>&1 || need+=(cmake)
command -v g++ >/dev/null 2>&1 || need+=(g++)
# the PostgreSQL store's tests start a real server (initdb/pg_ctl, kept in /usr/lib/postgresql/*/bin)
command -v initdb >/dev/null 2>&1 || ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)
# `python3 -m venv` needs ensurepip, which Debian ships separately
python3 -c "import ensurepip, venv" >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -eq 0 ]; then exit 0; fi
pkgs=$(printf '%s\n' "${need[@]}" | sort -u | tr '\n' ' ')
echo "installing Debian packages: $pkgs"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
