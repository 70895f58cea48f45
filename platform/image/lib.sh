# Shared by platform/image/base and platform/image/build (sourced, not run).
# Every buildah call uses one storage: vfs (works without overlay or fuse, in any container),
# under SWITCHYARD_IMAGE_ROOT (default: buildah's own /var/lib/containers/storage).
IMAGE_ROOT=${SWITCHYARD_IMAGE_ROOT:-/var/lib/containers/storage}
IMAGE_RUNROOT=${SWITCHYARD_IMAGE_RUNROOT:-/run/containers/storage}

bah() {
  buildah --root "$IMAGE_ROOT" --runroot "$IMAGE_RUNROOT" --storage-driver vfs "$@"
}

# need_tools CMD...: apt-get installs the Debian packages of the commands that are missing.
need_tools() {
  local missing=()
  for cmd in "$@"; do command -v "$cmd" >/dev/null 2>&1 || missing+=("$cmd"); done
  [ ${#missing[@]} -eq 0 ] && return 0
  if [ "$(id -u)" -ne 0 ]; then
    echo "image: missing ${missing[*]}: install them (apt-get install ${missing[*]}) or run as root" >&2
    exit 1
  fi
  echo "image: apt-get install ${missing[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
}
