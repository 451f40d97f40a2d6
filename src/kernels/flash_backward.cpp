#include "kernels/flash_backward.hpp"

#include <algorithm>
#include <string>

#include "contract/score.h"
#include "qkv/vulkan/error.hpp"

namespace qkv::vulkan::detail {
namespace {

constexpr std::uint32_t pack_workgroup = 64;
constexpr std::uint32_t small_workgroup = 64;

std::uint32_t ceil_div(std::uint64_t a, std::uint64_t b) { return static_cast<std::uint32_t>((a + b - 1) / b); }

}  // namespace

flash_bwd_views make_flash_bwd_views(const device& dev, VkBuffer texels, VkBuffer scratch, const flash_bwd_plan& p) {
    flash_bwd_views v;
    const std::uint64_t tb = p.texel_bytes();
    v.q = buffer_view(dev, texels, texel_format(p.half), p.q_at, p.q_texels * tb);
    v.k = buffer_view(dev, texels, texel_format(p.half), p.k_at, p.k_texels * tb);
    v.v = buffer_view(dev, texels, texel_format(p.half), p.v_at, p.v_texels * tb);
    v.d_out = buffer_view(dev, texels, texel_format(p.half), p.do_at, p.do_texels * tb);
    v.stats = buffer_view(dev, scratch, VK_FORMAT_R32G32B32A32_SFLOAT, p.stats_at, p.stats_texels * 16);
    if (p.paired())
        v.q_d_out = buffer_view(dev, texels, texel_format(p.half), p.q_at, p.do_at - p.q_at + p.do_texels * tb);
    return v;
}

namespace {

/// flash_cpu_pack.comp over the backward's four tensors.
void record_packs(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_bwd_plan& p,
                  const flash_bwd_io& io) {
    static_assert(
        contract::FLASH_PACK_BINDINGS == 3 &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack, "sss") &&
        row_matches<contract::flash_pack_push, contract::flash_pack_spec>(shader_id::flash_cpu_pack_f16, "sss"));
    const pipeline& pack = pipes.get(l.fp16 ? shader_id::flash_cpu_pack_f16 : shader_id::flash_cpu_pack,
                                     contract::flash_pack_spec{pack_workgroup, p.half ? 1u : 0u});
    const std::uint64_t tb = p.texel_bytes();
    struct tensor {
        binding src;
        std::uint32_t rows, npad, width, w4, off, heads;
        tensor_strides strides;
        std::uint64_t at, flags_at, flags_bytes;
        bool mark;
    };
    const std::uint32_t ev = l.dv;
    const tensor_strides d_out{l.heads * l.q_len * ev, l.q_len * ev, ev};
    const std::uint64_t q_flags = std::uint64_t{l.q_batches()} * 4, k_flags = std::uint64_t{l.kv_batches()} * 4;
    const tensor tensors[4] = {
        {io.qkv, l.q_len, p.npad_q, l.d, p.d4, 0, l.heads, l.q, p.q_at, p.q_flags_at, q_flags, true},
        {io.qkv, l.kv_len, p.npad_kv, l.d, p.d4, l.k_off, l.kv_heads, l.k, p.k_at, p.k_flags_at, k_flags, true},
        {io.qkv, l.kv_len, p.npad_kv, l.dv, p.dv4, l.v_off, l.kv_heads, l.v, p.v_at, p.k_flags_at, k_flags, false},
        {io.d_out, l.q_len, p.npad_q, l.dv, p.dv4, io.d_out_element, l.heads, d_out, p.do_at, p.q_flags_at, q_flags,
         true},
    };
    for (const tensor& t : tensors) {
        if (&t != tensors) exec.compute_barrier();  // disjoint regions of one buffer: keeps syncval exact
        contract::flash_pack_push pk{};
        pk.rows = t.rows, pk.npad = t.npad, pk.width = t.width, pk.w4 = t.w4;
        pk.bs = t.strides.bs, pk.hs = t.strides.hs, pk.rs = t.strides.rs, pk.off = t.off;
        pk.heads = t.heads;
        pk.at = static_cast<std::uint32_t>(t.at / tb);
        pk.mark_nonfinite = t.mark ? 1u : 0u;
        pk.stride = t.npad;
        const std::uint32_t groups[3] = {ceil_div(std::uint64_t{t.npad} * t.w4, pack_workgroup), 1, l.batch * t.heads};
        exec.dispatch(
            pack, {t.src, binding{io.texels, 0, p.texel_bytes_total}, binding{io.texels, t.flags_at, t.flags_bytes}},
            &pk, groups);
    }
}

void record_folds(recorder& exec, pipeline_set& pipes, const flash_bwd_plan& p, const bwd_fold& f, binding in,
                  binding out, binding verdict) {
    static_assert(contract::BWD_FOLD_BINDINGS == 3 &&
                  row_matches<contract::bwd_fold_push, contract::bwd_small_spec>(shader_id::flash_bwd_fold, "sss"));
    const pipeline& fold = pipes.get(shader_id::flash_bwd_fold, contract::bwd_small_spec{small_workgroup});
    contract::bwd_fold_push push{};
    push.b = f.dims[0], push.h = f.dims[1], push.l = f.dims[2], push.s = f.dims[3];
    push.mb = f.onto[0], push.mh = f.onto[1], push.ml = f.onto[2], push.ms = f.onto[3];
    push.outputs = f.outputs();
    const std::uint32_t groups[3] = {ceil_div(push.outputs, small_workgroup), 1, 1};
    const std::uint64_t terms = f.terms();
    for (std::uint64_t first = 0; first < terms; first += p.fold_chunk) {
        if (first > 0) exec.compute_barrier();
        push.first = static_cast<std::uint32_t>(first);
        push.stop = static_cast<std::uint32_t>(std::min<std::uint64_t>(terms, first + p.fold_chunk));
        push.resume = first > 0 ? 1u : 0u;
        exec.dispatch(fold, {in, out, verdict}, &push, groups);
    }
}

}  // namespace

void record_flash_backward(recorder& exec, pipeline_set& pipes, const flash_layout& l, const flash_bwd_plan& p,
                           const flash_bwd_io& io, const flash_bwd_views& views, bool inputs_finite,
                           bool mark_kernels) {
    // 1. The flags, the verdict (no flag, no row) and the dS scratch, set by transfers.
    exec.fill(io.texels, 0, p.flags_bytes, 0);
    exec.fill(io.verdict.buffer, io.verdict.offset, 4, 0);
    exec.fill(io.verdict.buffer, io.verdict.offset + 4, 4, contract::BWD_NO_ROW);
    if (p.ds_bytes) exec.fill(io.ds.buffer, io.ds.offset, p.ds_bytes, 0);
    exec.barrier(VK_PIPELINE_STAGE_TRANSFER_BIT, VK_ACCESS_TRANSFER_WRITE_BIT, VK_PIPELINE_STAGE_COMPUTE_SHADER_BIT,
                 VK_ACCESS_SHADER_READ_BIT | VK_ACCESS_SHADER_WRITE_BIT);

    // 2. Q, K, V and dO into texels, flagging non-finite rows; 3. the row statistics.
    record_packs(exec, pipes, l, p, io);
    exec.compute_barrier();
    static_assert(
        contract::BWD_PREP_BINDINGS == 7 &&
        row_matches<contract::bwd_prep_push, contract::bwd_small_spec>(shader_id::flash_bwd_prep, "sssssss") &&
        row_matches<contract::bwd_prep_push, contract::bwd_small_spec>(shader_id::flash_bwd_prep_f16, "sssssss"));
    const binding stats{io.scratch, p.stats_at, std::uint64_t{l.q_batches()} * p.npad_q * 16};
    const std::uint64_t rows = std::uint64_t{l.q_batches()} * l.q_len;
    const binding sink_terms = p.sinks.used ? binding{io.scratch, p.sink_terms_at, rows * 4} : stats;
    const binding sums = (p.extras & contract::BWD_CHECK) ? binding{io.scratch, p.sums_at, rows * 16} : stats;
    {
        const pipeline& prep = pipes.get(l.fp16 ? shader_id::flash_bwd_prep_f16 : shader_id::flash_bwd_prep,
                                         contract::bwd_small_spec{small_workgroup});
        contract::bwd_prep_push push{};
        push.q_len = l.q_len, push.npad_q = p.npad_q, push.dv = l.dv, push.heads = l.heads;
        push.rows = l.q_batches() * p.npad_q;
        push.do_off = io.d_out_element;
        push.features = l.features & (contract::SCORE_SINKS | contract::SCORE_ALIBI);
        push.kv_len = l.kv_len, push.causal_offset = l.causal_offset;
        const std::uint32_t groups[3] = {ceil_div(push.rows, small_workgroup), 1, 1};
        exec.dispatch(prep, {io.d_out, io.out, io.lse, io.params, stats, sink_terms, io.verdict}, &push, groups);
    }
    exec.compute_barrier();
    if (mark_kernels) exec.mark();  // the packs and the row statistics done

    // 4. dq, then dk and dv, or in the fused order dk and dv (storing dR), then dq from dR: one
    // dispatch pair (plain, careful) per chunk.
    static_assert(
        contract::BWD_DQ_BINDINGS == 13 && contract::BWD_DKDV_BINDINGS == 14 && contract::BWD_DQ_DR_BINDINGS == 8 &&
        row_matches<contract::bwd_push, contract::bwd_spec>(shader_id::flash_bwd_dq, "ttttssstsssss") &&
        row_matches<contract::bwd_push, contract::bwd_spec>(shader_id::flash_bwd_dq_shuffle, "ttttssstsssss") &&
        row_matches<contract::bwd_push, contract::bwd_spec>(shader_id::flash_bwd_dkdv, "ttttssstssssss") &&
        row_matches<contract::bwd_push, contract::bwd_spec>(shader_id::flash_bwd_dkdv_shuffle, "ttttssstssssss") &&
        row_matches<contract::bwd_push, contract::bwd_spec>(shader_id::flash_bwd_dq_dr_shuffle, "tstsssss") &&
        row_matches<contract::bwd_push, contract::coop_bwd_spec>(shader_id::flash_coop_bwd_dkdv, "ttttssstssss") &&
        row_matches<contract::bwd_push, contract::coop_bwd_spec>(shader_id::flash_coop_bwd_dq, "ttttssstsssss"));
    const std::uint32_t masks = l.mask_flags();
    const auto spec = [&](std::uint32_t own, std::uint32_t step, bool careful, std::uint32_t extras) {
        return contract::bwd_spec{p.wg, own, step, p.d4, p.dv4, masks, l.features, careful ? 1u : 0u, extras};
    };
    contract::bwd_push push{};
    push.q_len = l.q_len, push.kv_len = l.kv_len;
    push.npad_q = p.npad_q, push.npad_kv = p.npad_kv;
    push.d = l.d, push.dv = l.dv;
    push.heads = l.heads, push.group = l.group();
    push.causal_offset = l.causal_offset;
    push.a_bs = l.a_bs;
    push.m_bs = l.m_bs, push.m_hs = l.m_hs, push.m_rs = l.m_rs, push.m_cs = l.m_cs;
    push.scale = l.scale;
    const binding mask_bits = io.mask_bits.buffer ? io.mask_bits : stats;
    const binding additive = io.additive.buffer ? io.additive : stats;
    const binding k_flags{io.texels, p.k_flags_at, std::uint64_t{l.kv_batches()} * 4};
    const binding q_flags{io.texels, p.q_flags_at, std::uint64_t{l.q_batches()} * 4};
    const binding ds = p.ds_bytes ? io.ds : io.dq;
    const binding dr = p.fused ? binding{io.dr.buffer, io.dr.offset, p.dr_bytes} : stats;
    const binding dr_sums =
        p.fused && p.dr_sums_bytes ? binding{io.dr.buffer, io.dr.offset + p.dr_sums_at, p.dr_sums_bytes} : stats;
    const auto record_dq = [&] {
        const shader_id kernel = p.shuffle ? shader_id::flash_bwd_dq_shuffle : shader_id::flash_bwd_dq;
        const pipeline* plain = p.coop ? nullptr : &pipes.get(kernel, spec(p.rpi, p.kps, false, p.extras));
        const pipeline* careful = inputs_finite ? nullptr : &pipes.get(kernel, spec(p.rpi, p.kps, true, p.extras));
        const std::uint32_t blocks = ceil_div(l.q_len, p.dq_block());
        const std::uint32_t groups[3] = {blocks, 1, l.q_batches()};
        push.blocks = blocks;
        // The cooperative-matrix kernel runs the (batch, K/V head)s whose K is finite, in its own
        // row blocks; the scalar kernel's careful pipeline the others.
        const coop_bwd_tiles& t = p.coop_tiles;
        const std::uint32_t coop_groups[3] = {p.coop_row_blocks, 1, l.q_batches()};
        const pipeline* coop =
            p.coop ? &pipes.get(shader_id::flash_coop_bwd_dq,
                                contract::coop_bwd_spec{t.wg(), t.lanes, t.m, t.n, t.k, t.d_pad, t.dv_pad, t.dq_keys,
                                                        masks, l.features, p.extras & contract::BWD_CHECK},
                                t.required_subgroup)
                   : nullptr;
        const std::uint32_t keys = std::max(l.kv_len, 1u);
        for (std::uint32_t begin = 0; begin < keys; begin += p.dq_chunk) {
            contract::bwd_push part = push;
            part.begin = begin;
            part.stop = keys - begin < p.dq_chunk ? keys : begin + p.dq_chunk;
            part.flags = (begin > 0 ? contract::BWD_RESUME : 0u) | (part.stop < keys ? contract::BWD_PARTIAL : 0u);
            if (coop) {
                if (begin > 0) exec.compute_barrier();
                contract::bwd_push mine = part;
                mine.blocks = p.coop_row_blocks;
                exec.dispatch(*coop,
                              {texel(views.q.handle()), texel(views.k.handle()), texel(views.v.handle()),
                               texel(views.d_out.handle()), mask_bits, additive, io.params, texel(views.stats.handle()),
                               io.dq, ds, sums, k_flags, io.verdict},
                              &mine, coop_groups);
            }
            for (const pipeline* k : {plain, careful}) {
                if (!k) continue;
                if (begin > 0 || k == careful || coop) exec.compute_barrier();
                exec.dispatch(*k,
                              {texel(views.q.handle()), texel(views.k.handle()), texel(views.v.handle()),
                               texel(views.d_out.handle()), mask_bits, additive, io.params, texel(views.stats.handle()),
                               io.dq, ds, sums, k_flags, io.verdict},
                              &part, groups);
            }
        }
    };
    // dq from the stored dR (the fused order): one dispatch (plain, careful) per chunk of (batch,
    // query head)s, every key block.
    const auto record_dq_dr = [&](const flash_bwd_plan::head_chunk& chunk) {
        const std::uint32_t extras = p.extras & contract::BWD_CHECK;
        const pipeline& plain =
            pipes.get(shader_id::flash_bwd_dq_dr_shuffle, spec(p.rpi, p.dkdv_block(), false, extras));
        const pipeline* careful =
            inputs_finite ? nullptr
                          : &pipes.get(shader_id::flash_bwd_dq_dr_shuffle, spec(p.rpi, p.dkdv_block(), true, extras));
        const std::uint32_t blocks = ceil_div(l.q_len, p.dq_block());
        const std::uint32_t groups[3] = {blocks, 1, chunk.count};
        contract::bwd_push part = push;
        part.blocks = blocks;
        part.begin = 0, part.stop = l.kv_len;
        part.z_first = chunk.first, part.dr_first = chunk.first;
        for (const pipeline* k : {&plain, careful}) {
            if (!k) continue;
            if (k == careful) exec.compute_barrier();
            exec.dispatch(*k,
                          {texel(views.k.handle()), io.params, texel(views.stats.handle()), dr, dr_sums, io.dq, k_flags,
                           io.verdict},
                          &part, groups);
        }
    };
    // dk and dv of the (batch, K/V head)s from z_first on (z_count of them) over their row slots
    // [slot_begin, slot_end) (all of them but in the fused order's chunks of part of a group),
    // storing dR in the fused order for the (batch, query head)s from dr_first on.
    const auto record_dkdv = [&](std::uint32_t z_first, std::uint32_t z_count, std::uint32_t slot_begin,
                                 std::uint32_t slot_end, std::uint32_t dr_first) {
        const shader_id kernel = p.shuffle ? shader_id::flash_bwd_dkdv_shuffle : shader_id::flash_bwd_dkdv;
        const std::uint32_t extras = p.fused ? p.extras & (contract::BWD_STORE_DR | contract::BWD_CHECK) : 0u;
        const pipeline* plain = p.coop ? nullptr : &pipes.get(kernel, spec(p.kpi, p.rps, false, extras));
        const pipeline* careful = inputs_finite ? nullptr : &pipes.get(kernel, spec(p.kpi, p.rps, true, extras));
        const std::uint32_t blocks = p.key_blocks;
        const std::uint32_t groups[3] = {blocks, 1, z_count};
        push.blocks = blocks;
        push.z_first = z_first, push.dr_first = dr_first;
        // The cooperative-matrix kernel runs the (batch, K/V head)s whose Q and dO are finite, in
        // its own key blocks; the scalar kernel's careful pipeline the others.
        const pipeline* coop = nullptr;
        const coop_bwd_tiles& t = p.coop_tiles;
        const std::uint32_t coop_groups[3] = {p.coop_key_blocks, 1, l.kv_batches()};
        if (p.coop) {
            coop = &pipes.get(shader_id::flash_coop_bwd_dkdv,
                              contract::coop_bwd_spec{t.wg(), t.lanes, t.m, t.n, t.k, t.d_pad, t.dv_pad, t.dkdv_rows,
                                                      masks, l.features, 0u},
                              t.required_subgroup);
        }
        const std::uint32_t slots = l.group() * p.npad_q;
        push.pair_offset = static_cast<std::uint32_t>((p.do_at - p.q_at) / p.texel_bytes());
        const VkBufferView q_view = p.paired() ? views.q_d_out.handle() : views.q.handle();
        for (std::uint32_t begin = slot_begin; begin < slot_end; begin += p.dkdv_chunk) {
            contract::bwd_push part = push;
            part.begin = begin;
            part.stop = slot_end - begin < p.dkdv_chunk ? slot_end : begin + p.dkdv_chunk;
            part.flags = (begin > 0 ? contract::BWD_RESUME : 0u) | (part.stop < slots ? contract::BWD_PARTIAL : 0u);
            if (coop) {
                if (begin > slot_begin) exec.compute_barrier();
                contract::bwd_push mine = part;
                mine.blocks = p.coop_key_blocks;
                exec.dispatch(*coop,
                              {texel(views.q.handle()), texel(views.k.handle()), texel(views.v.handle()),
                               texel(views.d_out.handle()), mask_bits, additive, io.params, texel(views.stats.handle()),
                               io.dk, io.dv, q_flags, io.verdict},
                              &mine, coop_groups);
            }
            for (const pipeline* k : {plain, careful}) {
                if (!k) continue;
                if (begin > slot_begin || k == careful || coop) exec.compute_barrier();
                exec.dispatch(*k,
                              {texel(q_view), texel(views.k.handle()), texel(views.v.handle()),
                               texel(views.d_out.handle()), mask_bits, additive, io.params, texel(views.stats.handle()),
                               io.dk, io.dv, q_flags, io.verdict, dr, dr_sums},
                              &part, groups);
            }
        }
    };
    if (p.fused) {
        // Per chunk of (batch, head)s, dk and dv storing dR, then dq from it (marks: the first
        // chunk's dk and dv done, every dq done); the next chunk overwrites the scratch only after
        // the dq before it has read it.
        const std::uint32_t group = l.group();
        bool first = true;
        for (const flash_bwd_plan::head_chunk& c : p.fused_chunks(l)) {
            if (!first) exec.compute_barrier();
            const std::uint32_t u = c.first % group;  // a part of a group: its first head's slot
            if (c.count >= group)
                record_dkdv(c.first / group, c.count / group, 0, group * p.npad_q, c.first);
            else
                record_dkdv(c.first / group, 1, u * p.npad_q, (u + c.count) * p.npad_q, c.first);
            if (first && mark_kernels) exec.mark();
            exec.compute_barrier();
            record_dq_dr(c);
            first = false;
        }
    } else {
        // dq, then dk and dv (marks: dq done, dk and dv done)
        record_dq();
        if (mark_kernels) exec.mark();
        exec.compute_barrier();
        record_dkdv(0, l.kv_batches(), 0, l.group() * p.npad_q, 0);
    }
    if (mark_kernels) exec.mark();

    // 5. The sums over broadcast dimensions: the sinks' gradient, the mask's.
    if (p.sinks.used) {
        exec.compute_barrier();
        record_folds(exec, pipes, p, p.sinks, sink_terms, io.d_sinks, io.verdict);
    }
    if (p.mask.used) {
        exec.compute_barrier();
        record_folds(exec, pipes, p, p.mask, io.ds, io.d_mask, io.verdict);
    }
}

}  // namespace qkv::vulkan::detail
