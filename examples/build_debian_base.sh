#!/usr/bin/env bash
# Builds a Debian 12 (bookworm) base layer with Python and uploads it as
# debian:12 (or $NAME), for examples/rl_rollout.py and `dsec bench fncall`.
#
#   sudo examples/build_debian_base.sh                # debootstrap from the Debian mirror
#   sudo examples/build_debian_base.sh --from-host    # no network: this host's python3 + busybox
#
# Needs root, a running server ($DSEC_URL, $DSEC_API_KEY or ./.dsec/admin.key)
# and bin/dsec (make build). If this dsec has `dsec layer build --debootstrap`
# (the layer work in progress), that is used instead of the steps below.
set -euo pipefail

NAME=${NAME:-debian:12}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
INCLUDE=${INCLUDE:-python3}
DSEC=${DSEC:-$(cd "$(dirname "$0")/.." && pwd)/bin/dsec}
MODE=debootstrap
[[ "${1:-}" == "--from-host" ]] && MODE=host

if [[ $MODE == debootstrap ]] && "$DSEC" layer build -h 2>&1 | grep -q -- '--debootstrap'; then
	exec "$DSEC" layer build --kind base --debootstrap "$SUITE" --include "$INCLUDE" --name "$NAME"
fi

work=$(mktemp -d /var/tmp/dsec-base.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"

if [[ $MODE == debootstrap ]]; then
	command -v debootstrap >/dev/null || { echo "needs debootstrap: apt-get install debootstrap" >&2; exit 1; }
	echo "debootstrap $SUITE (minbase + $INCLUDE) into $root ..." >&2
	debootstrap --variant=minbase --include="$INCLUDE" "$SUITE" "$root" "$MIRROR" >&2
	# Caches and logs are not part of an image.
	rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/var/log/*
else
	# A real, smaller base without network: this host's python3, its shared
	# libraries and standard library, and a static busybox for the shell.
	py=$(readlink -f /usr/bin/python3)
	ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	mkdir -p "$root"/bin "$root"/usr/bin "$root"/usr/lib "$root"/tmp "$root"/etc
	cp -a /bin/busybox "$root"/bin/busybox
	for t in $("$root"/bin/busybox --list); do [[ $t == busybox ]] || ln -sf busybox "$root/bin/$t"; done
	cp "$py" "$root"/usr/bin/python$ver
	ln -sf python$ver "$root"/usr/bin/python3
	cp -a /usr/lib/python$ver "$root"/usr/lib/
	rm -rf "$root"/usr/lib/python$ver/test "$root"/usr/lib/python$ver/*/__pycache__
	for lib in $(ldd "$py" | grep -o '/[^ ]*'); do
		mkdir -p "$root$(dirname "$lib")"
		cp -L "$lib" "$root$lib"
	done
	# Extension modules' own libraries (ssl, zlib, sqlite, ...).
	for so in "$root"/usr/lib/python$ver/lib-dynload/*.so; do
		for lib in $(ldd "$so" 2>/dev/null | grep -o '/[^ ]*'); do
			[[ -e "$root$lib" ]] || { mkdir -p "$root$(dirname "$lib")"; cp -L "$lib" "$root$lib"; }
		done
	done
	echo "root:x:0:0:root:/root:/bin/sh" > "$root"/etc/passwd
	echo "root:x:0:" > "$root"/etc/group
	chmod 1777 "$root"/tmp
fi
"$DSEC" layer build --kind base --name "$NAME" "$root"
