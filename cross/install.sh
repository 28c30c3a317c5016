#!/bin/sh
# Install pocketd from this folder (the unpacked release tarball) on a board:
#
#   sudo ./install.sh            install, create the pocketd user and directories, reload
#                                systemd and D-Bus, enable pocketd.socket
#   sudo ./install.sh --no-enable   the same without enabling the socket
#   ./install.sh --root DIR      only copy the files under DIR (an image being built)
#   sudo ./install.sh --uninstall   stop and remove what install.sh put in place (the
#                                models in /var/lib/pocketd and /etc/pocketd stay)
#
# An existing /etc/pocketd/pocketd.toml is kept; the shipped one goes beside it as
# pocketd.toml.new. Paths are those of systemd/README.md.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
root=
enable=yes
action=install
while [ $# -gt 0 ]; do
    case $1 in
    --root) root=${2:?--root needs a directory}; shift ;;
    --root=*) root=${1#--root=} ;;
    --no-enable) enable=no ;;
    --uninstall) action=uninstall ;;
    -h | --help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
root=${root%/}

if [ -z "$root" ] && [ "$(id -u)" -ne 0 ]; then
    echo "install.sh: run it as root (sudo ./install.sh), or with --root DIR to stage files" >&2
    exit 1
fi

# Where each shipped file goes.
files="
bin/pocketd                      /usr/bin/pocketd                                                755
bin/pocket                       /usr/bin/pocket                                                 755
systemd/pocketd.service          /usr/lib/systemd/system/pocketd.service                         644
systemd/pocketd.socket           /usr/lib/systemd/system/pocketd.socket                          644
systemd/org.pocketd.Pocketd1.conf    /usr/share/dbus-1/system.d/org.pocketd.Pocketd1.conf        644
systemd/org.pocketd.Pocketd1.xml     /usr/share/dbus-1/interfaces/org.pocketd.Pocketd1.xml       644
systemd/org.pocketd.Pocketd1.service /usr/share/dbus-1/system-services/org.pocketd.Pocketd1.service 644
systemd/pocketd.sysusers         /usr/lib/sysusers.d/pocketd.conf                                644
systemd/pocketd.tmpfiles         /usr/lib/tmpfiles.d/pocketd.conf                                644
"

# systemd is running (not a chroot, a container without it, or an image being staged).
systemd_running() { [ -z "$root" ] && [ -d /run/systemd/system ]; }

if [ $action = uninstall ]; then
    if systemd_running; then
        systemctl disable --now pocketd.socket pocketd.service 2>/dev/null || true
    fi
    echo "$files" | while read -r _ dest _; do
        [ -n "$dest" ] && rm -f "$root$dest" && echo "removed $dest"
    done
    if [ -d "$root/usr/lib/pocketd" ]; then
        rm -rf "$root/usr/lib/pocketd" && echo "removed /usr/lib/pocketd"
    fi
    if systemd_running; then
        systemctl daemon-reload
        systemctl reload dbus 2>/dev/null || true
    fi
    echo "kept /etc/pocketd and /var/lib/pocketd (models); remove them by hand if you want them gone"
    exit 0
fi

arch=$(uname -m)
if [ -z "$root" ] && [ "$arch" != aarch64 ]; then
    echo "install.sh: these binaries are for aarch64; this machine is $arch" >&2
    exit 1
fi

echo "$files" | while read -r src dest mode; do
    [ -n "$src" ] || continue
    install -D -m "$mode" "$here/$src" "$root$dest"
    echo "installed $dest"
done
# A CUDA or OpenVINO build's ggml and llama libraries (and OpenVINO's runtime, plugin and
# oneTBB): the binaries look for them in ../lib/pocketd.
if [ -d "$here/lib/pocketd" ]; then
    for lib in "$here"/lib/pocketd/*; do
        install -D -m 644 "$lib" "$root/usr/lib/pocketd/${lib##*/}"
        echo "installed /usr/lib/pocketd/${lib##*/}"
    done
fi
config=$root/etc/pocketd/pocketd.toml
if [ -e "$config" ]; then
    install -D -m 644 "$here/systemd/pocketd.toml" "$config.new"
    echo "kept /etc/pocketd/pocketd.toml; the shipped one is /etc/pocketd/pocketd.toml.new"
else
    install -D -m 644 "$here/systemd/pocketd.toml" "$config"
    echo "installed /etc/pocketd/pocketd.toml"
fi

# The user, group and directories: systemd-sysusers and systemd-tmpfiles work on files, so
# they run in a chroot and on a staged root too (where a file named on the command line is
# a path of this system, hence "$root" in front).
if [ -n "$root" ]; then
    systemd-sysusers --root="$root" "$root/usr/lib/sysusers.d/pocketd.conf"
    systemd-tmpfiles --root="$root" --create "$root/usr/lib/tmpfiles.d/pocketd.conf"
else
    systemd-sysusers /usr/lib/sysusers.d/pocketd.conf
    systemd-tmpfiles --create /usr/lib/tmpfiles.d/pocketd.conf
fi

if systemd_running; then
    systemctl daemon-reload
    systemctl reload dbus 2>/dev/null || echo "note: could not reload dbus; the D-Bus policy applies after its restart"
    if [ $enable = yes ]; then
        systemctl enable --now pocketd.socket
        echo "enabled pocketd.socket: the daemon starts on the first request"
    fi
else
    echo "systemd is not running here: nothing reloaded or enabled"
    [ $enable = yes ] && [ -z "$root" ] && echo "on the board: sudo systemctl enable --now pocketd.socket"
fi

cat <<EOF

Next:
  sudo -u pocketd pocket pull --models-dir /var/lib/pocketd/models smollm2-135m
  pocket ask --socket /run/pocketd/pocketd.sock "Hello!"
  systemctl edit pocketd     # [Service] MemoryMax= for this board (the daemon's budget)
EOF
