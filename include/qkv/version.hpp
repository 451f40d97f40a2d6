#pragma once

#define QKV_VERSION_MAJOR 0
#define QKV_VERSION_MINOR 1
#define QKV_VERSION_PATCH 0

namespace qkv {
inline constexpr const char* version_string = "0.1.0";
}
