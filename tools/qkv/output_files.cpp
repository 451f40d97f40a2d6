// Writing all of the results or none, safely (see output_files.hpp).
#include "output_files.hpp"

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iterator>
#include <random>
#include <stdexcept>
#include <system_error>

#include "errors.hpp"
#include "npy/npy.hpp"

#ifdef _WIN32
#include <fcntl.h>
#include <io.h>
#include <sys/stat.h>
#include <windows.h>  // CompareStringOrdinal, DeleteFileW, MoveFileExW
#else
#include <fcntl.h>
#include <unistd.h>
#endif

namespace qkv::cli {
namespace {

namespace fs = std::filesystem;

// ---- Cleanup on SIGINT and SIGTERM ----------------------------------------------------------
// A fixed table of paths the handler acts on; written only outside the handler, each slot's
// path complete before its `used` flag is set. The handler calls only unlink/rename (POSIX:
// async-signal-safe) or DeleteFileW/MoveFileExW (Windows runs the handler on its own thread).

#ifdef _WIN32
using native_char = wchar_t;
#else
using native_char = char;
#endif

constexpr std::size_t slot_count = 16;  // a run holds at most 2 temporaries and 2 backups
constexpr std::size_t slot_path_max = 4096;

struct slot {
    native_char path[slot_path_max];
    native_char restore_to[slot_path_max];  // empty: remove `path`; else rename `path` to it
    volatile std::sig_atomic_t used;
};
slot slots[slot_count];

constexpr int cleanup_signals[] = {SIGINT, SIGTERM};

extern "C" void on_signal(int sig) {
    for (slot& s : slots) {
        if (!s.used) continue;
#ifdef _WIN32
        if (s.restore_to[0] != 0)
            MoveFileExW(s.path, s.restore_to, MOVEFILE_REPLACE_EXISTING);
        else
            DeleteFileW(s.path);
#else
        if (s.restore_to[0] != 0)
            (void)::rename(s.path, s.restore_to);
        else
            (void)::unlink(s.path);
#endif
    }
    std::signal(sig, SIG_DFL);
    std::raise(sig);  // end as the signal would have
}

void copy_native(native_char* to, const fs::path& p) {
    const auto& native = p.native();
    if (native.size() >= slot_path_max)
        throw std::runtime_error(npy::path_to_utf8(p) + ": path too long (" + std::to_string(native.size()) +
                                 " characters)");
    std::copy(native.begin(), native.end(), to);
    to[native.size()] = 0;
}

/// Takes a free slot for `p` (removed by the handler unless set_restore is called).
slot& register_path(const fs::path& p) {
    for (slot& s : slots) {
        if (s.used) continue;
        copy_native(s.path, p);
        s.restore_to[0] = 0;
        std::atomic_signal_fence(std::memory_order_seq_cst);
        s.used = 1;
        return s;
    }
    throw std::logic_error("qkv: too many temporary files registered for cleanup");
}

void release(slot*& s) {
    if (s == nullptr) return;
    s->used = 0;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    s = nullptr;
}

/// Changes what the handler does with a slot: `path` (now) and what to do with it. The slot is
/// marked unused while it changes, so the handler never sees half a path.
void retarget(slot& s, const fs::path& path, const fs::path* restore_to) {
    s.used = 0;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    copy_native(s.path, path);
    if (restore_to)
        copy_native(s.restore_to, *restore_to);
    else
        s.restore_to[0] = 0;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    s.used = 1;
}

// ---- Files -------------------------------------------------------------------------------------

std::string os_message(int err) { return std::error_code(err, std::generic_category()).message(); }

/// ".qkv-0123456789abcdef.tmp": 25 characters whatever the target's name is.
fs::path temporary_name(const fs::path& target, const char* suffix) {
    static std::atomic<std::uint64_t> counter{0};
    static const std::uint64_t seed = [] {
        std::random_device rd;
        return (static_cast<std::uint64_t>(rd()) << 32) ^ rd();
    }();
    const auto now = static_cast<std::uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    const std::uint64_t tag = seed ^ now ^ (counter.fetch_add(1) * 0x9e3779b97f4a7c15u);
    char name[40];
    std::snprintf(name, sizeof name, ".qkv-%016llx.%s", static_cast<unsigned long long>(tag), suffix);
    return target.parent_path() / fs::path(name);
}

int create_exclusive(const fs::path& p) {
#ifdef _WIN32
    return _wopen(p.c_str(), _O_WRONLY | _O_CREAT | _O_EXCL | _O_BINARY, _S_IREAD | _S_IWRITE);
#else
    return ::open(p.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
#endif
}

bool write_bytes(int fd, const void* data, std::size_t size) {
    const char* p = static_cast<const char*>(data);
    while (size > 0) {
        const std::size_t piece = std::min<std::size_t>(size, std::size_t{1} << 30);
#ifdef _WIN32
        const int n = _write(fd, p, static_cast<unsigned>(piece));
#else
        const ssize_t n = ::write(fd, p, piece);
        if (n < 0 && errno == EINTR) continue;
#endif
        if (n <= 0) return false;
        p += n;
        size -= static_cast<std::size_t>(n);
    }
    return true;
}

bool sync_and_close(int fd) {
#ifdef _WIN32
    const bool synced = _commit(fd) == 0;
    const int err = errno;
    const bool closed = _close(fd) == 0;
#else
    const bool synced = ::fsync(fd) == 0;
    const int err = errno;
    const bool closed = ::close(fd) == 0;
#endif
    if (!synced) errno = err;
    return synced && closed;
}

void close_quietly(int fd) {
#ifdef _WIN32
    _close(fd);
#else
    ::close(fd);
#endif
}

bool same_path(const std::string& a, const std::string& b) {
    const auto resolved = [](const std::string& name) {
        const fs::path path = npy::path_from_utf8(name);
        std::error_code ec;
        const fs::path absolute = fs::absolute(path, ec);
        const fs::path canonical = fs::weakly_canonical(absolute, ec);
        return ec ? path.lexically_normal() : canonical;
    };
#ifdef _WIN32
    // Windows file names are case-insensitive: out.npy and OUT.npy are one file. Compare as the
    // file system does (ordinal, ignoring case), with one kind of separator.
    const std::wstring x = resolved(a).make_preferred().native(), y = resolved(b).make_preferred().native();
    return CompareStringOrdinal(x.c_str(), static_cast<int>(x.size()), y.c_str(), static_cast<int>(y.size()), TRUE) ==
           CSTR_EQUAL;
#else
    return resolved(a) == resolved(b);
#endif
}

/// One file by any name: the same device and inode (file index on Windows) when both exist,
/// else the same absolute path.
bool same_file(const std::string& a, const std::string& b) {
    std::error_code ec;
    const bool equal = fs::equivalent(npy::path_from_utf8(a), npy::path_from_utf8(b), ec);
    if (!ec) return equal;
    return same_path(a, b);
}

std::string kind_of(fs::file_type t) {
    switch (t) {
        case fs::file_type::directory:
            return "a directory";
        case fs::file_type::block:
            return "a block device";
        case fs::file_type::character:
            return "a character device";
        case fs::file_type::fifo:
            return "a FIFO";
        case fs::file_type::socket:
            return "a socket";
        default:
            return "not a regular file";
    }
}

}  // namespace

void check_output_paths(std::span<const named_file> outputs, std::span<const named_file> inputs) {
    for (std::size_t i = 0; i < outputs.size(); ++i) {
        const named_file& o = outputs[i];
        if (o.path.empty()) continue;
        const fs::path p = npy::path_from_utf8(o.path);
        const std::string what = o.flag + " " + o.path;
        const fs::path name = p.filename();
        if (name.empty() || name == "." || name == "..") throw usage_error(what + ": not a file name");
        std::error_code ec;
        const fs::file_status st = fs::symlink_status(p, ec);
        if (!ec && fs::exists(st)) {
            if (fs::is_symlink(st))
                throw usage_error(what +
                                  " is a symbolic link: qkv neither replaces a link nor writes through "
                                  "one; name the file itself");
            if (!fs::is_regular_file(st))
                throw usage_error(what + " exists and is " + kind_of(st.type()) + ": qkv replaces only regular files");
        }
        for (const named_file& in : inputs)
            if (!in.path.empty() && same_file(o.path, in.path))
                throw usage_error(what + " is the input " + in.flag + " " + in.path +
                                  ": qkv never writes over its inputs");
        for (std::size_t j = 0; j < i; ++j)
            if (!outputs[j].path.empty() && same_file(o.path, outputs[j].path))
                throw usage_error(outputs[j].flag + " and " + o.flag + " name the same file (" + outputs[j].path + ")");
    }
}

struct output_set::impl {
    struct entry {
        fs::path target, temp, backup;
        std::string name;  // UTF-8, for messages
        int fd = -1;
        slot* temp_slot = nullptr;
        slot* backup_slot = nullptr;
        bool renamed = false;
    };
    std::vector<entry> entries;
#ifdef _WIN32
    using handler_t = void (*)(int);
    handler_t previous[std::size(cleanup_signals)] = {};
#else
    struct sigaction previous[std::size(cleanup_signals)] = {};
#endif
    bool handlers_installed = false;

    void install_handlers() {
        if (handlers_installed) return;
        for (std::size_t i = 0; i < std::size(cleanup_signals); ++i) {
#ifdef _WIN32
            previous[i] = std::signal(cleanup_signals[i], on_signal);
            if (previous[i] == SIG_IGN) std::signal(cleanup_signals[i], SIG_IGN);  // keep ignoring
#else
            struct sigaction action {};
            action.sa_handler = on_signal;
            sigemptyset(&action.sa_mask);
            for (const int s : cleanup_signals) sigaddset(&action.sa_mask, s);
            sigaction(cleanup_signals[i], nullptr, &previous[i]);
            if (previous[i].sa_handler != SIG_IGN) sigaction(cleanup_signals[i], &action, nullptr);
#endif
        }
        handlers_installed = true;
    }

    void restore_handlers() {
        if (!handlers_installed) return;
        for (std::size_t i = 0; i < std::size(cleanup_signals); ++i) {
#ifdef _WIN32
            std::signal(cleanup_signals[i], previous[i]);
#else
            sigaction(cleanup_signals[i], &previous[i], nullptr);
#endif
        }
        handlers_installed = false;
    }

    /// Undoes everything not yet committed: renamed targets are put back (or removed, if they
    /// did not exist before), temporaries and backups removed.
    void roll_back() noexcept {
        for (entry& e : entries) {
            std::error_code ignored;
            if (e.fd >= 0) close_quietly(e.fd);
            e.fd = -1;
            if (e.renamed) {
                if (!e.backup.empty())
                    fs::rename(e.backup, e.target, ignored);
                else
                    fs::remove(e.target, ignored);
            } else {
                if (!e.temp.empty()) fs::remove(e.temp, ignored);
                if (!e.backup.empty()) fs::remove(e.backup, ignored);
            }
            release(e.temp_slot);
            release(e.backup_slot);
        }
        entries.clear();
    }

    [[noreturn]] void fail(const entry& e, const std::string& what, const std::string& why) {
        const std::string message = e.name + ": " + what + ": " + why;
        roll_back();
        throw std::runtime_error(message);
    }
    [[noreturn]] void fail(const entry& e, const std::string& what, int err) { fail(e, what, os_message(err)); }
};

output_set::output_set() : impl_(std::make_unique<impl>()) {}

output_set::~output_set() {
    impl_->roll_back();
    impl_->restore_handlers();
}

void output_set::reserve(const std::vector<std::string>& paths) {
    impl_->install_handlers();
    for (const std::string& path : paths) {
        if (path.empty()) continue;
        impl::entry& e = impl_->entries.emplace_back();
        e.name = path;
        e.target = npy::path_from_utf8(path);
        for (int attempt = 0;; ++attempt) {
            e.temp = temporary_name(e.target, "tmp");
            e.temp_slot = &register_path(e.temp);
            errno = 0;
            e.fd = create_exclusive(e.temp);
            if (e.fd >= 0) break;
            const int err = errno;
            release(e.temp_slot);
            if (err != EEXIST || attempt >= 100) {
                e.temp.clear();
                impl_->fail(e, "cannot create a file in its directory", err);
            }
        }
    }
}

void output_set::commit(const std::vector<output_file>& files) {
    std::vector<impl::entry>& entries = impl_->entries;
    std::size_t next = 0;
    for (const output_file& f : files) {
        if (f.path.empty()) continue;
        if (next >= entries.size() || entries[next].name != f.path)
            throw std::logic_error("qkv: output_set::commit: " + f.path + " was not reserved");
        impl::entry& e = entries[next++];
        std::vector<std::byte> header;
        const void* bytes = nullptr;
        std::size_t size = 0;
        if (const auto* text = std::get_if<std::string_view>(&f.data)) {
            bytes = text->data(), size = text->size();
        } else {
            const bool is_double = std::holds_alternative<std::span<const double>>(f.data);
            const std::size_t count = is_double ? std::get<1>(f.data).size() : std::get<0>(f.data).size();
            bytes = is_double ? static_cast<const void*>(std::get<1>(f.data).data())
                              : static_cast<const void*>(std::get<0>(f.data).data());
            size = count * (is_double ? sizeof(double) : sizeof(float));
            try {
                header = npy::header(f.shape, is_double ? npy::dtype::f64 : npy::dtype::f32);
            } catch (const npy::error& err) {
                impl_->roll_back();
                throw std::runtime_error(e.name + ": " + err.what());
            }
            std::size_t expected = 1;
            for (const std::size_t d : f.shape) expected *= d;
            if (expected != count) {
                impl_->roll_back();
                throw std::logic_error("qkv: " + e.name + ": shape and data size differ");
            }
        }
        errno = 0;
        if (!write_bytes(e.fd, header.data(), header.size()) || !write_bytes(e.fd, bytes, size))
            impl_->fail(e, "write error", errno);
        const int fd = e.fd;
        e.fd = -1;
        errno = 0;
        if (!sync_and_close(fd)) impl_->fail(e, "write error", errno);
    }
    if (next != entries.size()) throw std::logic_error("qkv: output_set::commit: an output was not given");

    // Every temporary is complete. Keep each existing target under a second name (a hard link),
    // so that a failed rename below can put every earlier target back as it was.
    for (impl::entry& e : entries) {
        std::error_code ec;
        if (!fs::is_regular_file(fs::symlink_status(e.target, ec))) continue;
        e.backup = temporary_name(e.target, "bak");
        e.backup_slot = &register_path(e.backup);
        fs::create_hard_link(e.target, e.backup, ec);
        if (ec) {  // no hard links here (e.g. FAT): go on without a backup of this one
            release(e.backup_slot);
            e.backup.clear();
        }
    }
    for (impl::entry& e : entries) {
        std::error_code ec;
        fs::rename(e.temp, e.target, ec);
        if (ec) impl_->fail(e, "cannot replace the file", ec.message());
        e.renamed = true;
        // From now on an interruption puts the old file back (or removes the new one).
        if (e.backup_slot) {
            retarget(*e.backup_slot, e.backup, &e.target);
            release(e.temp_slot);
        } else {
            retarget(*e.temp_slot, e.target, nullptr);
        }
    }
    // Done: the backups go, nothing is left to clean up.
    for (impl::entry& e : entries) {
        release(e.temp_slot);
        if (e.backup_slot) retarget(*e.backup_slot, e.backup, nullptr);  // interrupted now: just remove it
        std::error_code ignored;
        if (!e.backup.empty()) fs::remove(e.backup, ignored);
        release(e.backup_slot);
    }
    entries.clear();
}

}  // namespace qkv::cli
