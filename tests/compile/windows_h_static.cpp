// Compile-only test, Windows only: qkv's public headers compile in a program that included
// <windows.h> first without NOMINMAX, i.e. with the min and max function-like macros defined.
// The headers must never write a bare std::min(...), std::max(...) or
// std::numeric_limits<T>::max(): they write (std::max)(...) and (std::numeric_limits<T>::max)().
#ifdef NOMINMAX
#undef NOMINMAX  // qkv's own targets define it; a user's program need not
#endif
#include <windows.h>

// The Windows SDK's <windows.h> defines the macros in C++ too, and MSVC's standard library is
// written to survive them. MinGW-w64's defines them in C only, and libstdc++ does not survive
// them: there, include the standard headers qkv's headers use first, then define the macros as
// the SDK does.
#if !defined(min) || !defined(max)
#include <array>
#include <bit>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <memory>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>
#ifndef max
#define max(a, b) (((a) > (b)) ? (a) : (b))
#endif
#ifndef min
#define min(a, b) (((a) < (b)) ? (a) : (b))
#endif
#endif

#include <qkv/qkv.hpp>
#include <qkv/tutorial.hpp>
#include <qkv/vulkan/runtime.hpp>

static_assert(qkv::isfinite(1.0f) && qkv::isfinite(1.0) && !qkv::isfinite(qkv::infinity<double>()));
