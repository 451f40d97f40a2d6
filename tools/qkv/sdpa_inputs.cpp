// Reading and checking the inputs of `qkv sdpa` (see sdpa_inputs.hpp).
#include "sdpa_inputs.hpp"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "errors.hpp"
#include "npy/npy.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::cli {
namespace {

std::string str(std::size_t n) { return std::to_string(n); }

/// "q.npy (2, 4, 37, 16)"
std::string named(const numeric_input& t) {
    std::string s = t.name + " (";
    for (std::size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + str(t.shape[i]);
    return s + (t.shape.size() == 1 ? ",)" : ")");
}

qkv::npy::array read(const std::string& path) {
    try {
        return qkv::npy::read(qkv::npy::path_from_utf8(path));
    } catch (const qkv::npy::error& e) {  // the message starts with the path
        throw usage_error(e.what());
    }
}

/// The shape with missing leading dimensions 1: (L, E) -> (1, 1, L, E).
std::vector<std::size_t> as4(const std::vector<std::size_t>& shape) {
    std::vector<std::size_t> out(4 - shape.size(), 1);
    out.insert(out.end(), shape.begin(), shape.end());
    return out;
}

/// q, k, v: the same rank, 2 to 4, no zero dimension; k and v agree; K/V heads divide query heads.
qkv::sdpa_shape check_qkv(const numeric_input& q, const numeric_input& k, const numeric_input& v) {
    const std::size_t rank = q.shape.size();
    if (rank < 2 || rank > 4) throw usage_error(named(q) + ": q must be (L, E), (H, L, E) or (B, H, L, E)");
    for (const numeric_input* t : {&k, &v})
        if (t->shape.size() != rank)
            throw usage_error(
                named(*t) + " and " + named(q) +
                ": q, k and v must have the same number of dimensions, (L, E), (H, L, E) or (B, H, L, E)");
    for (const numeric_input* t : {&q, &k, &v})
        for (std::size_t d : t->shape)
            if (d == 0) throw usage_error(named(*t) + ": every dimension must be at least 1");

    const std::vector<std::size_t> q4 = as4(q.shape), k4 = as4(k.shape), v4 = as4(v.shape);
    if (k4[0] != q4[0] || v4[0] != q4[0])
        throw usage_error(named(q) + ", " + named(k) + ", " + named(v) + ": the batch (first dimension) differs");
    if (v4[1] != k4[1])
        throw usage_error(named(k) + " and " + named(v) + ": k and v must have the same number of heads");
    if (q4[1] % k4[1] != 0)
        throw usage_error(named(q) + " and " + named(k) + ": the K/V heads (" + str(k4[1]) +
                          ") must divide the query heads (" + str(q4[1]) + ")");
    if (k4[3] != q4[3])
        throw usage_error(named(q) + " and " + named(k) + ": q and k must have the same width E (" + str(q4[3]) +
                          " and " + str(k4[3]) + ")");
    if (v4[2] != k4[2])
        throw usage_error(named(k) + " and " + named(v) + ": k and v must have the same length S (" + str(k4[2]) +
                          " and " + str(v4[2]) + ")");
    return {.batch = q4[0],
            .q_heads = q4[1],
            .kv_heads = k4[1],
            .q_len = q4[2],
            .kv_len = k4[2],
            .d_qk = q4[3],
            .d_v = v4[3]};
}

}  // namespace

sdpa_inputs load_sdpa_inputs(const sdpa_files& files) {
    sdpa_inputs in;
    in.q = numbers(read(files.q), "q");
    in.k = numbers(read(files.k), "k");
    in.v = numbers(read(files.v), "v");
    in.shape = check_qkv(in.q, in.k, in.v);

    if (!files.mask.empty()) {
        const qkv::npy::array m = read(files.mask);
        // A 0-d mask is one value for every score (the library reads an empty shape as L x S).
        in.mask_shape = m.shape.empty() ? std::vector<std::size_t>{1} : m.shape;
        try {
            (void)qkv::broadcast_strides(in.mask_shape, in.shape);
        } catch (const qkv::invalid_argument& e) {
            throw usage_error(m.name + ": " + e.what() + " (" + named(in.q) + ", " + named(in.k) + ")");
        }
        read_mask(m, in.mask, in.additive_mask);
    }
    if (!files.sinks.empty()) {
        in.sinks = numbers(read(files.sinks), "sinks");
        if (in.sinks.shape != std::vector<std::size_t>{in.shape.q_heads})
            throw usage_error("--sinks " + named(in.sinks) + ": the sinks must be one logit per query head, (Hq,) = (" +
                              str(in.shape.q_heads) + ",) for " + named(in.q));
    }
    return in;
}

bool sdpa_inputs::any_float64() const {
    return q.float64 || k.float64 || v.float64 || additive_mask.float64 || sinks.float64;
}

void sdpa_inputs::to_float32() {
    for (numeric_input* t : {&q, &k, &v, &additive_mask, &sinks}) narrow(*t);
}

void sdpa_inputs::to_float64() {
    for (numeric_input* t : {&q, &k, &v, &additive_mask, &sinks}) widen(*t);
}

namespace {

template <class T>
qkv::basic_sdpa_problem<T> view(const sdpa_inputs& in, const qkv::sdpa_options& options) {
    return {.shape = in.shape,
            .q = values<T>(in.q),
            .k = values<T>(in.k),
            .v = values<T>(in.v),
            .mask = in.mask,
            .additive_mask = values<T>(in.additive_mask),
            .mask_shape = in.mask_shape,
            .options = options,
            .sinks = values<T>(in.sinks)};
}

}  // namespace

qkv::sdpa_problem sdpa_inputs::problem(const qkv::sdpa_options& options) const { return view<float>(*this, options); }

qkv::sdpa_problem_f64 sdpa_inputs::problem_f64(const qkv::sdpa_options& options) const {
    return view<double>(*this, options);
}

std::vector<std::size_t> sdpa_inputs::out_shape() const {
    std::vector<std::size_t> s(q.shape.begin(), q.shape.end() - 1);
    s.push_back(shape.d_v);
    return s;
}

std::vector<std::size_t> sdpa_inputs::weights_shape() const {
    std::vector<std::size_t> s(q.shape.begin(), q.shape.end() - 1);
    s.push_back(shape.kv_len);
    return s;
}

}  // namespace qkv::cli

namespace qkv::cli {

std::vector<std::size_t> sdpa_inputs::lse_shape() const { return {q.shape.begin(), q.shape.end() - 1}; }

}  // namespace qkv::cli

namespace qkv::cli {

bool is_offsets_file(const std::string& value) { return value.ends_with(".npy"); }

namespace {

/// An offsets flag's values: the int32 .npy file it names, or its comma list.
std::vector<std::int64_t> offsets_of(const std::string& value, const char* flag) {
    std::vector<std::int64_t> out;
    if (is_offsets_file(value)) {
        const qkv::npy::array a = read(value);
        if (a.type != qkv::npy::dtype::i4 || a.shape.size() != 1)
            throw usage_error(std::string(flag) + " " + a.name + " is " + std::string(qkv::npy::dtype_name(a.type)) +
                              " " + a.shape_string() + ": the offsets are int32 (B + 1,)");
        for (const std::int32_t i : a.to_int32()) out.push_back(i);
        return out;
    }
    std::size_t start = 0;
    while (start <= value.size()) {
        const std::size_t end = std::min(value.find(',', start), value.size());
        const std::string item = value.substr(start, end - start);
        std::int64_t n = 0;
        const auto [rest, err] = std::from_chars(item.data(), item.data() + item.size(), n);
        if (item.empty() || err != std::errc() || rest != item.data() + item.size())
            throw usage_error(std::string(flag) + " " + value + ": \"" + item +
                              "\" is not an integer (the offsets are a comma list, 0,L1,L1+L2,..., or an int32 "
                              ".npy file)");
        out.push_back(n);
        start = end + 1;
    }
    return out;
}

}  // namespace

varlen_inputs load_varlen_inputs(const sdpa_files& files, const std::string& cu_q_text, const std::string& cu_k_text) {
    const std::vector<std::int64_t> cu_q = offsets_of(cu_q_text, "--cu-seqlens-q"),
                                    cu_k = offsets_of(cu_k_text, "--cu-seqlens-k");
    varlen_inputs in;
    in.q = numbers(read(files.q), "q");
    in.k = numbers(read(files.k), "k");
    in.v = numbers(read(files.v), "v");
    for (const numeric_input* t : {&in.q, &in.k, &in.v})
        if (t->shape.size() != 3)
            throw usage_error(named(*t) +
                              ": a ragged batch's q, k and v are (total_q, Hq, E), (total_k, Hkv, E) and "
                              "(total_k, Hkv, Ev)");
    if (in.k.shape[0] != in.v.shape[0] || in.k.shape[1] != in.v.shape[1])
        throw usage_error(named(in.k) + " and " + named(in.v) + ": k and v must have the same rows and heads");
    const auto offsets = [](const std::vector<std::int64_t>& given, const char* flag, std::vector<std::int32_t>& to,
                            std::size_t& longest) {
        for (std::size_t b = 0; b < given.size(); ++b) {
            if (given[b] < 0 || given[b] > std::numeric_limits<std::int32_t>::max())
                throw usage_error(std::string(flag) + ": offset " + std::to_string(b) + " is " +
                                  std::to_string(given[b]) + ", outside [0, 2^31)");
            to.push_back(static_cast<std::int32_t>(given[b]));
            if (b > 0 && given[b] > given[b - 1])
                longest = std::max(longest, static_cast<std::size_t>(given[b] - given[b - 1]));
        }
    };
    offsets(cu_q, "--cu-seqlens-q", in.cu_q, in.max_q);
    offsets(cu_k, "--cu-seqlens-k", in.cu_k, in.max_k);
    if (!files.sinks.empty()) {
        in.sinks = numbers(read(files.sinks), "sinks");
        if (in.sinks.shape != std::vector<std::size_t>{in.q.shape[1]})
            throw usage_error("--sinks " + named(in.sinks) + ": the sinks must be one logit per query head, (Hq,) = (" +
                              str(in.q.shape[1]) + ",) for " + named(in.q));
    }
    return in;
}

bool varlen_inputs::any_float64() const { return q.float64 || k.float64 || v.float64 || sinks.float64; }
void varlen_inputs::to_float32() {
    for (numeric_input* t : {&q, &k, &v, &sinks}) narrow(*t);
}
void varlen_inputs::to_float64() {
    for (numeric_input* t : {&q, &k, &v, &sinks}) widen(*t);
}

namespace {

template <class T>
qkv::basic_varlen_problem<T> view(const varlen_inputs& in, const qkv::sdpa_options& options) {
    return {.q_heads = in.q.shape[1],
            .kv_heads = in.k.shape[1],
            .d_qk = in.q.shape[2],
            .d_v = in.v.shape[2],
            .cu_seqlens_q = in.cu_q,
            .cu_seqlens_k = in.cu_k,
            .max_seqlen_q = in.max_q,
            .max_seqlen_k = in.max_k,
            .q = values<T>(in.q),
            .k = values<T>(in.k),
            .v = values<T>(in.v),
            .options = options,
            .sinks = values<T>(in.sinks)};
}

}  // namespace

qkv::varlen_problem varlen_inputs::problem(const qkv::sdpa_options& options) const {
    return view<float>(*this, options);
}
qkv::varlen_problem_f64 varlen_inputs::problem_f64(const qkv::sdpa_options& options) const {
    return view<double>(*this, options);
}
std::vector<std::size_t> varlen_inputs::out_shape() const { return {q.shape[0], q.shape[1], v.shape[2]}; }
std::vector<std::size_t> varlen_inputs::lse_shape() const { return {q.shape[1], q.shape[0]}; }

}  // namespace qkv::cli
