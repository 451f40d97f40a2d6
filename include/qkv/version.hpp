// qkv's version, written once: here. CMakeLists.txt reads these three lines into
// project(qkv VERSION ...), so the package version, the library's SOVERSION and this header agree,
// and the header-only core needs no build step to know its version.
#pragma once

#define QKV_VERSION_MAJOR 0
#define QKV_VERSION_MINOR 1
#define QKV_VERSION_PATCH 0

#define QKV_VERSION_STRINGIFY_(x) #x
#define QKV_VERSION_STRINGIFY(x) QKV_VERSION_STRINGIFY_(x)

namespace qkv {
/// "major.minor.patch"
inline constexpr const char* version_string = QKV_VERSION_STRINGIFY(QKV_VERSION_MAJOR) "." QKV_VERSION_STRINGIFY(
    QKV_VERSION_MINOR) "." QKV_VERSION_STRINGIFY(QKV_VERSION_PATCH);
}  // namespace qkv
