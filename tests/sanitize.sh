#!/usr/bin/env bash
# The C++ API under AddressSanitizer and UndefinedBehaviorSanitizer: the
# fuzz driver (tests/fuzz_stream.cpp: random event streams, tissue and pools
# through validate() and every host entry) and the programs of the C++ tests
# (tests/test_cpp_*.py), built from the source tree's headers.
#
#   bash tests/sanitize.sh [fuzz iterations, default 3000]
#
# Needs g++ (or $CXX) with the sanitizers, and blochsim importable for the
# C++ tests.  Building takes minutes: the kernels are heavy templates.
set -euo pipefail
cd "$(dirname "$0")/.."
CXX=${CXX:-g++}
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

echo "== fuzz driver"
# -O0: the sanitized build of every kernel template compiles in a few minutes, not ten
$CXX -std=c++17 -O0 $flags -pthread -Isrc_cpp/include tests/fuzz_stream.cpp -o "$out/fuzz_stream"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
  "$out/fuzz_stream" "${1:-3000}"

echo "== C++ tests"
BLOCHSIM_TEST_CXXFLAGS="$flags" ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 \
  python -m pytest -q -p no:cacheprovider tests/test_cpp_validate.py \
  "tests/test_cpp_example.py::test_cpmg_example"
