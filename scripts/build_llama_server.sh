#!/usr/bin/env bash
# Build llama.cpp's own `llama-server` from the very llama.cpp that our engine runs, so that
# `tierroute bench` compares engines and not llama.cpp versions or compiler flags.
#
# The source is the llama.cpp vendored in llama-cpp-python's sdist, at the version installed in
# .venv (or, without one, the version of the wheel that `make setup` built). The CPU flags are the
# Makefile's LLAMA_CMAKE_ARGS, read from the Makefile itself rather than copied, so that the server
# gets exactly what the wheel got (no AMX kernels: they crash mid-decode on this CPU). Like the
# wheel, it is built with cmake in Release mode and without curl; the libraries are linked in
# statically so the binary stands alone.
#
# Everything lives outside the repository and is never committed:
#   ${XDG_CACHE_HOME:-~/.cache}/tierroute/llama-server/<version>-<flags hash>/bin/llama-server
# The script prints that path last. A second run with the same version and flags only prints it.
#
# Usage: scripts/build_llama_server.sh [--jobs N] [--force]
#   then: tierroute bench spec --llama-server "$(scripts/build_llama_server.sh)" ...
# Needs: cmake, a C/C++ compiler, pip (to fetch the sdist), and ninja or make. Took about 30
# minutes on 2 cores shared with other work.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
jobs="$(nproc)"
force=0
while [ $# -gt 0 ]; do
  case "$1" in
    --jobs) jobs="$2"; shift 2 ;;
    --force) force=1; shift ;;
    -h|--help) sed -n '2,19p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "unknown option: $1" >&2; exit 2 ;;
  esac
done

# The flags as make sees them: the Makefile plus a one-line rule that prints the variable.
cmake_args="$(printf 'print-llama-cmake-args:\n\t@echo "$(LLAMA_CMAKE_ARGS)"\n' \
  | make --no-print-directory -C "$repo" -f Makefile -f - print-llama-cmake-args)"
if [ -z "$cmake_args" ]; then
  echo "could not read LLAMA_CMAKE_ARGS from $repo/Makefile" >&2
  exit 1
fi

cache="${XDG_CACHE_HOME:-$HOME/.cache}/tierroute"
version=""
if [ -x "$repo/.venv/bin/python" ]; then
  version="$("$repo/.venv/bin/python" -c 'import llama_cpp; print(llama_cpp.__version__)' 2>/dev/null || true)"
fi
if [ -z "$version" ]; then
  # the wheel `make setup` builds is kept under a directory named by the same flags' hash
  wheel_dir="$cache/wheels/$(echo "$cmake_args" | sha256sum | cut -c1-12)"
  wheel="$(ls "$wheel_dir"/llama_cpp_python-*.whl 2>/dev/null | tail -n 1 || true)"
  version="$(basename "${wheel:-}" | sed -n 's/^llama_cpp_python-\([^-]*\)-.*/\1/p')"
fi
if [ -z "$version" ]; then
  echo "no llama-cpp-python found (neither in $repo/.venv nor as a wheel): run 'make setup' first" >&2
  exit 1
fi

flags_hash="$(echo "$cmake_args" | sha256sum | cut -c1-12)"
home="$cache/llama-server/$version-$flags_hash"
binary="$home/bin/llama-server"
if [ -x "$binary" ] && [ "$force" = 0 ]; then
  echo "$binary"
  exit 0
fi
mkdir -p "$home" "$cache/llama-server/sdist"

sdist="$cache/llama-server/sdist/llama_cpp_python-$version.tar.gz"
if [ ! -f "$sdist" ]; then
  pip_bin="$repo/.venv/bin/pip"
  [ -x "$pip_bin" ] || pip_bin="pip3"
  echo "fetching the llama-cpp-python $version sdist" >&2
  "$pip_bin" download -q --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$cache/llama-server/sdist" >&2
fi

src="$home/src"
rm -rf "$src" "$home/build"
mkdir -p "$src"
tar -xzf "$sdist" -C "$src" --strip-components=1
llama="$src/vendor/llama.cpp"
[ -f "$llama/CMakeLists.txt" ] || { echo "$sdist has no vendor/llama.cpp" >&2; exit 1; }

generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
# eval: the Makefile's value quotes the -march flags for a shell, as make hands them to pip
eval "flag_words=($cmake_args)"
echo "configuring llama.cpp from llama-cpp-python $version with: $cmake_args" >&2
cmake -S "$llama" -B "$home/build" "${generator[@]}" \
  -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  "${flag_words[@]}" >&2
cmake --build "$home/build" --target llama-server -j "$jobs" >&2

mkdir -p "$home/bin"
cp "$home/build/bin/llama-server" "$binary"
printf '%s\n' "llama-cpp-python $version" "cmake args: $cmake_args" >"$home/BUILD-INFO"
rm -rf "$src" "$home/build"  # about 1 GiB of objects; the binary alone is what the bench needs
echo "$binary"
