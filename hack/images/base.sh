#!/usr/bin/env bash
# Make a local base image without any image registry: debootstrap a minimal Debian root filesystem
# from the apt mirror this machine already uses and `docker import` it.
#
#   hack/images/base.sh [SUITE]        # SUITE: bookworm (default) or trixie
#   hack/images/base.sh noble          # Ubuntu 24.04, where archive.ubuntu.com is reachable: the
#                                      # production worker's OS (glibc 2.39, Python 3.12) for NVRx 0.6
#
# Prints the tag (rtj-base:<suite>). Idempotent: does nothing when the tag exists (REBUILD=1 to
# remake it). Like ubuntu:24.04 or nvidia/cuda images it has no Python: the Dockerfile installs one
# with apt, so CI goes through the same steps as a production build.
# Environment: MIRROR (default: the first Debian mirror in /etc/apt/sources.list*, else
# http://deb.debian.org/debian), DOCKER (docker CLI).
set -euo pipefail

SUITE=${1:-${BASE_SUITE:-bookworm}}
DOCKER=${DOCKER:-docker}
TAG=rtj-base:${SUITE}

if [[ -z ${REBUILD:-} ]] && $DOCKER image inspect "$TAG" >/dev/null 2>&1; then
    echo "$TAG exists" >&2
    echo "$TAG"
    exit 0
fi

UBUNTU=
case $SUITE in jammy|noble|plucky|questing) UBUNTU=1 ;; esac
if [[ -n $UBUNTU ]]; then
    MIRROR=${MIRROR:-http://archive.ubuntu.com/ubuntu}
elif [[ -z ${MIRROR:-} ]]; then
    # deb822 (`URIs: ...`) or one-line (`deb URI suite ...`) sources; the first mirror serving `debian`.
    MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null \
        | sed -nE 's#^URIs:[[:space:]]+([^[:space:]]+).*#\1#p; s#^deb[[:space:]]+(\[[^]]*\][[:space:]]+)?([^[:space:]]+).*#\2#p' \
        | grep -E '/debian/?$' | head -n1 || true)
    MIRROR=${MIRROR:-http://deb.debian.org/debian}
fi
MIRROR=${MIRROR%/}
SECURITY=${SECURITY_MIRROR:-${MIRROR%/debian}/debian-security}
DEBOOTSTRAP_ARGS=(--variant=minbase --include=ca-certificates)
SCRIPT=()
if [[ -n $UBUNTU ]]; then
    SECURITY=$MIRROR
    # Debian 12's debootstrap predates noble; every Ubuntu script is a link to gutsy's.
    [[ -e /usr/share/debootstrap/scripts/$SUITE ]] || SCRIPT=(/usr/share/debootstrap/scripts/gutsy)
    if [[ ! -e /usr/share/keyrings/ubuntu-archive-keyring.gpg ]]; then
        echo "WARNING: no Ubuntu archive keyring here: debootstrap --no-check-gpg" >&2
        DEBOOTSTRAP_ARGS+=(--no-check-gpg)
    fi
fi

if ! command -v debootstrap >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
fi

ROOTFS=$(mktemp -d /var/tmp/rtj-base-rootfs.XXXXXX)
trap 'rm -rf "$ROOTFS"' EXIT

echo "debootstrap $SUITE from $MIRROR" >&2
debootstrap "${DEBOOTSTRAP_ARGS[@]}" "$SUITE" "$ROOTFS" "$MIRROR" "${SCRIPT[@]}" >&2

COMPONENTS=main
[[ -n $UBUNTU ]] && COMPONENTS="main universe"
cat > "$ROOTFS/etc/apt/sources.list" <<SOURCES
deb $MIRROR $SUITE $COMPONENTS
deb $MIRROR $SUITE-updates $COMPONENTS
deb $SECURITY $SUITE-security $COMPONENTS
SOURCES
# Slim like the official images: no package cache, lists fetched by whoever installs.
printf 'APT::Install-Recommends "false";\nAPT::Install-Suggests "false";\n' > "$ROOTFS/etc/apt/apt.conf.d/90rtj-norecommends"
rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* "$ROOTFS"/tmp/* "$ROOTFS"/var/log/*.log

tar --numeric-owner -C "$ROOTFS" -c . | $DOCKER import \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'ENV LANG=C.UTF-8' \
    --change 'CMD ["/bin/bash"]' \
    --message "debootstrap --variant=minbase $SUITE $MIRROR" - "$TAG" >&2
echo "$TAG"
