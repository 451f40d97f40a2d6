// QKV_VULKAN_API marks the symbols of the run-time library (a DLL on Windows when built shared).
#pragma once

#if defined(QKV_VULKAN_STATIC)
#define QKV_VULKAN_API
#elif defined(_WIN32)
#if defined(QKV_VULKAN_BUILDING)
#define QKV_VULKAN_API __declspec(dllexport)
#else
#define QKV_VULKAN_API __declspec(dllimport)
#endif
#else
#define QKV_VULKAN_API __attribute__((visibility("default")))
#endif
