#!/usr/bin/env bash
# Source this file, then call `kiln_ensure_deps`.
#   - nothing missing: prints one short line
#   - missing + root:  apt-get installs what is missing
#   - missing + not root: prints the sudo command to stderr and returns 1
# It deliberately does not change the caller's shell options (it is sourced).

_kiln_ver_ge() { # _kiln_ver_ge HAVE WANT -> true if HAVE >= WANT
  [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -n1)" = "$2" ]
}

kiln_ensure_deps() {
  local missing=() pkg
  local pkgs=(g++ cmake make libeigen3-dev libxsimd-dev doctest-dev)
  # optional: ONNX export and import (kiln::onnx and its tests are built when these are found; the
  # node tests of libonnx-testdata are the import's conformance run); installed as
  # root, otherwise named, never a failure
  local optional=(libonnx-dev libprotobuf-dev libonnx-testdata) opt_missing=()

  if command -v dpkg >/dev/null 2>&1; then
    for pkg in "${pkgs[@]}"; do
      if [ "$pkg" = make ] && command -v ninja >/dev/null 2>&1; then
        continue # ninja is enough
      fi
      if ! dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed'; then
        missing+=("$pkg")
      fi
    done
  fi
  # Command checks (also the only checks on systems without dpkg).
  command -v g++   >/dev/null 2>&1 || [[ " ${missing[*]-} " == *" g++ "* ]]   || missing+=(g++)
  command -v cmake >/dev/null 2>&1 || [[ " ${missing[*]-} " == *" cmake "* ]] || missing+=(cmake)
  if ! command -v make >/dev/null 2>&1 && ! command -v ninja >/dev/null 2>&1; then
    [[ " ${missing[*]-} " == *" make "* ]] || missing+=(make)
  fi

  if command -v dpkg >/dev/null 2>&1; then
    for pkg in "${optional[@]}"; do
      dpkg -s "$pkg" 2>/dev/null | grep -q '^Status: install ok installed' || opt_missing+=("$pkg")
    done
  fi
  # one `apt-get update` for both lists (a fresh machine misses both: each update takes 10-30 s)
  local can_apt=0
  [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null 2>&1 && can_apt=1
  if [ "$can_apt" = 1 ] && [ "$((${#missing[@]} + ${#opt_missing[@]}))" -gt 0 ]; then
    apt-get update || [ "${#missing[@]}" -eq 0 ] || return 1
  fi

  if [ "${#missing[@]}" -gt 0 ]; then
    if [ "$can_apt" = 1 ]; then
      echo "kiln: installing missing packages: ${missing[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}" || return 1
    else
      echo "kiln: missing packages: ${missing[*]} ; run: sudo apt-get install -y ${missing[*]}" >&2
      return 1
    fi
  fi

  if [ "${#opt_missing[@]}" -gt 0 ]; then
    if [ "$can_apt" = 1 ]; then
      echo "kiln: installing optional packages (ONNX export): ${opt_missing[*]}"
      DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${opt_missing[@]}" ||
        echo "kiln: could not install ${opt_missing[*]}; building without ONNX export" >&2
    else
      echo "kiln: optional packages missing (ONNX export is not built without them): sudo apt-get install -y ${opt_missing[*]}" >&2
    fi
  fi

  # Version floors (apt cannot fix these on an old distro; just report).
  local gxx_ver cmake_ver
  gxx_ver="$(g++ -dumpfullversion -dumpversion 2>/dev/null || echo 0)"
  cmake_ver="$(cmake --version 2>/dev/null | sed -n '1s/^cmake version //p')"
  if ! _kiln_ver_ge "$gxx_ver" 12; then
    echo "kiln: g++ >= 12 required, found ${gxx_ver}" >&2
    return 1
  fi
  if ! _kiln_ver_ge "${cmake_ver:-0}" 3.25; then
    echo "kiln: cmake >= 3.25 required, found ${cmake_ver:-none}" >&2
    return 1
  fi

  echo "kiln: deps ok (g++ ${gxx_ver}, cmake ${cmake_ver})"
}

# Pick Ninja for fresh build dirs when available; an existing build dir keeps
# whatever generator it was configured with.
# Usage: cmake "$(kiln_generator_args BUILD_DIR)" ... -> prints args one per line
kiln_generator_args() {
  if [ ! -f "$1/CMakeCache.txt" ] && command -v ninja >/dev/null 2>&1; then
    printf '%s\n' -G Ninja
  fi
}
