// Reading and checking the inputs of `qkv attention` (see attention_inputs.hpp).
#include "attention_inputs.hpp"

#include <initializer_list>
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
        read_mask(m, in.mask, in.additive_mask);
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

namespace {

template <class Problem, class T>
Problem view(const attention_inputs& in, const qkv::run_options& options) {
    return {.shape = in.shape,
            .x = values<T>(in.x),
            .wq = values<T>(in.wq),
            .wk = values<T>(in.wk),
            .wv = values<T>(in.wv),
            .bq = values<T>(in.bq),
            .bk = values<T>(in.bk),
            .bv = values<T>(in.bv),
            .wo = values<T>(in.wo),
            .bo = values<T>(in.bo),
            .mask = in.mask,
            .additive_mask = values<T>(in.additive_mask),
            .options = options};
}

}  // namespace

qkv::attention_problem attention_inputs::problem(const qkv::run_options& options) const {
    return view<qkv::attention_problem, float>(*this, options);
}

qkv::cpu::attention_problem_f64 attention_inputs::problem_f64(const qkv::run_options& options) const {
    return view<qkv::cpu::attention_problem_f64, double>(*this, options);
}

}  // namespace qkv::cli
