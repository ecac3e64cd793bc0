#!/usr/bin/env bash
# Builds kvcached's Debian package: the binaries, man pages made from their --help by
# help2man, then `cargo deb` (metadata in Cargo.toml's [package.metadata.deb]).
#
#   scripts/package.sh                  # release build -> target/debian/kvcached_*.deb
#   scripts/package.sh --check          # ... and check the package (see below)
#   scripts/package.sh --profile dev --check
#                                       # the same from the debug build (quick: CI)
#
# --check verifies what a user would get from `apt install ./kvcached_*.deb`, without
# touching this machine: the package's file list and metadata; then, in a scratch root
# it is unpacked into, the unit (systemd-analyze verify, where systemd is installed), the
# man pages, and the packaged kvcached started with the packaged /etc/kvcached.conf on a
# free loopback port, answering `version`.
#
# Needs cargo-deb and help2man (scripts/install-deps.sh installs both).
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"

profile=release
check=false
while (($# > 0)); do
    case "$1" in
    --profile)
        profile="${2:?--profile needs a value}"
        shift 2
        ;;
    --check)
        check=true
        shift
        ;;
    *)
        echo "usage: $0 [--profile release|dev] [--check]" >&2
        exit 2
        ;;
    esac
done

die() {
    echo "package.sh: $*" >&2
    exit 1
}

command -v help2man >/dev/null || die "help2man missing: run scripts/install-deps.sh"
cargo deb --version >/dev/null 2>&1 || die "cargo-deb missing: run scripts/install-deps.sh"

target_dir="$(cargo metadata --format-version 1 --no-deps |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')"
case "$profile" in
dev) bin_dir="$target_dir/debug" ;;
*) bin_dir="$target_dir/$profile" ;;
esac

echo "package.sh: building kvcached and kvblast ($profile)"
cargo build --quiet --profile "$profile" -p kvcached -p kvblast

# Man pages from the programs' own help, so they cannot drift from it. kvblast's page
# adds each command's help.
man_dir="$target_dir/man"
mkdir -p "$man_dir"
extra="$(mktemp)"
trap 'rm -f "$extra" "$extra.log"' EXIT
{
    echo "[COMMANDS]"
    commands="$("$bin_dir/kvblast" --help |
        awk '/^Commands:/ { on = 1; next } /^$/ { on = 0 } on && /^  [a-z]/ && $1 != "help" { print $1 }')"
    [[ -n $commands ]] || die "no commands in kvblast --help"
    for cmd in $commands; do
        echo ".SS \"kvblast $cmd\""
        echo ".nf"
        "$bin_dir/kvblast" "$cmd" --help | sed 's/\\/\\e/g; s/^\./\\\&./'
        echo ".fi"
    done
    printf '[SEE ALSO]\n.BR kvcached (1)\n'
} >"$extra"
help2man --no-info --no-discard-stderr --section 1 \
    --name "a memcached-compatible in-memory key-value cache server" \
    --include <(printf '[SEE ALSO]\n.BR kvblast (1),\n.BR memcached (1)\n') \
    "$bin_dir/kvcached" >"$man_dir/kvcached.1"
help2man --no-info --section 1 \
    --name "a workload generator for memcache-protocol servers" \
    --include "$extra" \
    "$bin_dir/kvblast" >"$man_dir/kvblast.1"
gzip -9nf "$man_dir/kvcached.1" "$man_dir/kvblast.1"

deb="$(cargo deb --no-build --profile "$profile" -p kvcached 2>"$extra.log" | tail -n 1)" ||
    die "cargo deb failed: $(cat "$extra.log")"
[[ -f $deb ]] || die "cargo deb did not report a package (got: $deb)"
echo "package.sh: built $deb"
$check || exit 0

# ---------------------------------------------------------------------------------------
# --check
# ---------------------------------------------------------------------------------------
scratch="$(mktemp -d)"
server_pid=
cleanup() {
    [[ -n $server_pid ]] && kill "$server_pid" 2>/dev/null && wait "$server_pid" 2>/dev/null
    rm -rf "$scratch" "$extra" "$extra.log"
}
trap cleanup EXIT

fail() { die "check: $*"; }

listing="$(dpkg-deb --contents "$deb" | awk '{print $NF}' | sed 's|^\./|/|')"
for f in /usr/bin/kvcached /usr/bin/kvblast /etc/kvcached.conf \
    /usr/share/man/man1/kvcached.1.gz /usr/share/man/man1/kvblast.1.gz \
    /usr/lib/systemd/system/kvcached.service /usr/lib/sysusers.d/kvcached.conf \
    /usr/share/doc/kvcached/README.md /usr/share/doc/kvcached/copyright; do
    grep -qx "$f" <<<"$listing" || fail "$f missing from the package"
done
info="$(dpkg-deb --info "$deb")"
grep -q '^ Package: kvcached$' <<<"$info" || fail "package name"
grep -q '^ Depends: .*libc6' <<<"$info" || fail "no libc6 dependency: $info"
# (Each output is taken whole before grep reads it: with pipefail, `cmd | grep -q` fails
# when grep stops reading early and cmd dies of SIGPIPE.)
conffiles="$(dpkg-deb --info "$deb" conffiles)" || fail "no conffiles"
grep -qx '/etc/kvcached.conf' <<<"$conffiles" || fail "/etc/kvcached.conf is not a conffile"
postinst="$(dpkg-deb --info "$deb" postinst)"
grep -q 'systemd-sysusers' <<<"$postinst" || fail "postinst does not create the user"
grep -q 'deb-systemd-helper enable' <<<"$postinst" || fail "postinst does not enable the unit"

dpkg-deb --extract "$deb" "$scratch/root"
r="$scratch/root"
grep -q '^kvcached ' <<<"$("$r/usr/bin/kvcached" -V)" || fail "kvcached -V"
grep -q '^kvblast ' <<<"$("$r/usr/bin/kvblast" --version)" || fail "kvblast --version"
for page in kvcached kvblast; do
    grep -q '^\.SH DESCRIPTION' <<<"$(zcat "$r/usr/share/man/man1/$page.1.gz")" ||
        fail "$page.1 has no DESCRIPTION"
done
grep -q 'config\\-file' <<<"$(zcat "$r/usr/share/man/man1/kvcached.1.gz")" ||
    fail "kvcached.1 lacks --config-file"
grep -q '^ExecStart=/usr/bin/kvcached --config-file /etc/kvcached.conf$' \
    "$r/usr/lib/systemd/system/kvcached.service" || fail "unit's ExecStart"
if command -v systemd-analyze >/dev/null; then
    # verify needs ExecStart's program at its real path; point it at the unpacked one.
    sed "s|/usr/bin/kvcached|$r/usr/bin/kvcached|; s|/etc/kvcached.conf|$r/etc/kvcached.conf|" \
        "$r/usr/lib/systemd/system/kvcached.service" >"$scratch/kvcached.service"
    out="$(systemd-analyze verify --man=no "$scratch/kvcached.service" 2>&1)" ||
        fail "systemd-analyze verify: $out"
    rest="$(grep -v 'Failed to resolve unit\|network.target\|multi-user.target\|/etc/systemd' \
        <<<"$out" || true)"
    if grep -qi 'unknown\|invalid\|fail' <<<"$rest"; then
        fail "systemd-analyze verify: $out"
    fi
fi

# Start "$@" (a kvcached command line) with -p PORT appended, ask it `version`, stop it
# with SIGTERM and require exit status 0.
serve_and_ask() {
    local what="$1" port reply
    shift
    port="$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    "$@" -p "$port" 2>"$scratch/stderr" &
    server_pid=$!
    reply="$(ask_version "$port")" ||
        fail "$what did not answer: $(cat "$scratch/stderr")"
    [[ $reply == VERSION\ * ]] || fail "$what: version reply: $reply"
    kill "$server_pid"
    wait "$server_pid" || fail "$what exited $? on SIGTERM: $(cat "$scratch/stderr")"
    server_pid=
    echo "package.sh: $what answered '$reply'"
}

ask_version() {
    python3 - "$1" <<'EOF'
import socket, sys, time
port = int(sys.argv[1])
deadline = time.monotonic() + 10
while True:
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        break
    except OSError:
        if time.monotonic() > deadline:
            sys.exit("no listener on port %d" % port)
        time.sleep(0.01)
s.sendall(b"version\r\n")
print(s.recv(100).decode().strip())
EOF
}

# The packaged server with the packaged configuration (the port after the file wins). As
# root, the unit's User= is stood in for by -u root.
as=()
[[ $(id -u) -eq 0 ]] && as=(-u root)
serve_and_ask "the packaged kvcached with /etc/kvcached.conf" \
    "$r/usr/bin/kvcached" --config-file "$r/etc/kvcached.conf" "${as[@]}"

# The container image's command line (Containerfile's ENTRYPOINT and CMD), run as an
# unprivileged user as the image runs it. (No image is built here: that needs a container
# engine.)
mapfile -t container_cmd < <(python3 - Containerfile <<'EOF'
import json, sys
entry, cmd, user = [], [], None
for line in open(sys.argv[1]):
    word, _, rest = line.strip().partition(" ")
    if word == "ENTRYPOINT":
        entry = json.loads(rest)
    elif word == "CMD":
        cmd = json.loads(rest)
    elif word == "USER":
        user = rest.strip()
if not entry or user in (None, "root", "0"):
    sys.exit("Containerfile: no ENTRYPOINT, or it runs as root")
print("\n".join(entry + cmd))
EOF
)
((${#container_cmd[@]} > 0)) || fail "Containerfile's command line"
[[ ${container_cmd[0]} == /usr/bin/kvcached ]] || fail "Containerfile runs ${container_cmd[0]}"
container_cmd[0]="$r/usr/bin/kvcached"
unprivileged=()
[[ $(id -u) -eq 0 ]] && unprivileged=(setpriv --reuid=nobody --regid=nogroup --clear-groups)
serve_and_ask "the container's command line (${container_cmd[*]:1})" \
    "${unprivileged[@]}" "${container_cmd[@]}"
echo "package.sh: check passed ($(wc -l <<<"$listing") paths in $(basename "$deb"))"
