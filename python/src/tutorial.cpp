// qkv.tutorial's C++ side: the worked example's 13 matrices as the compiler computed them when
// this extension was built (qkv/tutorial.hpp), proven here by static_assert against the tutorial's
// own numbers, and the walkthrough that `qkv example` prints (tools/qkv/example.hpp).
#include "tutorial.hpp"

#include <pybind11/stl.h>

#include <array>
#include <cstddef>
#include <sstream>
#include <string>

#include "example.hpp"
#include "qkv/runtime/error.hpp"
#include "qkv/tutorial.hpp"

namespace qkv::python {
namespace {

namespace py = pybind11;
using qkv::matrix_of;
using qkv::tutorial::plain;
using qkv::tutorial::scaled;

// ---- The proof: the tutorial's numbers, evaluated by the compiler -------------------------------
// Whole numbers exactly (keys, queries, values, scores); the tutorial's rounded weights and
// outputs within its rounding; the weighted values of each query sum to its output.
static_assert(plain.keys == matrix_of<float>({{0, 1, 1}, {4, 4, 0}, {2, 3, 1}}));
static_assert(plain.queries == matrix_of<float>({{1, 0, 2}, {2, 2, 2}, {2, 1, 3}}));
static_assert(plain.values == matrix_of<float>({{1, 2, 3}, {2, 8, 0}, {2, 6, 3}}));
static_assert(plain.scores == matrix_of<float>({{2, 4, 4}, {4, 16, 12}, {4, 12, 10}}));
static_assert(qkv::approx_equal(
    plain.weights,
    matrix_of<float>({{0.0634f, 0.4683f, 0.4683f}, {6.0e-6f, 0.9820f, 0.0180f}, {2.97e-4f, 0.8805f, 0.1192f}}), 1e-4f));
static_assert(qkv::approx_equal(
    plain.output,
    matrix_of<float>({{1.9366f, 6.6831f, 1.5951f}, {2.0000f, 7.9640f, 0.0540f}, {1.9997f, 7.7599f, 0.3584f}}), 1e-3f));
static_assert(scaled.keys == plain.keys && scaled.queries == plain.queries && scaled.values == plain.values);
static_assert(qkv::approx_equal(scaled.scores, plain.scores * 0.57735027f, 1e-5f));

constexpr std::array plain_weighted{qkv::weighted_values(plain, 0), qkv::weighted_values(plain, 1),
                                    qkv::weighted_values(plain, 2)};
constexpr std::array scaled_weighted{qkv::weighted_values(scaled, 0), qkv::weighted_values(scaled, 1),
                                     qkv::weighted_values(scaled, 2)};

/// Row j of the weighted values of query i is weights(i, j) · values row j, and their sum is output
/// row i.
template <class Result, class Weighted>
constexpr bool weighted_values_sum_to_output(const Result& r, const Weighted& w) {
    for (std::size_t i = 0; i < 3; ++i)
        for (std::size_t c = 0; c < 3; ++c) {
            float sum = 0;
            for (std::size_t j = 0; j < 3; ++j) {
                if (w[i](j, c) != r.weights(i, j) * r.values(j, c)) return false;
                sum += w[i](j, c);
            }
            const float diff = sum - r.output(i, c);
            if (diff > 1e-5f || diff < -1e-5f) return false;
        }
    return true;
}
static_assert(weighted_values_sum_to_output(plain, plain_weighted));
static_assert(weighted_values_sum_to_output(scaled, scaled_weighted));

template <class M>
py::tuple rows(const M& m) {
    py::tuple out(M::rows);
    for (std::size_t r = 0; r < M::rows; ++r) {
        py::tuple row(M::cols);
        for (std::size_t c = 0; c < M::cols; ++c) row[c] = static_cast<double>(m(r, c));
        out[r] = row;
    }
    return out;
}

template <class Result, class Weighted>
py::dict steps(const Result& r, const Weighted& w) {
    py::dict d;
    d["keys"] = rows(r.keys);
    d["queries"] = rows(r.queries);
    d["values"] = rows(r.values);
    d["scores"] = rows(r.scores);
    d["weights"] = rows(r.weights);
    d["weighted_values"] = py::make_tuple(rows(w[0]), rows(w[1]), rows(w[2]));
    d["output"] = rows(r.output);
    return d;
}

}  // namespace

void bind_tutorial(py::module_& m) {
    m.def("_tutorial", [] {
        py::dict d;
        d["inputs"] = rows(qkv::tutorial::inputs);
        d["w_key"] = rows(qkv::tutorial::w_key);
        d["w_query"] = rows(qkv::tutorial::w_query);
        d["w_value"] = rows(qkv::tutorial::w_value);
        d["plain"] = steps(plain, plain_weighted);
        d["scaled"] = steps(scaled, scaled_weighted);
        return d;
    });
    m.def(
        "_example",
        [](const std::string& backend, bool scale_scores) {
            if (backend != "vulkan" && backend != "cpu")
                throw qkv::invalid_argument("backend must be \"vulkan\" or \"cpu\" (it is \"" + backend + "\")");
            std::ostringstream text;
            qkv::cli::example_verdict verdict;
            {
                py::gil_scoped_release nogil;
                verdict = qkv::cli::print_example(
                    text, backend == "cpu" ? qkv::cli::backend::cpu : qkv::cli::backend::vulkan, scale_scores);
            }
            return py::make_tuple(text.str(), verdict.checks, verdict.disagreements);
        },
        py::arg("backend"), py::arg("scaled"));
}

}  // namespace qkv::python
