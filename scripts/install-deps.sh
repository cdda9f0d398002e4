#!/bin/sh
# Installs the Debian packages Baton builds and tests with, when they are
# missing. The Makefile runs it once per build directory; it is safe to run
# again. Needs root (or sudo) only when something is actually missing.
# install-deps.sh --check: exit 1 when something is missing, install nothing.
set -eu

pkgs="build-essential pkg-config libnng-dev nng-utils libmsgpack-dev
      libxxhash-dev libjansson-dev libinih-dev libsystemd-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      python3 python3-msgpack python3-yaml systemd clang libclang-rt-14-dev
      prometheus scdoc groff-base"

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
[ -z "$missing" ] && exit 0
if [ "${1:-}" = "--check" ]; then
	echo "install-deps: missing:$missing" >&2
	exit 1
fi

echo "install-deps: installing:$missing" >&2
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >&2 || echo "install-deps: apt-get update failed, trying the cached lists" >&2
# shellcheck disable=SC2086
$sudo apt-get install -y -q --no-install-recommends $missing >&2
