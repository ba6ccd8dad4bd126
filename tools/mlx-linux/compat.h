/*
 * Force-included into every mlx-c translation unit when building against the
 * Linux mlx-cpu wheel with GCC 12.
 *
 * 1. mlx-c only declares float16_t/bfloat16_t on ARM, but mlx-rs calls the
 *    f16/bf16 entry points on every platform, so give x86 the MLX C++ types.
 *    (Guarded so CMake's compiler probe, which has no MLX include path, passes.)
 * 2. libstdc++ 12 has no std::format; mlx-c only uses it with "{}" holes in
 *    error messages, so a tiny stream-based stand-in is enough.
 */
#ifndef SHOAL_MLXC_COMPAT_H
#define SHOAL_MLXC_COMPAT_H
#ifdef __cplusplus

#if !defined(__aarch64__) && __has_include("mlx/types/half_types.h")
#include "mlx/types/half_types.h"
typedef mlx::core::float16_t float16_t;
typedef mlx::core::bfloat16_t bfloat16_t;
#define HAS_FLOAT16
#define HAS_BFLOAT16
#endif

#include <version>
#if !defined(__cpp_lib_format)
#include <initializer_list>
#include <sstream>
#include <string>
#include <string_view>
namespace std {
template <typename... Args>
inline string format(string_view pattern, const Args&... args) {
  string pieces[sizeof...(Args) + 1];
  size_t n = 0;
  (void)initializer_list<int>{
      ((void)(pieces[n++] = (ostringstream() << args).str()), 0)...};
  string out;
  size_t next = 0;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '{' && i + 1 < pattern.size() && pattern[i + 1] == '}') {
      if (next < n) out += pieces[next++];
      ++i;
    } else {
      out += pattern[i];
    }
  }
  return out;
}
} // namespace std
#endif

#endif /* __cplusplus */
#endif /* SHOAL_MLXC_COMPAT_H */
