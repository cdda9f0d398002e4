#!/bin/sh
# Installs the Debian packages Baton builds and tests with, when they are
# missing. The Makefile runs it once per build directory; it is safe to run
# again. Needs root (or sudo) only when a package is actually missing.
# install-deps.sh --check: exit 1 when something is missing, install nothing.
# install-deps.sh --plan: print what it would install and how (every item,
# installed or not), change nothing.
#
# promtool (the tests check /metrics, rules and the scrape configuration
# with it) comes from Debian's prometheus package, but installing that
# package starts and enables a Prometheus server. So the package is only
# downloaded (apt-get download, no root) and promtool alone is extracted
# (dpkg -x) into .deps/bin of this tree: no daemon, no unit, nothing
# outside the tree. A promtool already on PATH is used as it is.
#
# Node.js and npm (the OpenAI API tests run the `openai` npm client,
# unchanged): Debian's nodejs and npm packages, unless an npm is on PATH
# already (a Node.js from elsewhere, e.g. NodeSource's, brings its own
# npm, and Debian's npm package would conflict with it).
set -eu

pkgs="build-essential pkg-config libnng-dev nng-utils libmsgpack-dev
      libxxhash-dev libjansson-dev libinih-dev libsystemd-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      python3 python3-msgpack python3-yaml systemd clang libclang-rt-14-dev
      scdoc groff-base"
command -v npm >/dev/null 2>&1 || pkgs="$pkgs nodejs npm"
root=$(cd "$(dirname "$0")/.." && pwd)
promtool="$root/.deps/bin/promtool"

if [ "${1:-}" = "--plan" ]; then
	echo "apt-get install:" $pkgs
	echo "promtool: apt-get download prometheus; dpkg -x; install $promtool (no service)"
	exit 0
fi

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
need_promtool=1
if [ -x "$promtool" ] || command -v promtool >/dev/null 2>&1; then
	need_promtool=0
fi
[ -z "$missing" ] && [ "$need_promtool" -eq 0 ] && exit 0
if [ "${1:-}" = "--check" ]; then
	[ -n "$missing" ] && echo "install-deps: missing:$missing" >&2
	[ "$need_promtool" -eq 1 ] && echo "install-deps: missing: promtool ($promtool)" >&2
	exit 1
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=0
if [ -n "$missing" ]; then
	echo "install-deps: installing:$missing" >&2
	$sudo apt-get update -q >&2 || echo "install-deps: apt-get update failed, trying the cached lists" >&2
	updated=1
	# shellcheck disable=SC2086
	$sudo apt-get install -y -q --no-install-recommends $missing >&2
fi
if [ "$need_promtool" -eq 1 ]; then
	echo "install-deps: promtool from the prometheus package into $promtool (the package is not installed: no server)" >&2
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT
	if ! (cd "$tmp" && apt-get download -q prometheus >&2); then
		[ "$updated" -eq 1 ] || $sudo apt-get update -q >&2 || true
		(cd "$tmp" && apt-get download -q prometheus >&2)
	fi
	dpkg -x "$tmp"/prometheus_*.deb "$tmp/x"
	mkdir -p "$(dirname "$promtool")"
	install -m 0755 "$tmp/x/usr/bin/promtool" "$promtool.new"
	mv "$promtool.new" "$promtool"
	"$promtool" --version >/dev/null
fi
