#include "plan/settings.hpp"

#include <cstdio>
#include <cstdlib>
#include <string>

#include "qkv/runtime/error.hpp"

namespace qkv::vulkan::detail {
namespace {

/// The value of an environment variable, or empty.
std::string environment(const char* name) {
    const char* v = std::getenv(name);
    return v ? v : "";
}

bool power_of_two(unsigned v) { return v != 0 && (v & (v - 1)) == 0; }

/// "a,b" as two numbers, nothing after them.
bool two_numbers(const std::string& text, unsigned& a, unsigned& b) {
    char tail = 0;
    return std::sscanf(text.c_str(), "%u,%u%c", &a, &b, &tail) == 2;
}

/// 0 or 1, else invalid_argument naming the variable.
bool flag(const char* name, const std::string& v, const char* meaning) {
    if (v != "0" && v != "1") throw invalid_argument(std::string(name) + "=" + v + ": expected " + meaning);
    return v == "1";
}

}  // namespace

settings read_settings(const testing::hooks& hooks) {
    settings s;
    if (const std::string v = environment("QKV_CPU_SHUFFLE"); !v.empty())
        s.cpu_shuffle = flag("QKV_CPU_SHUFFLE", v, "0 (never) or 1 (where the device allows)");
    if (const std::string v = environment("QKV_FLASH_CPU_TILES"); !v.empty()) {  // tuning: "rows,keys"
        unsigned r = 0, k = 0;
        if (!two_numbers(v, r, k) || !power_of_two(r) || r > 16 || !power_of_two(k) || k > 32)
            throw invalid_argument("QKV_FLASH_CPU_TILES=" + v +
                                   ": expected rows,keys, powers of two with rows <= 16 and keys <= 32 (e.g. 8,4)");
        s.flash_cpu_rows = r, s.flash_cpu_keys = k;
    }
    if (const std::string v = environment("QKV_PROJECT_TILES"); !v.empty()) {  // tuning: "rows,cols"
        unsigned tm = 0, tn = 0;
        if (!two_numbers(v, tm, tn) || tm < 1 || tm > 16 || tn < 4 || tn > 32 || tn % 4 != 0)
            throw invalid_argument("QKV_PROJECT_TILES=" + v +
                                   ": expected rows,cols with 1 <= rows <= 16 and cols a multiple of 4 in 4..32");
        s.project_rows = tm, s.project_cols = tn;
    }
    if (const std::string v = environment("QKV_COOP_TILES"); !v.empty()) {  // tuning: "subgroups,keys"
        unsigned w = 0, k = 0;
        if (!two_numbers(v, w, k) || !power_of_two(w) || w > 16 || !power_of_two(k) || k > 256)
            throw invalid_argument("QKV_COOP_TILES=" + v +
                                   ": expected subgroups,keys, powers of two with subgroups <= 16 and keys <= 256 "
                                   "(e.g. 4,64)");
        s.coop_subgroups = w, s.coop_keys = k;
    }
    if (const std::string v = environment("QKV_PROJECT_TEXELS"); !v.empty())
        s.project_texels = flag("QKV_PROJECT_TEXELS", v, "0 or 1");
    if (const std::string v = environment("QKV_BACKWARD_TILES"); !v.empty()) {  // tuning
        unsigned a = 0, b = 0, c = 0, d = 0;
        char tail = 0;
        const bool ok = std::sscanf(v.c_str(), "%u,%u,%u,%u%c", &a, &b, &c, &d, &tail) == 4 && power_of_two(a) &&
                        a <= 8 && power_of_two(b) && b >= 4 && b <= 32 && power_of_two(c) && c <= 8 &&
                        power_of_two(d) && d <= 32;
        if (!ok)
            throw invalid_argument("QKV_BACKWARD_TILES=" + v +
                                   ": expected rows,keys,keys,rows, powers of two: rows per invocation <= 8, keys "
                                   "per step 4..32, keys per invocation <= 8, rows per step <= 32 (e.g. 2,8,2,8)");
        s.backward_rows = a, s.backward_keys = b, s.backward_own_keys = c, s.backward_rows_step = d;
    }
    if (const std::string v = environment("QKV_BACKWARD_FUSED"); !v.empty())
        s.backward_fused = flag("QKV_BACKWARD_FUSED", v, "0 (never) or 1 (where the plan takes it)");
    if (const std::string v = environment("QKV_BACKWARD_COOP"); !v.empty())
        s.backward_coop = flag("QKV_BACKWARD_COOP", v, "0 (never) or 1 (dk and dv by the cooperative-matrix family)");
    if (const std::string v = environment("QKV_COOP_UNVERIFIED"); !v.empty())
        s.coop_unverified = flag("QKV_COOP_UNVERIFIED", v,
                                 "0 (never) or 1 (the cooperative-matrix family where asked for, on a device its "
                                 "gate has not seen it right)");
    if (const std::string v = environment("QKV_COOP_ISOLATE"); !v.empty()) {  // fault finding
        if (v == "pv")
            s.coop_isolate = coop_isolate_mode::pv;
        else if (v == "rescale")
            s.coop_isolate = coop_isolate_mode::rescale;
        else if (v != "none")
            throw invalid_argument("QKV_COOP_ISOLATE=" + v +
                                   ": expected none, pv (P·V and the rescale per element) or rescale (the "
                                   "rescale per element)");
    }
    if (const std::string v = environment("QKV_DECODE_CPU_TILES"); !v.empty()) {  // tuning: "rows,keys"
        unsigned r = 0, k = 0;
        if (!two_numbers(v, r, k) || !power_of_two(r) || r > 8 || !power_of_two(k) || k < 4 || k > 64)
            throw invalid_argument("QKV_DECODE_CPU_TILES=" + v +
                                   ": expected rows,keys, powers of two with rows <= 8 and keys in 4..64 (e.g. 1,8)");
        s.decode_cpu_rows = r, s.decode_cpu_keys = k;
    }
    s.max_fused_keys = hooks.max_fused_keys_per_dispatch;
    s.max_fused_heads = hooks.max_fused_backward_heads;
    s.fused_tiles_as = hooks.fused_tiles_as;
    s.max_decode_chunks = hooks.max_decode_chunks;
    s.decode_unrolled_texels = hooks.decode_unrolled_texels;
    s.decode_vote = hooks.decode_vote;
    s.force_staging = hooks.force_staging;
    s.kv_storage_range = hooks.kv_storage_range;
    return s;
}

}  // namespace qkv::vulkan::detail
