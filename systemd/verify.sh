#!/usr/bin/env bash
# Checks the files in systemd/ without installing anything:
#
#   - pocketd.service, pocketd.socket and pocketd-rpc.service with
#     `systemd-analyze verify` (any
#     message about them fails the check; systemd-analyze exits 0 on most
#     warnings, such as an unknown key or a bad value, so its output is read);
#   - the D-Bus policy is well-formed XML (xmllint, else Python), and a private
#     dbus-daemon accepts it together with the activation file;
#   - pocketd.sysusers and pocketd.tmpfiles applied to a scratch root;
#   - pocketd.toml parses and has only keys the daemon knows.
#
# Usage: systemd/verify.sh [POCKETD]
#
# POCKETD is the binary that ExecStart= names in the copy that is verified
# (systemd-analyze checks that it exists and is executable). Default:
# target/release/pocketd in the repository, else pocketd on PATH. Any
# executable will do, e.g. /bin/true.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
repo=$(dirname "$here")

die() {
    echo "verify.sh: $*" >&2
    exit 1
}

if [[ $# -gt 1 || ${1:-} == -h || ${1:-} == --help ]]; then
    echo "usage: systemd/verify.sh [POCKETD]" >&2
    exit 2
fi

bin=${1:-}
if [[ -z $bin ]]; then
    if [[ -x $repo/target/release/pocketd ]]; then
        bin=$repo/target/release/pocketd
    elif ! bin=$(command -v pocketd); then
        die "no pocketd binary: build one (cargo build --release) or pass a path, e.g. /bin/true"
    fi
fi
[[ -f $bin && -x $bin ]] || die "$bin is not an executable file"
[[ $bin == /* ]] || bin=$PWD/$bin
# systemd would expand % (specifiers) and $ (variables) in ExecStart=.
[[ $bin != *[\"\\%\$]* ]] || die "$bin: a path with \", \\, % or \$ cannot go in ExecStart="

command -v systemd-analyze >/dev/null || die "systemd-analyze is not installed"

tmp=$(mktemp -d "${TMPDIR:-/tmp}/pocketd-verify.XXXXXX")
bus_pid=
cleanup() {
    if [[ -n $bus_pid ]]; then
        kill "$bus_pid" 2>/dev/null || true
        wait "$bus_pid" 2>/dev/null || true
    fi
    rm -rf "$tmp"
}
trap cleanup EXIT

# --- Units ------------------------------------------------------------------

# copy_unit UNIT PROGRAM BINARY: systemd/UNIT into $tmp/units with its one
# `ExecStart=/usr/bin/PROGRAM ...` line running BINARY instead.
copy_unit() {
    local unit=$1 program=$2 binary=$3 replaced=0 line
    while IFS= read -r line; do
        if [[ $line == "ExecStart=/usr/bin/$program "* ]]; then
            line="ExecStart=\"$binary\" ${line#"ExecStart=/usr/bin/$program "}"
            replaced=$((replaced + 1))
        fi
        printf '%s\n' "$line"
    done <"$here/$unit" >"$tmp/units/$unit"
    [[ $replaced -eq 1 ]] || die "$unit: expected one ExecStart=/usr/bin/$program ... line, found $replaced"
}

# The units in one directory, so that the socket's Service= resolves.
mkdir "$tmp/units"
copy_unit pocketd.service pocketd "$bin"
cp "$here/pocketd.socket" "$tmp/units/"
# pocketd-rpc.service runs `pocket rpc-serve`: the pocket beside the pocketd given, if there is one.
pocket_bin=$(dirname "$bin")/pocket
[[ -x $pocket_bin ]] || pocket_bin=$bin
copy_unit pocketd-rpc.service pocket "$pocket_bin"

opts=(--man=no)
# systemd >= 250: the exit status covers only the units named, not what they pull in.
if systemd-analyze --help 2>/dev/null | grep -q -- --recursive-errors; then
    opts+=(--recursive-errors=no)
fi
rc=0
out=$(cd "$tmp" && SYSTEMD_LOG_LEVEL=notice SYSTEMD_LOG_COLOR=0 \
    systemd-analyze verify "${opts[@]}" "$tmp/units/pocketd.service" "$tmp/units/pocketd.socket" \
        "$tmp/units/pocketd-rpc.service" 2>&1) || rc=$?
# Without a running systemd, systemd-analyze may say things about other units
# or the bus; only lines about ours count.
ours=$(grep -F -e pocketd.service -e pocketd.socket -e pocketd-rpc.service -e "$tmp" <<<"$out" || true)
if [[ -n $ours || $rc -ne 0 ]]; then
    echo "systemd-analyze verify (exit status $rc):" >&2
    # The copies have the same lines as the originals.
    printf '%s\n' "${ours:-$out}" | sed "s|$tmp/units/|systemd/|g" >&2
    die "the units have problems"
fi
echo "ok: pocketd.service, pocketd.socket, pocketd-rpc.service (systemd-analyze verify)"

# The files must agree with one another.
activation=$here/org.pocketd.Pocketd1.service
for key in Name=org.pocketd.Pocketd1 Exec= User=pocketd SystemdService=; do
    grep -q "^$key" "$activation" || die "org.pocketd.Pocketd1.service has no $key line"
done
activation_unit=$(sed -n 's/^SystemdService=//p' "$activation")
[[ -f $here/$activation_unit ]] ||
    die "org.pocketd.Pocketd1.service: SystemdService=$activation_unit is not a unit in systemd/"
socket_unit_path=$(sed -n 's/^ListenStream=//p' "$here/pocketd.socket")
grep -qx "socket = \"$socket_unit_path\"" "$here/pocketd.toml" ||
    die "pocketd.toml's socket is not $socket_unit_path, where pocketd.socket listens"

# --- D-Bus ------------------------------------------------------------------

policy=$here/org.pocketd.Pocketd1.conf
if command -v xmllint >/dev/null; then
    xmllint --noout --nonet "$policy" || die "$policy is not well-formed XML"
    echo "ok: org.pocketd.Pocketd1.conf (xmllint)"
elif command -v python3 >/dev/null; then
    python3 - "$policy" <<'EOF' || die "$policy is not well-formed XML"
import sys, xml.dom.minidom, xml.parsers.expat
try:
    xml.dom.minidom.parse(sys.argv[1])
except xml.parsers.expat.ExpatError as e:
    sys.exit(f"{sys.argv[1]}: {e}")
EOF
    echo "ok: org.pocketd.Pocketd1.conf (well-formed; xmllint is not installed)"
else
    echo "skip: org.pocketd.Pocketd1.conf: neither xmllint nor python3 is installed"
fi

# dbus-daemon is the real judge of the policy (it refuses unknown elements and
# attributes) and of the activation file (a system bus wants Name=, Exec= and
# User=, and lists the name only if the file is valid).
if command -v dbus-daemon >/dev/null && command -v busctl >/dev/null; then
    mkdir "$tmp/dbus" "$tmp/dbus/services"
    cp "$here/org.pocketd.Pocketd1.service" "$tmp/dbus/services/"
    cat >"$tmp/dbus/bus.conf" <<EOF
<!DOCTYPE busconfig PUBLIC "-//freedesktop//DTD D-BUS Bus Configuration 1.0//EN"
 "http://www.freedesktop.org/standards/dbus/1.0/busconfig.dtd">
<busconfig>
  <type>system</type>
  <listen>unix:path=$tmp/dbus/socket</listen>
  <auth>EXTERNAL</auth>
  <servicedir>$tmp/dbus/services</servicedir>
  <policy context="default">
    <allow user="*"/>
    <allow send_destination="org.freedesktop.DBus"/>
    <allow receive_type="method_return"/>
    <allow receive_type="error"/>
    <allow receive_type="signal"/>
  </policy>
  <include>$policy</include>
</busconfig>
EOF
    dbus-daemon --config-file="$tmp/dbus/bus.conf" --nofork --nopidfile --nosyslog \
        --print-address >"$tmp/dbus/address" 2>"$tmp/dbus/log" &
    bus_pid=$!
    for _ in $(seq 50); do
        [[ -s $tmp/dbus/address ]] && break
        kill -0 "$bus_pid" 2>/dev/null || break
        sleep 0.1
    done
    if [[ ! -s $tmp/dbus/address ]]; then
        grep -v 'Unknown \(username\|group\) "pocketd"' "$tmp/dbus/log" >&2 || true
        die "dbus-daemon did not start with org.pocketd.Pocketd1.conf"
    fi
    names=$(busctl --address="unix:path=$tmp/dbus/socket" call org.freedesktop.DBus \
        /org/freedesktop/DBus org.freedesktop.DBus ListActivatableNames 2>&1) ||
        die "cannot ask the test bus for its activatable names: $names"
    if [[ $names != *'"org.pocketd.Pocketd1"'* ]]; then
        cat "$tmp/dbus/log" >&2
        die "dbus-daemon did not accept org.pocketd.Pocketd1.service (activatable: $names)"
    fi
    kill "$bus_pid" 2>/dev/null || true
    wait "$bus_pid" 2>/dev/null || true
    bus_pid=
    echo "ok: org.pocketd.Pocketd1.conf, org.pocketd.Pocketd1.service (dbus-daemon)"
else
    echo "skip: D-Bus files: dbus-daemon or busctl is not installed"
fi

# --- sysusers and tmpfiles, on a scratch root -------------------------------

scratch=$tmp/root
mkdir -p "$scratch/etc"
if command -v systemd-sysusers >/dev/null; then
    log=$(systemd-sysusers --root="$scratch" "$here/pocketd.sysusers" 2>&1) || {
        printf '%s\n' "$log" >&2
        die "systemd-sysusers refused pocketd.sysusers"
    }
    IFS=: read -r _ _ uid gid _ home shell < <(grep '^pocketd:' "$scratch/etc/passwd") ||
        die "pocketd.sysusers made no user pocketd"
    [[ $home == /var/lib/pocketd ]] || die "user pocketd's home is $home, not /var/lib/pocketd"
    [[ $(grep -c -E '^(pocketd|render):' "$scratch/etc/group") -eq 2 ]] ||
        die "pocketd.sysusers made no groups pocketd and render"
    echo "ok: pocketd.sysusers (user pocketd, uid $uid, shell $shell)"

    if command -v systemd-tmpfiles >/dev/null; then
        log=$(systemd-tmpfiles --root="$scratch" --create "$here/pocketd.tmpfiles" 2>&1) || {
            printf '%s\n' "$log" >&2
            die "systemd-tmpfiles refused pocketd.tmpfiles"
        }
        for want in "var/lib/pocketd 750 $uid $gid" "var/lib/pocketd/models 750 $uid $gid" "etc/pocketd 755 0 0"; do
            read -r path mode owner group <<<"$want"
            got=$(stat -c '%a %u %g' "$scratch/$path" 2>/dev/null) || die "pocketd.tmpfiles made no /$path"
            [[ $got == "$mode $owner $group" ]] ||
                die "/$path: mode, uid and gid are $got, not $mode $owner $group"
        done
        echo "ok: pocketd.tmpfiles"
    else
        echo "skip: pocketd.tmpfiles: systemd-tmpfiles is not installed"
    fi
else
    echo "skip: pocketd.sysusers, pocketd.tmpfiles: systemd-sysusers is not installed"
fi

# --- The default configuration ------------------------------------------------

if command -v python3 >/dev/null && python3 -c 'import tomllib' 2>/dev/null; then
    python3 - "$here/pocketd.toml" "$repo/crates/pocketd/src/server/config.rs" <<'EOF' || die "pocketd.toml is not a valid configuration"
import re, sys, tomllib

try:
    with open(sys.argv[1], "rb") as f:
        keys = set(tomllib.load(f))
except tomllib.TOMLDecodeError as e:
    sys.exit(f"{sys.argv[1]}: {e}")
try:
    src = open(sys.argv[2]).read()
    body = src[src.index("pub struct Config {"):]
    fields = set(re.findall(r"^\s*pub (\w+):", body[: body.index("\n}\n")], re.M))
except (OSError, ValueError):
    sys.exit(0)  # No sources to compare with: the syntax check is all.
unknown = sorted(keys - fields)
if unknown:
    sys.exit(f"pocketd.toml: keys the daemon does not know: {', '.join(unknown)}")
EOF
    echo "ok: pocketd.toml"
else
    echo "skip: pocketd.toml: python3 with tomllib (3.11+) is not installed"
fi

echo "systemd units verified"
