#!/usr/bin/env bash
# Prints llama.cpp's build options for this machine as TOML `[env]` lines (Cargo hands
# them to the llama-cpp-sys-2 build script, which passes GGML_* and CMAKE_* on to CMake).
#
# The llama-cpp-sys-2 build script turns GGML_NATIVE off unless Rust itself is
# built for `target-cpu=native`, and then enables only the features Rust's
# target has (plain x86-64: none of AVX). It forwards GGML_* variables to CMake,
# so the features are named here, read from /proc/cpuinfo. AMX stays off: some
# of these VMs advertise AMX tiles that fault ("Illegal instruction") on use.
set -euo pipefail
flags=" $(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null | cut -d: -f2) "
has() { [[ "$flags" == *" $1 "* ]]; }
opt() { if has "$2"; then echo "$1 = \"ON\""; else echo "$1 = \"OFF\""; fi; }
# libmlx.so defines gguf_* functions of its own and calls them through the dynamic symbol
# table; an executable that linked ggml's same-named functions with default visibility would
# export them and win that lookup (MLX's GGUF loader then aborts inside ggml). Hidden, they
# bind only inside the executable.
echo 'CMAKE_C_VISIBILITY_PRESET = "hidden"'
echo 'CMAKE_CXX_VISIBILITY_PRESET = "hidden"'
# The build script reruns only when a GGML_* variable it saw changes: this one names the
# option set (bump it when the options change); tools/mlx-linux/setup.sh then clears the
# CMake cache, which would otherwise keep the old values.
echo 'GGML_SHOAL_OPTIONS = "6"'
# The build script builds llama.cpp as RelWithDebInfo (-O2) whenever Cargo asks for debug
# info, which the release profile's line tables do; llama.cpp's own builds are Release (-O3).
echo 'LLAMA_LIB_PROFILE = "Release"'
[[ "$(uname -m)" == x86_64 ]] || exit 0
opt GGML_SSE42 sse4_2
opt GGML_AVX avx
opt GGML_AVX2 avx2
opt GGML_FMA fma
opt GGML_F16C f16c
opt GGML_BMI2 bmi2
if has avx512f && has avx512bw && has avx512dq && has avx512vl; then
  echo 'GGML_AVX512 = "ON"'
  opt GGML_AVX512_VBMI avx512vbmi
  opt GGML_AVX512_VNNI avx512_vnni
  opt GGML_AVX512_BF16 avx512_bf16
else
  echo 'GGML_AVX512 = "OFF"'
fi
opt GGML_AVX_VNNI avx_vnni
echo 'GGML_AMX_TILE = "OFF"'
echo 'GGML_AMX_INT8 = "OFF"'
echo 'GGML_AMX_BF16 = "OFF"'
# Weight repacking (GGML_CPU_REPACK) and llamafile's tiled GEMM (GGML_LLAMAFILE) stay at
# llama.cpp's defaults (on): they double prefill on Q4_K_M files. Their kernels change with a
# step's row count, so a batched row's logits may differ from its lone run in the last bits;
# `--batch-invariant` (backends/llama/mod.rs) keeps a reply equal to its lone run instead.
# Named, not left out: CMake keeps a cached OFF from an earlier build otherwise.
echo 'GGML_CPU_REPACK = "ON"'
echo 'GGML_LLAMAFILE = "ON"'
