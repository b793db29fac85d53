#!/usr/bin/env bash
# Builds the desktop vm layer desktop:debian-12 (make desktop-image): a
# Debian 12 full VM for the fullvm backend that boots into a graphical
# desktop: the full Debian kernel (its DRM driver drives QEMU's screen),
# systemd, Xorg, the Openbox window manager and an xterm, with root logged
# in on tty1 and X started by the login (autologin). The screen API (GET
# …/screen, POST …/input, the VNC WebSocket) then shows and drives it.
#
#   sudo examples/build_desktop_image.sh   # needs the network (debootstrap), root,
#                                          # a running server and bin/dsec
#
# Not part of the tests or CI: it downloads and installs several hundred
# MB and takes most of an hour on a small machine. OUTPUT=FILE writes the
# qcow2 image there instead of uploading it; INCLUDE adds packages
# (firefox-esr adds a browser, about 250 MB).
set -euo pipefail

NAME=${NAME:-desktop:debian-12}
SUITE=${SUITE:-bookworm}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
KERNEL=${KERNEL:-linux-image-amd64}
PACKAGES=systemd,systemd-sysv,udev,procps,$KERNEL,xserver-xorg-core,xserver-xorg-input-libinput,xinit,openbox,xterm,x11-xserver-utils,fonts-dejavu-core
INCLUDE=${INCLUDE:-}
DSEC=${DSEC:-$(cd "$(dirname "$0")/.." && pwd)/bin/dsec}
PUBLIC=${PUBLIC---public}

start=$SECONDS
work=$(mktemp -d /var/tmp/dsec-desktop-image.XXXXXX)
trap 'rm -rf "$work"' EXIT
root=$work/root
debootstrap --variant=minbase --include="$PACKAGES${INCLUDE:+,$INCLUDE}" "$SUITE" "$root" "$MIRROR"
rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/*

# Root is logged in on tty1 (dsec layer build --vm --autologin); its
# login starts X there, with the window manager and a terminal.
cat > "$root"/root/.bash_profile <<'PROFILE'
if [ -z "$DISPLAY" ] && [ "$(tty)" = /dev/tty1 ]; then
	exec startx -- -nolisten tcp vt1 >/var/log/xsession.log 2>&1
fi
PROFILE
cat > "$root"/root/.xinitrc <<'XINITRC'
xsetroot -solid '#30506f'
openbox &
while :; do xterm -geometry 100x30+40+40 -title terminal; sleep 1; done
XINITRC
# Any user may start X from a console login.
mkdir -p "$root"/etc/X11
printf 'allowed_users=anybody\nneeds_root_rights=yes\n' > "$root"/etc/X11/Xwrapper.config

if [[ -n ${OUTPUT:-} ]]; then
	"$DSEC" layer build --vm --vm-kernel "$KERNEL" --autologin --output "$OUTPUT" "$root"
	ls -l "$OUTPUT"
else
	"$DSEC" layer build --vm --vm-kernel "$KERNEL" --autologin --name "$NAME" $PUBLIC "$root"
fi
echo "desktop image built in $(((SECONDS - start) / 60)) min $(((SECONDS - start) % 60)) s" >&2
