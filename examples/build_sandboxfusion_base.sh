#!/usr/bin/env bash
# Builds the base layer SandboxFusion's /run_code runs in (dsec server
# --sandboxfusion-layers, default sandboxfusion:latest): bash, python3 with
# pytest, gcc/g++, Go and Node.js, and uploads it public.
#
#   sudo examples/build_sandboxfusion_base.sh              # debootstrap from the Debian mirror
#   sudo examples/build_sandboxfusion_base.sh --from-host  # no network: this host's installed
#                                                          # packages (bash, python3, g++ and what
#                                                          # they depend on), copied file by file
#
# Needs root, a running server ($DSEC_URL, $DSEC_API_KEY or ./.dsec/admin.key)
# and bin/dsec (make build). INCLUDE adds Debian packages (rustc,
# default-jdk-headless, php-cli, ruby, lua5.4 ...: each language whose
# toolchain is in the base works).
set -euo pipefail

NAME=${NAME:-sandboxfusion:latest}
SUITE=${SUITE:-bookworm}
INCLUDE=${INCLUDE:-python3,python3-pytest,g++,golang-go,nodejs}
HOST_PACKAGES=${HOST_PACKAGES:-bash coreutils python3 g++}
# With --from-host: packages and files left out, needed by none of the
# toolchains at run time (perl comes in through dpkg; LTO, sanitizers, gcc
# plugins, the C-only cc1 and Python's own tests).
HOST_EXCLUDE=${HOST_EXCLUDE:-'^(perl|perl-base|perl-modules-.*|libperl.*|dpkg|lib(a|t|l|ub|hwa)san[0-9]+)$'}
HOST_EXCLUDE_FILES=${HOST_EXCLUDE_FILES:-'/(lto1|lto-dump[^/]*|cc1|lib(a|t|l|ub|hwa)san[^/]*)$|/gcc/x86_64-linux-gnu/[0-9]+/plugin/|^/usr/lib/python3[^/]*/(test|idlelib|tkinter|ensurepip|lib2to3|pydoc_data)/|^/usr/share/(doc|man|info|locale|lintian)/'}
DSEC=${DSEC:-$(cd "$(dirname "$0")/.." && pwd)/bin/dsec}
PUBLIC=${PUBLIC---public}

if [[ "${1:-}" != "--from-host" ]]; then
	exec "$DSEC" layer build --kind base --debootstrap "$SUITE" --include "$INCLUDE" --name "$NAME" $PUBLIC
fi

work=$(mktemp -d /var/tmp/dsec-sfbase.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"/etc

# The installed packages the wanted ones need, recursively (Depends and
# Pre-Depends; virtual packages resolve to what is installed).
installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
# shellcheck disable=SC2086
pkgs=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
	--no-replaces --no-enhances $HOST_PACKAGES 2>/dev/null | grep -v '^ ' | grep -v '<' | sort -u)
n=0
: > "$work/files"
for p in $pkgs; do
	installed "$p" || continue
	[[ $p =~ $HOST_EXCLUDE ]] && continue
	# Files and links (directories come with them), no documentation.
	dpkg -L "$p" | grep -Ev "$HOST_EXCLUDE_FILES" | while read -r f; do
		if [[ -L "$f" || (-e "$f" && ! -d "$f") ]]; then echo "${f#/}"; fi
	done >> "$work/files"
	n=$((n + 1))
done
echo "copying $(wc -l < "$work/files") files of $n packages" >&2
# Debian 12 is merged-/usr: /bin, /lib ... are links into /usr; the files
# go to their real place and the links are made after.
grep -Ev '^(bin|sbin|lib|lib32|lib64|libx32)$' "$work/files" | sort -u > "$work/files.u"
tar -C / --no-recursion -cf - -T "$work/files.u" \
	--transform 's,^\(bin\|sbin\|lib\|lib32\|lib64\|libx32\)/,usr/\1/,' | tar -C "$root" -xpf -
cp -a /etc/ld.so.cache "$root"/etc/ 2>/dev/null || true
for d in bin sbin lib lib64; do
	if [[ -L /$d ]]; then ln -sfn "usr/$d" "$root/$d"; fi
done
# Alternatives (c++, cc, python ...) are links under /etc/alternatives.
mkdir -p "$root"/etc/alternatives "$root"/tmp "$root"/root
for l in /etc/alternatives/*; do cp -a "$l" "$root/etc/alternatives/" 2>/dev/null || true; done
echo "root:x:0:0:root:/root:/bin/bash" > "$root"/etc/passwd
echo "root:x:0:" > "$root"/etc/group
chmod 1777 "$root"/tmp
"$DSEC" layer build --kind base --name "$NAME" $PUBLIC "$root"
