#!/bin/sh
# install-deps.sh [--check|--plan] [SET...]: installs the Debian packages
# Baton needs, when they are missing; safe to run again. Needs root (or
# sudo) only when a package is actually missing.
#
# The sets, each what its targets need (a later set assumes the build set):
#   build  what `make`, `make demo`, `make man` and the README's quick start
#          need: the compiler and the libraries, python3 (the demo's front
#          door part), scdoc, man-db and curl
#   test   what `make test` needs in addition: the Python test modules,
#          nng-utils, systemd (systemd-analyze), Node.js and npm (the
#          `openai` npm client), chromium and chromium-driver (the
#          dashboard test), promtool (below)
#   fuzz   what `make fuzz` needs in addition: clang and its runtimes
#   all    every set (the default when no set is named)
# The Makefile runs it once per build directory and set (the stamps
# $(BUILD)/.deps, .deps-test and .deps-fuzz).
#
# --check: exit 1 when something of the sets is missing, install nothing.
# --plan: print what it would install and how (every item, installed or
# not), change nothing.
#
# promtool (the tests check /metrics, rules and the scrape configuration
# with it) comes from Debian's prometheus package, but installing that
# package starts and enables a Prometheus server. So the package is only
# downloaded (apt-get download, no root) and promtool alone is extracted
# (dpkg -x) into .deps/bin of this tree: no daemon, no unit, nothing
# outside the tree. A promtool already on PATH is used as it is.
#
# Node.js and npm: Debian's nodejs and npm packages, unless an npm is on
# PATH already (a Node.js from elsewhere, e.g. NodeSource's, brings its own
# npm, and Debian's npm package would conflict with it). Debian 12's nodejs
# is Node 18 (bookworm-backports has none newer): the npm clients' suites
# run on it, but for LangChain's withStructuredOutput (Node 19's global
# crypto), which tests/node/sdks.mjs reports skipped and the test's line says.
set -eu

mode=""
case "${1:-}" in
--check | --plan) mode=$1; shift ;;
esac
[ $# -gt 0 ] || set -- all

build_pkgs="build-essential libnng-dev libmsgpack-dev
      libxxhash-dev libjansson-dev libinih-dev libsystemd-dev libpcre2-dev libutf8proc-dev libmicrohttpd-dev
      python3 scdoc groff-base man-db curl"
test_pkgs="nng-utils python3-msgpack python3-yaml python3-jinja2 python3-jsonschema systemd chromium chromium-driver"
command -v npm >/dev/null 2>&1 || test_pkgs="$test_pkgs nodejs npm"
fuzz_pkgs="clang libclang-rt-14-dev"

pkgs=$build_pkgs
want_promtool=0
for set in "$@"; do
	case $set in
	build) ;;
	test) pkgs="$pkgs $test_pkgs"; want_promtool=1 ;;
	fuzz) pkgs="$pkgs $fuzz_pkgs" ;;
	all) pkgs="$pkgs $test_pkgs $fuzz_pkgs"; want_promtool=1 ;;
	*) echo "install-deps: unknown set '$set' (build, test, fuzz or all)" >&2; exit 2 ;;
	esac
done
uniq=""
for p in $pkgs; do
	case " $uniq " in *" $p "*) ;; *) uniq="$uniq $p" ;; esac
done
pkgs=$uniq
root=$(cd "$(dirname "$0")/.." && pwd)
promtool="$root/.deps/bin/promtool"

if [ "$mode" = "--plan" ]; then
	echo "apt-get install:" $pkgs
	[ "$want_promtool" -eq 1 ] &&
		echo "promtool: apt-get download prometheus; dpkg -x; install $promtool (no service)"
	exit 0
fi

missing=""
for p in $pkgs; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
		missing="$missing $p"
	fi
done
need_promtool=$want_promtool
if [ -x "$promtool" ] || command -v promtool >/dev/null 2>&1; then
	need_promtool=0
fi
[ -z "$missing" ] && [ "$need_promtool" -eq 0 ] && exit 0
if [ "$mode" = "--check" ]; then
	[ -n "$missing" ] && echo "install-deps: missing:$missing" >&2
	[ "$need_promtool" -eq 1 ] && echo "install-deps: missing: promtool ($promtool)" >&2
	exit 1
fi

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=0
if [ -n "$missing" ]; then
	echo "install-deps ($*): installing:$missing" >&2
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
