// QKV_RUNTIME_API marks the symbols of qkv::runtime, the backend-neutral run-time library (the
// problem types, their validation and the float64 CPU backend): a DLL on Windows when built shared.
// QKV_RUNTIME_STATIC: linked statically (set by the qkv::runtime target); QKV_RUNTIME_BUILDING:
// compiling the library itself.
#pragma once

#if defined(QKV_RUNTIME_STATIC)
#define QKV_RUNTIME_API
#elif defined(_WIN32)
#if defined(QKV_RUNTIME_BUILDING)
#define QKV_RUNTIME_API __declspec(dllexport)
#else
#define QKV_RUNTIME_API __declspec(dllimport)
#endif
#else
#define QKV_RUNTIME_API __attribute__((visibility("default")))
#endif
