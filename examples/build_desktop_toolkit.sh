#!/usr/bin/env bash
# Builds the desktop toolkit layer (default desktop:toolkit): an X server
# (Xvfb), a window manager if one is installed on the host (matchbox,
# openbox, jwm, icewm), a terminal (xterm) and a VNC server of the screen
# (x11vnc, if installed on the host), with scripts in /etc/dsec/autostart.d
# that the sandbox's init (dsec-agent) runs at start and after each reset.
# Stack it on any base: a container of it has a screen
# (GET /v1/sandboxes/{id}/screen, POST …/input, the …/vnc WebSocket).
#
#   examples/build_desktop_toolkit.sh   # this host's installed packages (xvfb, xterm and
#                                       # what they depend on), copied file by file: no network
#
# Needs root, the packages installed (apt-get install xvfb xterm x11vnc),
# a running server ($DSEC_URL, $DSEC_API_KEY or ./.dsec/admin.key) and
# bin/dsec (make build). HOST_PACKAGES adds packages (a browser ...);
# GEOMETRY sets the screen (default 1024x768x24); VNC=no leaves x11vnc out
# (VNC=yes requires it; the default takes it if the host has it).
set -euo pipefail

NAME=${NAME:-desktop:toolkit}
HOST_PACKAGES=${HOST_PACKAGES:-xvfb xterm}
GEOMETRY=${GEOMETRY:-1024x768x24}
VNC=${VNC:-auto}
# Left out: what Xvfb, xterm and x11vnc never load (Mesa's DRI drivers
# and LLVM, used for GLX only, which Xvfb then turns off; Tcl/Tk, for
# x11vnc's -gui only; the openssl program; time zones), package tools, and
# documentation.
HOST_EXCLUDE=${HOST_EXCLUDE:-'^(perl|perl-base|perl-modules-.*|libperl.*|dpkg|tar|libgl1-mesa-dri|libllvm[0-9]+|libz3-[0-9]+|libicu[0-9]+|libxml2|libsensors.*|libdrm-(amdgpu|nouveau|radeon|intel).*|fonts-.*|tk|tk8\.[0-9]+|libtk8\.[0-9]+|tcl|tcl8\.[0-9]+|libtcl8\.[0-9]+|openssl|tzdata)$'}
HOST_EXCLUDE_FILES=${HOST_EXCLUDE_FILES:-'^/usr/share/(doc|man|info|locale|lintian|bug|menu|icons|pixmaps|applications)/'}
DSEC=${DSEC:-$(cd "$(dirname "$0")/.." && pwd)/bin/dsec}
PUBLIC=${PUBLIC---public}

work=$(mktemp -d /var/tmp/dsec-desktop.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
mkdir -p "$root"

installed() { dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"; }
for p in $HOST_PACKAGES; do
	installed "$p" || { echo "package $p is not installed (apt-get install $HOST_PACKAGES)" >&2; exit 1; }
done
wm=""
for p in matchbox-window-manager openbox jwm icewm; do
	if installed "$p"; then wm=$p; break; fi
done
vnc=""
case $VNC in
no) ;;
yes) installed x11vnc || { echo "package x11vnc is not installed (apt-get install x11vnc)" >&2; exit 1; }; vnc=x11vnc ;;
*) if installed x11vnc; then vnc=x11vnc; else echo "x11vnc is not installed: the desktop will have no VNC (apt-get install x11vnc)" >&2; fi ;;
esac
# The installed packages the wanted ones need, recursively (Depends and
# Pre-Depends; a virtual package resolves to an installed provider), and
# their files: read from dpkg's database in one pass (a dpkg call per
# package takes minutes on a loaded machine).
# shellcheck disable=SC2086
python3 - "$HOST_EXCLUDE" "$HOST_EXCLUDE_FILES" $HOST_PACKAGES $wm $vnc > "$work/files" <<'PY'
import os, re, sys
exclude, exclude_files, want = re.compile(sys.argv[1]), re.compile(sys.argv[2]), sys.argv[3:]
pkgs, provides = {}, {}
for para in open("/var/lib/dpkg/status").read().split("\n\n"):
    f, key = {}, None
    for line in para.splitlines():
        if line[:1] in " \t" and key:
            f[key] += line
        elif ":" in line:
            key, _, v = line.partition(":")
            f[key] = v.strip()
    if "install ok installed" not in f.get("Status", ""):
        continue
    name = f["Package"]
    pkgs[name] = f
    for p in f.get("Provides", "").split(","):
        if p.strip():
            provides.setdefault(p.split("(")[0].strip(), name)
seen, todo = set(), list(want)
while todo:
    n = todo.pop()
    n = n if n in pkgs else provides.get(n)
    if n is None or n in seen:
        continue
    seen.add(n)
    for field in ("Depends", "Pre-Depends"):
        for dep in pkgs[n].get(field, "").split(","):
            alts = [a.split("(")[0].split(":")[0].strip() for a in dep.split("|")]
            alts = [a for a in alts if a]
            hit = [a for a in alts if a in pkgs or a in provides]
            if hit:
                todo.append(hit[0])
count = 0
for n in sorted(seen):
    if exclude.match(n):
        continue
    arch = pkgs[n].get("Architecture", "")
    for lst in (f"/var/lib/dpkg/info/{n}:{arch}.list", f"/var/lib/dpkg/info/{n}.list"):
        if os.path.exists(lst):
            break
    else:
        continue
    count += 1
    for path in open(lst).read().splitlines():
        if exclude_files.search(path) or not (os.path.islink(path) or (os.path.exists(path) and not os.path.isdir(path))):
            continue
        print(path[1:])
print(f"{count} packages", file=sys.stderr)
PY
echo "copying $(wc -l < "$work/files") files" >&2
# Files go to their merged-/usr place; /lib and /lib64 become links (the
# ELF loader's path), /bin and /sbin are left to the base (busybox's, or
# Debian's own links).
grep -Ev '^(bin|sbin|lib|lib32|lib64|libx32)$' "$work/files" | sort -u > "$work/files.u"
tar -C / --no-recursion -cf - -T "$work/files.u" \
	--transform 's,^\(bin\|sbin\|lib\|lib32\|lib64\|libx32\)/,usr/\1/,' | tar -C "$root" -xpf -
mkdir -p "$root"/etc/ld.so.conf.d "$root"/etc/dsec/autostart.d "$root"/var/lib/xkb
cp -a /etc/ld.so.cache "$root"/etc/ 2>/dev/null || true
for d in lib lib64; do
	if [[ -L /$d ]]; then ln -sfn "usr/$d" "$root/$d"; fi
done
# The session: the X server, then the window manager and a terminal on
# it, each restarted if it exits (a user may close the terminal).
cat > "$root"/etc/dsec/autostart.d/50-desktop <<SCRIPT
#!/bin/sh
# Started by dsec-agent (the sandbox's init): the desktop on display :0.
export DISPLAY=:0 HOME=\${HOME:-/root}
mkdir -p /tmp/.X11-unix && chmod 1777 /tmp/.X11-unix
/usr/bin/Xvfb :0 -screen 0 $GEOMETRY -nolisten tcp -ac &
i=0
while [ ! -S /tmp/.X11-unix/X0 ] && [ \$i -lt 200 ]; do sleep 0.05; i=\$((i + 1)); done
${wm:+(while :; do /usr/bin/$wm; sleep 1; done) &}
while :; do /usr/bin/xterm -geometry 100x30+0+0 -title terminal; sleep 0.5; done
SCRIPT
chmod 755 "$root"/etc/dsec/autostart.d/50-desktop
# The VNC server of the screen, for GET /v1/sandboxes/{id}/vnc: on a unix
# socket only (the agent's VNCSocket, which it connects to; no TCP port, no
# network needed), every client sharing the one screen, no password (the
# API checked the caller). It follows the X server: restarted if it exits.
if [[ -n $vnc ]]; then
	cat > "$root"/etc/dsec/autostart.d/60-vnc <<'SCRIPT'
#!/bin/sh
# Started by dsec-agent (the sandbox's init): x11vnc of display :0.
export DISPLAY=:0 HOME=${HOME:-/root}
sock=/tmp/.dsec-vnc/vnc.sock
i=0
while [ ! -S /tmp/.X11-unix/X0 ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i + 1)); done
mkdir -p /tmp/.dsec-vnc && chmod 700 /tmp/.dsec-vnc
while :; do
	rm -f $sock
	/usr/bin/x11vnc -display :0 -unixsock $sock -rfbport 0 -rfbportv6 -1 -forever -shared -nopw -norc -quiet
	sleep 1
done
SCRIPT
	chmod 755 "$root"/etc/dsec/autostart.d/60-vnc
fi
if [[ -n $wm && $wm != matchbox-window-manager && ! -x $root/usr/bin/$wm ]]; then
	echo "window manager $wm: no /usr/bin/$wm" >&2
fi
"$DSEC" layer build --kind toolkit --name "$NAME" $PUBLIC "$root"
