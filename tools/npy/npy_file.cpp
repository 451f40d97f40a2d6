// qkv::npy, file I/O: reading a .npy file as it is parsed, and writing one atomically.
#include "npy_detail.hpp"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <system_error>
#include <utility>

#if defined(_WIN32)
#include <fcntl.h>
#include <io.h>
#include <sys/stat.h>
#else
#include <unistd.h>
#endif

namespace qkv::npy {

using namespace detail;

namespace {

std::FILE* open_file(const fs::path& path, const char* mode) {
#if defined(_WIN32)
    std::wstring wmode(mode, mode + std::strlen(mode));
    return _wfopen(path.c_str(), wmode.c_str());
#else
    return std::fopen(path.c_str(), mode);
#endif
}

/// A new file opened for binary writing; fails (errno EEXIST) if `path` exists. fopen's "wbx":
/// except on Windows, where msvcrt.dll (MinGW-w64's default C runtime) ignores the 'x' and
/// would truncate an existing file, so the file is created with _O_EXCL instead.
std::FILE* create_new_file(const fs::path& path) {
#if defined(_WIN32)
    const int fd = _wopen(path.c_str(), _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE);
    if (fd < 0) return nullptr;
    std::FILE* f = _fdopen(fd, "wb");
    if (!f) {
        const int err = errno;
        _close(fd);
        errno = err;
    }
    return f;
#else
    return std::fopen(path.c_str(), "wbx");
#endif
}

struct file_closer {
    void operator()(std::FILE* f) const noexcept { std::fclose(f); }
};
using file_ptr = std::unique_ptr<std::FILE, file_closer>;

// Appends up to `count` bytes from `f` to `buf`, in pieces of at most 64 MiB, so that a header
// declaring more than the file holds costs no more memory than the file. Returns the bytes read.
std::size_t read_more(std::FILE* f, std::vector<std::byte>& buf, std::size_t count, std::string_view name) {
    constexpr std::size_t piece = std::size_t{64} << 20;
    std::size_t got = 0;
    while (got < count) {
        const std::size_t want = std::min(piece, count - got);
        const std::size_t at = buf.size();
        buf.resize(at + want);
        errno = 0;
        const std::size_t n = std::fread(buf.data() + at, 1, want, f);
        buf.resize(at + n);
        got += n;
        if (n < want) {
            if (std::ferror(f)) fail(name, "read error: " + os_message(errno));
            break;  // end of file
        }
    }
    return got;
}

// Reads a .npy file, checking as it goes: the magic string and the preamble first (a file that
// is not .npy, /dev/zero included, fails after 12 bytes), then the header, then exactly the data
// the header declares and one byte more, to tell trailing data. Nothing is read past that.
std::vector<std::byte> read_file(const fs::path& path, std::string_view name) {
    errno = 0;
    file_ptr f(open_file(path, "rb"));
    if (!f) fail(name, "cannot open for reading: " + os_message(errno));
    std::vector<std::byte> buf;
    read_more(f.get(), buf, 12, name);  // magic, version, header length (2 or 4 bytes)
    const std::size_t end = header_end(buf, name);
    if (end > buf.size()) read_more(f.get(), buf, end - buf.size(), name);
    const layout l = parse_header(buf, name);                  // throws if the header is truncated or bad
    if (buf.size() > l.data_start + l.data_bytes) return buf;  // trailing data: parse() says so
    const std::size_t want = l.data_start + l.data_bytes + 1 - buf.size();
    std::error_code size_ec;
    const std::uintmax_t file_size = fs::file_size(path, size_ec);
    try {
        // A regular file that holds the data: one allocation of the whole (failing at once if it
        // cannot be had). Otherwise read_more grows the buffer as the data comes.
        if (!size_ec && file_size >= l.data_start + l.data_bytes) buf.reserve(l.data_start + l.data_bytes + 1);
    } catch (const std::bad_alloc&) {
        fail(name, "out of memory: the header declares " + std::to_string(l.data_bytes) + " bytes of data (shape " +
                       shape_brief(l.dims) + ", " + std::string(dtype_name(l.type)) + ")");
    }
    if (read_more(f.get(), buf, want, name) == want) {
        // More than the header declares: say how much, when the file's size is known.
        std::error_code ec;
        const std::uintmax_t size = fs::file_size(path, ec);
        if (!ec && size > l.data_start + l.data_bytes) {
            fail(name, "unexpected trailing data: expected " + std::to_string(l.data_bytes) + " bytes of data, found " +
                           std::to_string(size - l.data_start));
        }
        fail(name, "unexpected trailing data after the " + std::to_string(l.data_bytes) + " bytes of data");
    }
    return buf;
}

template <class T>
void write_named(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const T> data) {
    const std::string name = path_to_utf8(path);
    const std::vector<std::byte> bytes = serialize_named(shape, data, name);
    const fs::path filename = path.filename();
    if (filename.empty() || filename == "." || filename == "..") fail(name, "cannot write: not a file name");

    // Create a fresh temporary file next to the target ("wx": fail if it exists).
    static std::atomic<std::uint64_t> counter{0};
    fs::path tmp;
    file_ptr f;
    for (int attempt = 0; !f; ++attempt) {
        const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
        std::uint64_t tag = now ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15u) ^
                            static_cast<std::uint64_t>(reinterpret_cast<std::uintptr_t>(&tmp));
        char hex[17];
        std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(tag));
        // A fixed-length name, whatever the target's: "." + filename + suffix could exceed NAME_MAX.
        tmp = path.parent_path() / path_from_utf8(std::string(".npy-") + hex + ".tmp");
        errno = 0;
        f.reset(create_new_file(tmp));
        if (!f && (errno != EEXIST || attempt >= 100)) {
            fail(name, "cannot create temporary file " + py_quote(path_to_utf8(tmp)) + ": " + os_message(errno));
        }
    }

    const auto abandon = [&](std::string what, int err) {
        f.reset();
        std::error_code ignored;
        fs::remove(tmp, ignored);
        fail(name, what + ": " + os_message(err));
    };
    errno = 0;
    if (!bytes.empty() && std::fwrite(bytes.data(), 1, bytes.size(), f.get()) != bytes.size()) {
        abandon("write error", errno);
    }
    if (std::fflush(f.get()) != 0) abandon("write error", errno);
#if defined(_WIN32)
    if (_commit(_fileno(f.get())) != 0) abandon("cannot sync", errno);
#else
    if (::fsync(::fileno(f.get())) != 0) abandon("cannot sync", errno);
#endif
    if (std::fclose(f.release()) != 0) abandon("write error", errno);

    std::error_code ec;
    fs::rename(tmp, path, ec);
    if (ec) {
        std::error_code ignored;
        fs::remove(tmp, ignored);
        fail(name, "cannot replace file with " + py_quote(path_to_utf8(tmp)) + ": " + ec.message());
    }
}

}  // namespace

array read(const std::filesystem::path& path) {
    const std::string name = path_to_utf8(path);
    try {
        const std::vector<std::byte> bytes = read_file(path, name);
        return parse(bytes, name);
    } catch (const std::bad_alloc&) {
        std::error_code ec;
        const std::uintmax_t size = fs::file_size(path, ec);
        fail(name, "out of memory reading the file" + (ec ? std::string() : " (" + std::to_string(size) + " bytes)"));
    }
}

void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const float> data) {
    write_named(path, shape, data);
}

void write(const std::filesystem::path& path, std::span<const std::size_t> shape, std::span<const double> data) {
    write_named(path, shape, data);
}

}  // namespace qkv::npy
