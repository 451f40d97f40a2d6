#include "kernels/stages.hpp"

#include <algorithm>
#include <cstring>
#include <string>

#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

/// Every matrix-product row (project*, scores*, aggregate*) pushes gemm_push and is specialised by
/// gemm_texel_spec (its texel variants) or gemm_spec (the others), as record_gemm does.
constexpr bool gemm_rows_match() {
    for (std::size_t i = 0; i < std::size(shader_table); ++i) {
        const auto id = static_cast<shader_id>(i);
        const std::string_view name = shader_table[i].name;
        if (!name.starts_with("project") && !name.starts_with("scores") && !name.starts_with("aggregate")) continue;
        const std::uint32_t spec =
            texel_gemm(id) ? spec_bytes<contract::gemm_texel_spec>() : spec_bytes<contract::gemm_spec>();
        if (describe(id).push_bytes != sizeof(gemm_push) || describe(id).spec_bytes != spec) return false;
    }
    return true;
}
static_assert(gemm_rows_match(), "shader_table.def: a matrix-product row that record_gemm does not push or specialise");

}  // namespace

void record_gemm(recorder& exec, pipeline_set& pipes, const gemm_step& step, std::initializer_list<binding> bindings,
                 const gemm_push& push, std::uint32_t batches) {
    const bool texels = texel_gemm(step.shader);
    const contract::gemm_spec spec = step.tiles.spec();
    // contract/gemm.h: the texel variants take the dispatch's bounds, layout and store flags as constants.
    contract::gemm_texel_spec texel_spec{};
    std::memcpy(&texel_spec, &spec, sizeof spec);  // the plain constants come first, in the same order
    texel_spec.exact = push.M % step.tiles.bm == 0 && push.N % step.tiles.bn == 0 ? 1 : 0;
    texel_spec.skip_zero = step.skip_zero ? 1 : 0;
    texel_spec.vec_store = step.vec_store ? 1 : 0;
    const std::uint32_t groups[3] = {ceil_div(push.M, step.tiles.bm), ceil_div(push.N, step.tiles.bn), batches};
    const std::uint32_t chunk = step.chunk_k;
    // A K of 0 (no inner dimension) is one dispatch that stores zeros (plus bias, scale, masks).
    for (std::uint32_t begin = 0; begin < std::max(push.K, 1u); begin += chunk) {
        gemm_push part = push;
        part.k_begin = begin;
        part.K = std::min(push.K - std::min(push.K, begin), chunk);
        part.a_off = push.a_off + begin;              // A's columns are contiguous
        part.b_off = push.b_off + begin * push.b_rs;  // B's rows are b_rs apart
        if (begin > 0) part.flags |= flag_gemm_accumulate;
        if (std::uint64_t{begin} + chunk < push.K) part.flags |= flag_gemm_partial;
        if (begin > 0) exec.compute_barrier();
        texel_spec.store = part.flags;
        exec.dispatch(texels ? pipes.get(step.shader, texel_spec) : pipes.get(step.shader, spec), bindings, &part,
                      groups);
    }
}

void record_softmax(recorder& exec, pipeline_set& pipes, shader_id shader, std::uint32_t workgroup, binding scores,
                    binding texels, std::uint32_t rows, std::uint32_t cols) {
    softmax_push push{};
    push.cols = cols;
    push.rows = rows;
    if (shader == shader_id::softmax_cpu_tx) {
        static_assert(row_matches<softmax_push, contract::softmax_cpu_spec>(shader_id::softmax_cpu_tx, "st"));
        contract::softmax_cpu_spec spec{};
        spec.workgroup = workgroup;
        spec.exact = rows % workgroup == 0 ? 1 : 0;
        const std::uint32_t groups[3] = {ceil_div(rows, workgroup), 1, 1};
        exec.dispatch(pipes.get(shader, spec), {scores, texels}, &push, groups);
        return;
    }
    static_assert(row_matches<softmax_push, contract::softmax_spec>(shader_id::softmax, "s") &&
                  row_matches<softmax_push, contract::softmax_spec>(shader_id::softmax_subgroup, "s"));
    contract::softmax_spec spec{};
    spec.workgroup = workgroup;
    const std::uint32_t groups[3] = {rows, 1, 1};
    exec.dispatch(pipes.get(shader, spec), {scores}, &push, groups);
}

}  // namespace qkv::vulkan::detail
