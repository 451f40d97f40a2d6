// Context-parallel sdpa: the ring and the all-gather (qkv/mpi/sdpa.hpp).
#include "qkv/mpi/sdpa.hpp"

#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "mpi/blocks.hpp"
#include "mpi/channel.hpp"
#include "qkv/mpi/error.hpp"
#include "qkv/runtime/capabilities.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {
namespace {

using detail::channel;
using detail::merged_rows;
using detail::shared_bytes;
using detail::whole;

constexpr int tag_kv = 16;  // + the block's rank: each block crosses each link at most once
constexpr int tag_q = 3, tag_partial = 4;

/// Everything a rank knows before communicating: the whole problem, every rank's slices, its
/// own query rows (one contiguous buffer per range) and the stored form of its K and V.
struct plan {
    whole w;
    std::vector<sequence_slice> q_slices, k_slices;
    std::vector<std::vector<float>> my_q;  // per range of my query slice: (B, Hq, n, E)
    shared_bytes my_kv;                    // stored form of my K/V slice
    /// Whether rank r's queries see block b (rank b's keys): sees[b][r].
    std::vector<std::vector<char>> sees;
};

std::string size_text(std::size_t n) { return std::to_string(n); }

void expect_size(const char* name, std::size_t got, std::size_t want, const char* shape) {
    if (got != want)
        throw qkv::invalid_argument(std::string("qkv::mpi::sdpa: ") + name + " holds " + size_text(got) +
                                    " elements, expected " + shape + " = " + size_text(want) +
                                    " for this rank's slice");
}

plan make_plan(const cp_problem& p, const cp_options& o, backend& compute, int ranks, int me) {
    if (o.mode != cp_mode::ring && o.mode != cp_mode::allgather)
        throw qkv::invalid_argument("qkv::mpi::sdpa: unknown mode");
    if (o.slicing != layout::contiguous && o.slicing != layout::zigzag)
        throw qkv::invalid_argument("qkv::mpi::sdpa: unknown layout");
    // Everything qkv::validate checks but the q, k and v spans, on the whole problem.
    sdpa_problem description{.shape = p.shape,
                             .mask = p.mask,
                             .additive_mask = p.additive_mask,
                             .mask_shape = p.mask_shape,
                             .options = p.options,
                             .sinks = p.sinks};
    validate_description(description);
    require_supported(entry_point::mpi_sdpa, description);
    plan pl;
    pl.w = whole{.shape = p.shape,
                 .options = p.options,
                 .mask = p.mask,
                 .additive = p.additive_mask,
                 .sinks = p.sinks,
                 .wire = compute.kv_storage(p.options)};
    detail::complete(pl.w, p.mask_shape);
    for (int r = 0; r < ranks; ++r) {
        pl.q_slices.push_back(slice_of(p.shape.q_len, ranks, r, o.slicing));
        pl.k_slices.push_back(slice_of(p.shape.kv_len, ranks, r, o.slicing));
    }
    const sdpa_shape& s = p.shape;
    const sequence_slice& qs = pl.q_slices[static_cast<std::size_t>(me)];
    const sequence_slice& ks = pl.k_slices[static_cast<std::size_t>(me)];
    expect_size("q", p.q.size(), s.batch * s.q_heads * qs.rows() * s.d_qk, "B * Hq * rows * E");
    expect_size("k", p.k.size(), s.batch * s.kv_heads * ks.rows() * s.d_qk, "B * Hkv * rows * E");
    expect_size("v", p.v.size(), s.batch * s.kv_heads * ks.rows() * s.d_v, "B * Hkv * rows * Ev");
    for (std::size_t r = 0; r < qs.ranges.size(); ++r)
        pl.my_q.push_back(detail::range_rows(p.q, s.batch * s.q_heads, s.d_qk, qs, r));
    pl.my_kv = detail::encode_kv(pl.w, p.k, p.v, ks);  // quantized once, here (refusals are bad input)
    pl.sees.assign(static_cast<std::size_t>(ranks), std::vector<char>(static_cast<std::size_t>(ranks), 0));
    for (int b = 0; b < ranks; ++b)
        for (int r = 0; r < ranks; ++r)
            pl.sees[static_cast<std::size_t>(b)][static_cast<std::size_t>(r)] =
                detail::visible(pl.w, pl.q_slices[static_cast<std::size_t>(r)],
                                pl.k_slices[static_cast<std::size_t>(b)])
                    ? 1
                    : 0;
    return pl;
}

bool sees(const plan& pl, int block, int rank) {
    return pl.sees[static_cast<std::size_t>(block)][static_cast<std::size_t>(rank)] != 0;
}

/// The partials of every query range of `q_rows` (ranges of `queries`) against the key ranges of
/// `kv`, each merged (in range order) into `into` (one per query range). Counts the blocks.
void compute_block(backend& compute, const whole& w, const sequence_slice& queries,
                   const std::vector<std::vector<float>>& q_rows, const std::vector<detail::kv_values>& kv,
                   std::vector<merged_rows>& into, cp_stats& stats) {
    for (std::size_t i = 0; i < queries.ranges.size(); ++i)
        for (const detail::kv_values& block : kv) {
            if (!detail::visible(w, queries.ranges[i], block.rows)) continue;
            const detail::block_problem b(w, queries.ranges[i], q_rows[i], block.rows, block.k, block.v);
            into[i].merge(compute.partial(b.problem()));
            ++stats.blocks_computed;
        }
}

std::vector<merged_rows> empty_rows(const whole& w, const sequence_slice& queries) {
    std::vector<merged_rows> rows;
    for (const row_range& r : queries.ranges) rows.emplace_back(w, r.size());
    return rows;
}

void finish(const plan& pl, const std::vector<merged_rows>& rows, const sequence_slice& mine, cp_output& out) {
    const sdpa_shape& s = pl.w.shape;
    out.output.assign(s.batch * s.q_heads * mine.rows() * s.d_v, 0.0f);
    if (pl.w.options.return_lse) out.lse.assign(s.batch * s.q_heads * mine.rows(), 0.0f);
    std::size_t at = 0;
    for (const merged_rows& r : rows) {
        r.finish(mine.rows(), at, out.output, out.lse);
        at += r.rows();
    }
}

std::size_t skipped_blocks(const plan& pl, int me) {
    std::size_t n = 0;
    for (const sequence_slice& ks : pl.k_slices)
        for (const row_range& q : pl.q_slices[static_cast<std::size_t>(me)].ranges)
            for (const row_range& k : ks.ranges)
                if (!detail::visible(pl.w, q, k)) ++n;
    return n;
}

// ---- ring --------------------------------------------------------------------------------------
// At step t, rank r holds the block of rank (r - t) mod R. It sends that block on to r + 1 when a
// rank further along the ring (before the block's owner) still needs it, and receives the next
// from r - 1 on the same rule, while a worker thread computes with the block it holds.

/// Whether some rank after `from` on the ring, before block b's owner, needs block b.
bool forwarded(const plan& pl, int b, int from, int ranks) {
    for (int y = (from + 1) % ranks; y != b; y = (y + 1) % ranks)
        if (sees(pl, b, y)) return true;
    return false;
}

void run_ring(channel& ch, backend& compute, const plan& pl, cp_output& out) {
    const int R = ch.size(), me = ch.rank();
    const int next = (me + 1) % R, prev = (me + R - 1) % R;
    const sequence_slice& mine = pl.q_slices[static_cast<std::size_t>(me)];
    std::vector<merged_rows> rows = empty_rows(pl.w, mine);
    shared_bytes current = pl.my_kv;
    for (int t = 0; t < R; ++t) {
        const int block = (me - t + R) % R, incoming = (me - t - 1 + 2 * R) % R;
        std::vector<std::size_t> transfers;
        shared_bytes received;
        if (t < R - 1 && forwarded(pl, incoming, prev, R)) {
            received = std::make_shared<detail::bytes>(
                detail::kv_bytes(pl.w, pl.k_slices[static_cast<std::size_t>(incoming)]));
            transfers.push_back(
                ch.post_recv(received, prev, tag_kv + incoming, "the K/V block of rank " + std::to_string(incoming)));
        }
        if (current && t < R - 1 && forwarded(pl, block, me, R))
            transfers.push_back(
                ch.post_send(current, next, tag_kv + block, "the K/V block of rank " + std::to_string(block)));
        std::function<void()> work;
        if (current && sees(pl, block, me))
            work = [&, block, stored = current] {
                const std::vector<detail::kv_values> kv =
                    detail::decode_kv(pl.w, *stored, pl.k_slices[static_cast<std::size_t>(block)]);
                compute_block(compute, pl.w, mine, pl.my_q, kv, rows, out.stats);
            };
        if (!transfers.empty() || work) {
            ch.wait(transfers, work);
            ++out.stats.steps;
        }
        current = received;
    }
    finish(pl, rows, mine, out);
}

// ---- all-gather ----------------------------------------------------------------------------------
// Each rank's queries go to the ranks whose keys they see; each of those computes their partial
// against its own keys (merged over its key ranges) and sends it back; the owner merges the
// partials in rank order.

std::size_t partial_doubles(const whole& w, const sequence_slice& queries) {
    return w.shape.batch * w.shape.q_heads * queries.rows() * (w.shape.d_v + 1);
}

/// The partials of one rank's queries against this rank's keys, as bytes: for each query range,
/// out (B, Hq, n, Ev) then lse (B, Hq, n), float64.
shared_bytes serialise(const std::vector<merged_rows>& rows) {
    auto data = std::make_shared<detail::bytes>();
    for (const merged_rows& r : rows) {
        const shared_bytes part = detail::to_bytes(r.out(), r.lse());
        data->insert(data->end(), part->begin(), part->end());
    }
    return data;
}

void merge_serialised(const whole& w, const detail::bytes& data, std::vector<merged_rows>& into) {
    std::size_t at = 0;
    for (merged_rows& r : into) {
        std::vector<double> o(w.shape.batch * w.shape.q_heads * r.rows() * w.shape.d_v);
        std::vector<double> l(w.shape.batch * w.shape.q_heads * r.rows());
        detail::from_bytes(data, at, std::span<double>(o));
        at += o.size() * sizeof(double);
        detail::from_bytes(data, at, std::span<double>(l));
        at += l.size() * sizeof(double);
        r.merge(o, l);
    }
}

void run_allgather(channel& ch, backend& compute, const plan& pl, cp_output& out) {
    const int R = ch.size(), me = ch.rank();
    const whole& w = pl.w;
    const sdpa_shape& s = w.shape;
    const auto slice = [&](const std::vector<sequence_slice>& v, int r) -> const sequence_slice& {
        return v[static_cast<std::size_t>(r)];
    };
    // My queries, as bytes, to every rank whose keys they see; theirs from every rank that sees mine.
    std::vector<float> my_q_flat;
    for (const std::vector<float>& q : pl.my_q) my_q_flat.insert(my_q_flat.end(), q.begin(), q.end());
    const shared_bytes my_q_bytes = detail::to_bytes(std::span<const float>(my_q_flat));
    std::vector<std::size_t> sends, q_from(static_cast<std::size_t>(R), SIZE_MAX),
        partial_from(static_cast<std::size_t>(R), SIZE_MAX);
    std::vector<shared_bytes> their_q(static_cast<std::size_t>(R)), partials(static_cast<std::size_t>(R));
    for (int p = 0; p < R; ++p) {
        if (p == me) continue;
        if (sees(pl, me, p)) {  // p's queries see my keys
            their_q[static_cast<std::size_t>(p)] = std::make_shared<detail::bytes>(
                s.batch * s.q_heads * slice(pl.q_slices, p).rows() * s.d_qk * sizeof(float));
            q_from[static_cast<std::size_t>(p)] = ch.post_recv(their_q[static_cast<std::size_t>(p)], p, tag_q,
                                                               "the queries of rank " + std::to_string(p));
        }
        if (sees(pl, p, me)) {  // my queries see p's keys
            sends.push_back(ch.post_send(my_q_bytes, p, tag_q, "this rank's queries"));
            partials[static_cast<std::size_t>(p)] =
                std::make_shared<detail::bytes>(partial_doubles(w, slice(pl.q_slices, me)) * sizeof(double));
            partial_from[static_cast<std::size_t>(p)] =
                ch.post_recv(partials[static_cast<std::size_t>(p)], p, tag_partial,
                             "the partial results of rank " + std::to_string(p));
        }
    }
    const std::vector<detail::kv_values> my_kv = detail::decode_kv(w, *pl.my_kv, slice(pl.k_slices, me));
    // The queries of each rank that sees my keys, mine first, then in ring order.
    std::vector<merged_rows> mine_here;
    for (int k = 0; k < R; ++k) {
        const int p = (me + k) % R;
        if (!sees(pl, me, p)) continue;
        std::vector<std::size_t> wait_for;
        if (p != me) wait_for.push_back(q_from[static_cast<std::size_t>(p)]);
        ch.wait(wait_for);  // nothing to compute meanwhile: exposed
        const sequence_slice& queries = slice(pl.q_slices, p);
        std::vector<std::vector<float>> q_rows;
        if (p == me) {
            q_rows = pl.my_q;
        } else {
            std::size_t at = 0;
            for (const row_range& r : queries.ranges) {
                std::vector<float> q(s.batch * s.q_heads * r.size() * s.d_qk);
                detail::from_bytes(*their_q[static_cast<std::size_t>(p)], at, std::span<float>(q));
                at += q.size() * sizeof(float);
                q_rows.push_back(std::move(q));
            }
        }
        std::vector<merged_rows> rows = empty_rows(w, queries);
        ch.wait({}, [&] { compute_block(compute, w, queries, q_rows, my_kv, rows, out.stats); });
        ++out.stats.steps;
        if (p == me)
            mine_here = std::move(rows);
        else
            sends.push_back(ch.post_send(serialise(rows), p, tag_partial, "its partial results"));
    }
    // Every partial of my queries, merged in rank order.
    std::vector<std::size_t> last;
    for (int p = 0; p < R; ++p)
        if (partial_from[static_cast<std::size_t>(p)] != SIZE_MAX)
            last.push_back(partial_from[static_cast<std::size_t>(p)]);
    last.insert(last.end(), sends.begin(), sends.end());
    ch.wait(last);
    const sequence_slice& mine = slice(pl.q_slices, me);
    std::vector<merged_rows> rows = empty_rows(w, mine);
    for (int p = 0; p < R; ++p) {
        if (p == me) {
            if (sees(pl, me, me))
                for (std::size_t i = 0; i < rows.size(); ++i) rows[i].merge(mine_here[i].out(), mine_here[i].lse());
        } else if (partials[static_cast<std::size_t>(p)]) {
            merge_serialised(w, *partials[static_cast<std::size_t>(p)], rows);
        }
    }
    finish(pl, rows, mine, out);
}

}  // namespace

std::string to_string(cp_mode mode) {
    switch (mode) {
        case cp_mode::ring:
            return "ring";
        case cp_mode::allgather:
            return "allgather";
    }
    return "unknown";
}

std::uint64_t checksum(std::span<const float> values, std::uint64_t seed) {
    std::uint64_t h = seed != 0 ? seed : 1469598103934665603ull;
    const auto* p = reinterpret_cast<const unsigned char*>(values.data());
    const std::size_t n = values.size_bytes();
    std::size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        std::uint64_t word = 0;
        std::memcpy(&word, p + i, 8);
        h = (h ^ word) * 1099511628211ull;
    }
    for (; i < n; ++i) h = (h ^ p[i]) * 1099511628211ull;
    h = (h ^ n) * 1099511628211ull;  // the length too: [] and [0.0f] differ
    return h != 0 ? h : 1;
}

cp_output sdpa(MPI_Comm comm, backend& compute, const cp_problem& problem, const cp_options& options) {
    const auto start = detail::clock::now();
    channel ch(comm, options.comm, "qkv::mpi::sdpa (" + to_string(options.mode) + ")");
    cp_output out;
    out.stats.rank = ch.rank();
    out.stats.ranks = ch.size();
    detail::fingerprint fp;
    fp.add_value(options.mode);
    fp.add_value(options.slicing);
    detail::add_problem(fp, problem.shape, problem.options, problem.mask_shape, problem.mask, problem.additive_mask,
                        problem.sinks);
    fp.add_value(problem.inputs_checksum);  // the whole inputs, where the caller holds them
    std::exception_ptr failure;
    plan pl;
    try {
        out.device = compute.name();
        pl = make_plan(problem, options, compute, ch.size(), ch.rank());
        fp.add_value(pl.w.wire);  // every rank's backend must store K and V alike
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "checking the inputs");
    try {
        if (options.mode == cp_mode::ring)
            run_ring(ch, compute, pl, out);
        else
            run_allgather(ch, compute, pl, out);
        out.stats.blocks_skipped = skipped_blocks(pl, ch.rank());
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "computing");
    out.stats.agreement_ms = ch.agreement_ms();
    out.stats.compute_ms = ch.compute_ms();
    out.stats.comm_ms = ch.comm_ms();
    out.stats.exposed_ms = ch.exposed_ms();
    out.stats.bytes_sent = ch.bytes_sent();
    out.stats.bytes_received = ch.bytes_received();
    out.stats.total_ms = detail::ms_between(start, detail::clock::now());
    return out;
}

static_assert(std::is_trivially_copyable_v<cp_stats>, "cp_stats travels as bytes");

std::vector<cp_stats> gather_stats(MPI_Comm comm, const cp_stats& mine, int root, const comm_options& options) {
    channel ch(comm, options, "qkv::mpi::gather_stats");
    std::exception_ptr failure;
    if (root < 0 || root >= ch.size())
        failure = std::make_exception_ptr(
            qkv::invalid_argument("gather_stats: root " + std::to_string(root) + " is not a rank of the communicator"));
    detail::fingerprint fp;
    fp.add_value(root);
    ch.agree(failure, fp.value(), "checking the root");
    std::vector<cp_stats> all;
    try {
        std::vector<std::size_t> transfers;
        std::vector<shared_bytes> parts(static_cast<std::size_t>(ch.size()));
        if (ch.rank() == root) {
            for (int p = 0; p < ch.size(); ++p) {
                if (p == root) continue;
                parts[static_cast<std::size_t>(p)] = std::make_shared<detail::bytes>(sizeof(cp_stats));
                transfers.push_back(ch.post_recv(parts[static_cast<std::size_t>(p)], p, 5, "its statistics"));
            }
        } else {
            auto data = std::make_shared<detail::bytes>(sizeof(cp_stats));
            std::memcpy(data->data(), &mine, sizeof mine);
            transfers.push_back(ch.post_send(std::move(data), root, 5, "its statistics"));
        }
        ch.wait(transfers);
        if (ch.rank() == root)
            for (int p = 0; p < ch.size(); ++p) {
                cp_stats s = mine;
                if (p != root) std::memcpy(&s, parts[static_cast<std::size_t>(p)]->data(), sizeof s);
                all.push_back(s);
            }
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "gathering");
    return all;
}

}  // namespace qkv::mpi
