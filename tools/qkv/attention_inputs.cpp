// Reading and checking the inputs of `qkv attention` (see attention_inputs.hpp).
#include "attention_inputs.hpp"

#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <string>
#include <vector>

#include "errors.hpp"
#include "npy/npy.hpp"

namespace qkv::cli {
namespace {

[[noreturn]] void refuse(const qkv::npy::array& a, const std::string& problem) {
    throw usage_error(a.name + " has shape " + a.shape_string() + problem);
}

std::string tuple(std::initializer_list<std::string> parts) {
    std::string s = "(";
    for (const std::string& p : parts) s += (s.size() > 1 ? ", " : "") + p;
    return s + (parts.size() == 1 ? ",)" : ")");
}

std::string str(std::size_t n) { return std::to_string(n); }

/// Weights, biases and x hold numbers: float32 or float64, kept as they are.
numeric_input numbers(const qkv::npy::array& a, const std::string& role) {
    if (a.type == qkv::npy::dtype::b1)
        throw usage_error(a.name + " has dtype bool: " + role + " must be float32 or float64");
    numeric_input n;
    n.name = a.name;
    n.float64 = a.type == qkv::npy::dtype::f64;
    try {
        if (n.float64)
            n.f64 = a.to_double();
        else
            n.f32 = a.to_float();
    } catch (const qkv::npy::error& e) {
        throw usage_error(e.what());
    }
    return n;
}

std::string number(double v) {
    char text[32];
    std::snprintf(text, sizeof text, "%.9g", v);
    return text;
}

void narrow(numeric_input& n) {
    if (!n.float64 || !n.f32.empty() || n.f64.empty()) return;
    constexpr double max = std::numeric_limits<float>::max();
    n.f32.resize(n.f64.size());
    for (std::size_t i = 0; i < n.f64.size(); ++i) {
        const double v = n.f64[i];
        if (std::isfinite(v) && std::fabs(v) > max) {
            n.f32.clear();
            throw usage_error(n.name + ": element " + std::to_string(i) + " is " + number(v) +
                              ", beyond the float32 range (|value| <= 3.4028235e+38); the Vulkan backend "
                              "computes in float32 (--backend cpu computes float64 inputs in float64)");
        }
        n.f32[i] = static_cast<float>(v);
    }
}

void widen(numeric_input& n) {
    if (n.float64 || !n.f64.empty() || n.f32.empty()) return;
    n.f64.assign(n.f32.begin(), n.f32.end());
}

/// A 2-D weight with `rows` rows and at least one column: "wq.npy has shape (5, 3) but x.npy has
/// d_in = 4: wq must be (4, d_k)".
std::size_t check_weight(const qkv::npy::array& w, const std::string& role, std::size_t rows,
                         const std::string& rows_name, const qkv::npy::array& rows_from, const std::string& cols_name) {
    if (w.shape.size() != 2 || w.shape[0] != rows)
        refuse(w, " but " + rows_from.name + " has " + rows_name + " = " + str(rows) + ": " + role + " must be " +
                      tuple({str(rows), cols_name}));
    if (w.shape[1] == 0) refuse(w, ": " + role + " must have at least one column");
    return w.shape[1];
}

/// A 1-D bias of `width` elements: "bq.npy has shape (2,) but wq.npy has d_k = 3: bq must be (3,)".
void check_bias(const qkv::npy::array& b, const std::string& role, std::size_t width, const std::string& width_name,
                const qkv::npy::array& width_from) {
    if (b.shape.size() != 1 || b.shape[0] != width)
        refuse(b, " but " + width_from.name + " has " + width_name + " = " + str(width) + ": " + role + " must be " +
                      tuple({str(width)}));
}

void check_x(const qkv::npy::array& x) {
    if (x.shape.size() != 2 && x.shape.size() != 3) refuse(x, ": x must be (N, d_in) or (B, N, d_in)");
    for (std::size_t d : x.shape)
        if (d == 0) refuse(x, ": every dimension of x must be at least 1");
}

/// (N, N), or (B, N, N) with x's batch (1 for a 2-D x).
void check_mask(const qkv::npy::array& m, const qkv::attention_shape& s, const qkv::npy::array& x) {
    const std::size_t n = s.seq;
    const bool square = m.shape.size() == 2 && m.shape[0] == n && m.shape[1] == n;
    const bool batched = m.shape.size() == 3 && m.shape[0] == s.batch && m.shape[1] == n && m.shape[2] == n;
    if (square || batched) return;
    refuse(m, " but " + x.name + " has " + (x.shape.size() == 3 ? "B = " + str(s.batch) + ", " : std::string()) +
                  "N = " + str(n) + ": mask must be " + tuple({str(n), str(n)}) + " or " +
                  tuple({str(s.batch), str(n), str(n)}));
}

void check_heads(std::size_t heads, const qkv::attention_shape& s, const qkv::npy::array& wq,
                 const qkv::npy::array& wv) {
    if (heads == 0) throw usage_error("--heads must be at least 1");
    if (s.d_k % heads != 0)
        throw usage_error("--heads " + str(heads) + " does not divide d_k = " + str(s.d_k) + " (the columns of " +
                          wq.name + ")");
    if (s.d_v % heads != 0)
        throw usage_error("--heads " + str(heads) + " does not divide d_v = " + str(s.d_v) + " (the columns of " +
                          wv.name + ")");
}

}  // namespace

attention_inputs load_attention_inputs(const attention_files& files, std::size_t heads, const npy_reader& reader) {
    // A file that cannot be read or parsed is a usage error (the reader's message starts with the path).
    const auto read = [&reader](const std::string& path) {
        try {
            return reader ? reader(path) : qkv::npy::read(qkv::npy::path_from_utf8(path));
        } catch (const qkv::npy::error& e) {
            throw usage_error(e.what());
        }
    };
    attention_inputs in;
    qkv::attention_shape& s = in.shape;

    const qkv::npy::array x = read(files.x);
    check_x(x);
    in.batched = x.shape.size() == 3;
    s.batch = in.batched ? x.shape[0] : 1;
    s.seq = x.shape[x.shape.size() - 2];
    s.d_in = x.shape.back();
    in.x = numbers(x, "x");

    const qkv::npy::array wq = read(files.wq);
    s.d_k = check_weight(wq, "wq", s.d_in, "d_in", x, "d_k");
    in.wq = numbers(wq, "wq");

    const qkv::npy::array wk = read(files.wk);
    check_weight(wk, "wk", s.d_in, "d_in", x, "d_k");
    if (wk.shape[1] != s.d_k)
        refuse(wk, " but " + wq.name + " has d_k = " + str(s.d_k) + ": wk must be " + tuple({str(s.d_in), str(s.d_k)}) +
                       " (queries and keys must have the same width)");
    in.wk = numbers(wk, "wk");

    const qkv::npy::array wv = read(files.wv);
    s.d_v = check_weight(wv, "wv", s.d_in, "d_in", x, "d_v");
    in.wv = numbers(wv, "wv");

    check_heads(heads, s, wq, wv);
    s.heads = heads;

    const struct {
        const std::string& path;
        const char* role;
        std::size_t width;
        const char* width_name;
        const qkv::npy::array& width_from;
        numeric_input& into;
    } biases[] = {{files.bq, "bq", s.d_k, "d_k", wq, in.bq},
                  {files.bk, "bk", s.d_k, "d_k", wq, in.bk},
                  {files.bv, "bv", s.d_v, "d_v", wv, in.bv}};
    for (const auto& b : biases) {
        if (b.path.empty()) continue;
        const qkv::npy::array a = read(b.path);
        check_bias(a, b.role, b.width, b.width_name, b.width_from);
        b.into = numbers(a, b.role);
    }

    if (!files.wo.empty()) {
        const qkv::npy::array wo = read(files.wo);
        s.d_out = check_weight(wo, "wo", s.d_v, "d_v", wv, "d_out");
        in.wo = numbers(wo, "wo");
        if (!files.bo.empty()) {
            const qkv::npy::array bo = read(files.bo);
            check_bias(bo, "bo", s.d_out, "d_out", wo);
            in.bo = numbers(bo, "bo");
        }
    } else if (!files.bo.empty()) {
        throw usage_error("--bo " + files.bo + " needs --wo: bo is the bias of the output projection");
    }

    if (!files.mask.empty()) {
        const qkv::npy::array m = read(files.mask);
        check_mask(m, s, x);
        if (m.type == qkv::npy::dtype::b1) {
            try {
                in.mask = m.to_bool();
            } catch (const qkv::npy::error& e) {
                throw usage_error(e.what());
            }
        } else {
            in.additive_mask = numbers(m, "mask");
        }
    }
    return in;
}

bool attention_inputs::any_float64() const {
    for (const numeric_input* n : {&x, &wq, &wk, &wv, &bq, &bk, &bv, &wo, &bo, &additive_mask})
        if (n->float64) return true;
    return false;
}

void attention_inputs::to_float32() {
    for (numeric_input* n : {&x, &wq, &wk, &wv, &bq, &bk, &bv, &wo, &bo, &additive_mask}) narrow(*n);
}

void attention_inputs::to_float64() {
    for (numeric_input* n : {&x, &wq, &wk, &wv, &bq, &bk, &bv, &wo, &bo, &additive_mask}) widen(*n);
}

qkv::attention_problem attention_inputs::problem(const qkv::run_options& options) const {
    return {.shape = shape,
            .x = x.f32,
            .wq = wq.f32,
            .wk = wk.f32,
            .wv = wv.f32,
            .bq = bq.f32,
            .bk = bk.f32,
            .bv = bv.f32,
            .wo = wo.f32,
            .bo = bo.f32,
            .mask = mask,
            .additive_mask = additive_mask.f32,
            .options = options};
}

qkv::cpu::attention_problem_f64 attention_inputs::problem_f64(const qkv::run_options& options) const {
    return {.shape = shape,
            .x = x.f64,
            .wq = wq.f64,
            .wk = wk.f64,
            .wv = wv.f64,
            .bq = bq.f64,
            .bk = bk.f64,
            .bv = bv.f64,
            .wo = wo.f64,
            .bo = bo.f64,
            .mask = mask,
            .additive_mask = additive_mask.f64,
            .options = options};
}

}  // namespace qkv::cli
