#!/usr/bin/env bash
# No two instruction-set kernel files of the library may define the same weak
# symbol: the linker keeps one copy for all, so one ISA's table would run
# another's code (slower, or instructions the CPU lacks). GCC gave the tile
# runner's templates such symbols once (src/tensor/tile_runner.h).
#   tests/isa_symbols_test.sh path/to/libreprise.a
set -euo pipefail
lib=$1
isa_files='kernels_avx2|kernels_avx2_vnni|kernels_avx512|attention_avx2|attention_tiled_avx512|ssm_scan_avx512'
# "member symbol" for every weak (W, V) definition in an ISA file.
defs=$(nm -A "$lib" 2>/dev/null | awk -v re="($isa_files)\\\\.cpp\\\\.o:" '
  $0 ~ re && ($(NF-1) == "W" || $(NF-1) == "V") {
    split($1, parts, ":"); print parts[2], $NF
  }')
members=$(ar t "$lib" | grep -cE "^($isa_files)\.cpp\.o$" || true)
if [ "$members" -lt 6 ]; then
  echo "expected the ISA kernel files in $lib, found $members of them" >&2
  exit 1
fi
shared=$(printf '%s\n' "$defs" | grep -v 'DW.ref.__gxx_personality_v0' | sort -u | awk '{print $2}' | sort | uniq -d)
if [ -n "$shared" ]; then
  echo "weak symbols defined in more than one ISA kernel file:" >&2
  printf '%s\n' "$shared" | c++filt >&2
  exit 1
fi
echo "ISA kernel files: $members, no shared weak symbols"
