// The sharded K/V cache (qkv/mpi/kv_cache.hpp).
#include "qkv/mpi/kv_cache.hpp"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "mpi/blocks.hpp"
#include "mpi/channel.hpp"
#include "qkv/mpi/error.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {
namespace {

using detail::channel;
using detail::shared_bytes;

constexpr int tag_rows = 6, tag_header = 7, tag_queries = 8, tag_partial = 9;

/// What root tells every rank about a decode step (plain bytes).
struct decode_header {
    std::uint64_t shape[7] = {};
    std::int64_t window_left = -1, window_right = -1, position_offset = 0;
    float scale = 0, softcap = 0, alibi_max_bias = 0;
    std::int32_t has_scale = 0, causal = 0, alignment = 0, precision = 0, kernel = 0, return_lse = 0;
    std::int32_t has_kv_type = 0, kv_type = 0, has_position_offset = 0, mask_kind = 0;  // 0 none, 1 bool, 2 float
    std::uint64_t mask_dims[4] = {};
};

decode_header make_header(const detail::whole& w) {
    decode_header h;
    const sdpa_shape& s = w.shape;
    const std::size_t dims[7] = {s.batch, s.q_heads, s.kv_heads, s.q_len, s.kv_len, s.d_qk, s.d_v};
    for (int i = 0; i < 7; ++i) h.shape[i] = dims[i];
    const sdpa_options& o = w.options;
    h.window_left = o.window_left;
    h.window_right = o.window_right;
    h.has_position_offset = o.position_offset.has_value();
    h.position_offset = o.position_offset.value_or(0);
    h.has_scale = o.scale.has_value();
    h.scale = o.scale.value_or(0.0f);
    h.softcap = o.softcap;
    h.alibi_max_bias = o.alibi_max_bias;
    h.causal = o.causal;
    h.alignment = static_cast<std::int32_t>(o.alignment);
    h.precision = static_cast<std::int32_t>(o.precision);
    h.kernel = static_cast<std::int32_t>(o.kernel);
    h.return_lse = o.return_lse;
    h.has_kv_type = o.kv_type.has_value();
    h.kv_type = static_cast<std::int32_t>(o.kv_type.value_or(element_type::f32));
    h.mask_kind = !w.mask.empty() ? 1 : !w.additive.empty() ? 2 : 0;
    for (int i = 0; i < 4; ++i) h.mask_dims[i] = w.mask_dims[static_cast<std::size_t>(i)];
    return h;
}

sdpa_shape shape_of(const decode_header& h) {
    return {.batch = h.shape[0],
            .q_heads = h.shape[1],
            .kv_heads = h.shape[2],
            .q_len = h.shape[3],
            .kv_len = h.shape[4],
            .d_qk = h.shape[5],
            .d_v = h.shape[6]};
}

sdpa_options options_of(const decode_header& h) {
    sdpa_options o;
    if (h.has_scale) o.scale = h.scale;
    o.causal = h.causal != 0;
    o.alignment = static_cast<causal_alignment>(h.alignment);
    o.precision = static_cast<qkv::precision>(h.precision);
    o.kernel = static_cast<kernel_family>(h.kernel);
    o.window_left = h.window_left;
    o.window_right = h.window_right;
    o.softcap = h.softcap;
    o.alibi_max_bias = h.alibi_max_bias;
    o.return_lse = h.return_lse != 0;
    if (h.has_kv_type) o.kv_type = static_cast<element_type>(h.kv_type);
    if (h.has_position_offset) o.position_offset = h.position_offset;
    return o;
}

}  // namespace

struct sharded_kv_cache::impl {
    MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of the caller's: every operation's channel duplicates it again
    backend* compute = nullptr;
    sharded_kv_cache_shape shape;
    int root = 0, ranks = 1, rank = 0;
    comm_options options;
    std::unique_ptr<kv_shard> shard;
    std::size_t total = 0;
    bool broken = false;
    cp_stats last;

    ~impl() {
        shard.reset();
        int finalised = 0;
        MPI_Finalized(&finalised);
        if (comm != MPI_COMM_NULL && !finalised) MPI_Comm_free(&comm);
    }

    /// Rows [first, end) of the sequence that rank r holds now.
    [[nodiscard]] row_range rows_of(int r, std::size_t size) const {
        const std::size_t first = static_cast<std::size_t>(r) * shape.rows_per_rank;
        const std::size_t end = std::min(size, first + shape.rows_per_rank);
        return {first, std::max(first, end)};
    }

    [[nodiscard]] detail::whole kv_whole() const {
        detail::whole w;
        w.shape = {.batch = shape.batch,
                   .q_heads = shape.kv_heads,
                   .kv_heads = shape.kv_heads,
                   .q_len = 1,
                   .kv_len = 1,
                   .d_qk = shape.d_qk,
                   .d_v = shape.d_v};
        w.wire = shape.type;
        return w;
    }

    void check_usable() const {
        if (broken)
            throw qkv::mpi::error(
                "this sharded_kv_cache failed in an earlier append on some rank and is no longer consistent");
    }
};

sharded_kv_cache::sharded_kv_cache(MPI_Comm comm, backend& compute, const sharded_kv_cache_shape& shape, int root,
                                   const comm_options& options)
    : impl_(std::make_unique<impl>()) {
    impl& m = *impl_;
    m.compute = &compute;
    m.shape = shape;
    m.root = root;
    m.options = options;
    channel ch(comm, options, "qkv::mpi::sharded_kv_cache");
    m.ranks = ch.size();
    m.rank = ch.rank();
    detail::fingerprint fp;
    for (const std::size_t v : {shape.batch, shape.kv_heads, shape.rows_per_rank, shape.d_qk, shape.d_v})
        fp.add_value(v);
    fp.add_value(shape.type);
    fp.add_value(root);
    std::exception_ptr failure;
    try {
        if (root < 0 || root >= m.ranks)
            throw qkv::invalid_argument("sharded_kv_cache: root " + std::to_string(root) +
                                        " is not a rank of the communicator");
        if (!is_known(shape.type)) throw qkv::invalid_argument("sharded_kv_cache: unknown element type");
        if (is_quantized(shape.type) &&
            (shape.d_qk % block_size(shape.type) != 0 || shape.d_v % block_size(shape.type) != 0))
            throw qkv::invalid_argument("sharded_kv_cache: type " + std::string(to_string(shape.type)) +
                                        " stores blocks of 32 values: d_qk and d_v must be multiples of 32");
        m.shard = compute.make_shard({.batch = shape.batch,
                                      .kv_heads = shape.kv_heads,
                                      .capacity = shape.rows_per_rank,
                                      .d_qk = shape.d_qk,
                                      .d_v = shape.d_v,
                                      .type = shape.type});
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "making the shards");
    // The cache's own duplicate, for the operations to come.
    detail::check_mpi(MPI_Comm_dup(comm, &m.comm), "MPI_Comm_dup");
}

sharded_kv_cache::~sharded_kv_cache() = default;
sharded_kv_cache::sharded_kv_cache(sharded_kv_cache&&) noexcept = default;
sharded_kv_cache& sharded_kv_cache::operator=(sharded_kv_cache&&) noexcept = default;

void sharded_kv_cache::append(std::span<const float> k, std::span<const float> v, std::size_t rows) {
    if (!impl_) throw qkv::error("sharded_kv_cache: used after move");
    impl& m = *impl_;
    channel ch(m.comm, m.options, "qkv::mpi::sharded_kv_cache::append");
    detail::fingerprint fp;
    fp.add_value(rows);
    fp.add_value(m.total);
    const detail::whole w = m.kv_whole();
    const std::size_t bh = m.shape.batch * m.shape.kv_heads;
    // Root quantizes the new rows once, cut by the rank that will hold them.
    std::vector<shared_bytes> pieces(static_cast<std::size_t>(m.ranks));
    const auto piece_of = [&](int r) {  // new rows' positions [first, end) within [0, rows) that rank r takes
        const row_range held = m.rows_of(r, m.total + rows), before = m.rows_of(r, m.total);
        return row_range{before.end - m.total, held.end - m.total};
    };
    std::exception_ptr failure;
    try {
        m.check_usable();
        if (m.total + rows > m.shape.rows_per_rank * static_cast<std::size_t>(m.ranks))
            throw qkv::invalid_argument("sharded_kv_cache::append: " + std::to_string(rows) + " rows after " +
                                        std::to_string(m.total) + " pass the cache's capacity of " +
                                        std::to_string(m.shape.rows_per_rank * static_cast<std::size_t>(m.ranks)) +
                                        " rows (" + std::to_string(m.ranks) + " ranks of " +
                                        std::to_string(m.shape.rows_per_rank) + ")");
        if (m.rank == m.root) {
            if (k.size() != bh * rows * m.shape.d_qk || v.size() != bh * rows * m.shape.d_v)
                throw qkv::invalid_argument(
                    "sharded_kv_cache::append: k holds " + std::to_string(k.size()) + " and v " +
                    std::to_string(v.size()) +
                    " values, expected (B, Hkv, rows, E) = " + std::to_string(bh * rows * m.shape.d_qk) +
                    " and (B, Hkv, rows, Ev) = " + std::to_string(bh * rows * m.shape.d_v));
            for (int r = 0; r < m.ranks; ++r) {
                const row_range p = piece_of(r);
                if (p.size() == 0) continue;
                const sequence_slice s{{p}};
                const std::vector<float> kr = take_rows(k, bh, rows, m.shape.d_qk, s);
                const std::vector<float> vr = take_rows(v, bh, rows, m.shape.d_v, s);
                pieces[static_cast<std::size_t>(r)] = detail::encode_kv(w, kr, vr, sequence_slice{{{0, p.size()}}});
            }
        }
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "checking the rows");
    try {
        std::vector<std::size_t> transfers;
        const row_range mine = piece_of(m.rank);
        shared_bytes incoming;
        if (m.rank == m.root) {
            for (int r = 0; r < m.ranks; ++r)
                if (r != m.root && pieces[static_cast<std::size_t>(r)])
                    transfers.push_back(ch.post_send(pieces[static_cast<std::size_t>(r)], r, tag_rows, "new rows"));
            incoming = pieces[static_cast<std::size_t>(m.root)];
        } else if (mine.size() > 0) {
            incoming = std::make_shared<detail::bytes>(detail::kv_bytes(w, sequence_slice{{{0, mine.size()}}}));
            transfers.push_back(ch.post_recv(incoming, m.root, tag_rows, "its new rows"));
        }
        ch.wait(transfers);
        if (incoming) {
            const std::vector<detail::kv_values> kv =
                detail::decode_kv(w, *incoming, sequence_slice{{{0, mine.size()}}});
            m.shard->append(kv[0].k, kv[0].v, mine.size());
        }
    } catch (...) {
        failure = std::current_exception();
    }
    try {
        ch.agree(failure, fp.value(), "appending");
    } catch (...) {
        m.broken = true;  // some shards may hold the new rows, others not
        throw;
    }
    m.total += rows;
}

sdpa_output sharded_kv_cache::decode(const sdpa_problem& queries) {
    if (!impl_) throw qkv::error("sharded_kv_cache: used after move");
    impl& m = *impl_;
    const auto start = detail::clock::now();
    channel ch(m.comm, m.options, "qkv::mpi::sharded_kv_cache::decode");
    cp_stats stats;
    stats.rank = m.rank;
    stats.ranks = m.ranks;
    detail::fingerprint fp;
    fp.add_value(m.total);
    detail::whole w;
    std::exception_ptr failure;
    try {
        m.check_usable();
        if (m.rank == m.root) {
            if (queries.options.return_weights)
                throw qkv::invalid_argument(
                    "sharded_kv_cache::decode: return_weights is not available (the weights "
                    "of a row span every rank); use return_lse");
            if (m.total == 0) throw qkv::invalid_argument("sharded_kv_cache::decode: the cache is empty");
            if (queries.shape.kv_len != 0 && queries.shape.kv_len != m.total)
                throw qkv::invalid_argument("sharded_kv_cache::decode: shape.kv_len is " +
                                            std::to_string(queries.shape.kv_len) + "; the cache holds " +
                                            std::to_string(m.total) + " rows (0 means all of them)");
            const sdpa_shape& s = queries.shape;
            if (s.batch != m.shape.batch || s.kv_heads != m.shape.kv_heads || s.d_qk != m.shape.d_qk ||
                s.d_v != m.shape.d_v)
                throw qkv::invalid_argument(
                    "sharded_kv_cache::decode: batch, kv_heads, d_qk and d_v must be the cache's (" +
                    std::to_string(m.shape.batch) + ", " + std::to_string(m.shape.kv_heads) + ", " +
                    std::to_string(m.shape.d_qk) + ", " + std::to_string(m.shape.d_v) + ")");
            if (queries.options.kv_type && *queries.options.kv_type != m.shape.type)
                throw qkv::invalid_argument(
                    "sharded_kv_cache::decode: options.kv_type must be unset or the cache's "
                    "type, " +
                    std::string(to_string(m.shape.type)));
            sdpa_problem p = queries;
            p.shape.kv_len = m.total;
            validate_queries(p);
            w = detail::whole{.shape = p.shape,
                              .options = p.options,
                              .mask = p.mask,
                              .additive = p.additive_mask,
                              .sinks = p.sinks,
                              .wire = m.shape.type};
            detail::complete(w, p.mask_shape);
        }
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "checking the queries");

    sdpa_output result;
    try {
        // 1. Every rank learns the problem (not q, the masks or the sinks).
        auto header = std::make_shared<detail::bytes>(sizeof(decode_header));
        std::vector<std::size_t> transfers;
        if (m.rank == m.root) {
            const decode_header h = make_header(w);
            std::memcpy(header->data(), &h, sizeof h);
            for (int r = 0; r < m.ranks; ++r)
                if (r != m.root && m.rows_of(r, m.total).size() > 0)
                    transfers.push_back(ch.post_send(header, r, tag_header, "the decode step"));
        } else if (m.rows_of(m.rank, m.total).size() > 0) {
            transfers.push_back(ch.post_recv(header, m.root, tag_header, "the decode step"));
        }
        ch.wait(transfers);
        decode_header h;
        std::memcpy(&h, header->data(), sizeof h);
        if (m.rank != m.root) {
            w = detail::whole{.shape = shape_of(h), .options = options_of(h), .wire = m.shape.type};
            detail::complete(w, {});
            for (int i = 0; i < 4; ++i) w.mask_dims[static_cast<std::size_t>(i)] = h.mask_dims[i];
        }
        const sdpa_shape& s = w.shape;
        const row_range all_queries{0, s.q_len};
        const std::size_t q_values = s.batch * s.q_heads * s.q_len * s.d_qk;
        const auto mask_columns = [&](row_range k) { return w.mask_dims[3] == 1 ? std::size_t{1} : k.size(); };
        const auto mask_values = [&](row_range k) {
            return w.mask_dims[0] * w.mask_dims[1] * w.mask_dims[2] * mask_columns(k);
        };
        const auto partial_bytes = [&] { return s.batch * s.q_heads * s.q_len * (s.d_v + 1) * sizeof(double); };
        const auto sees = [&](int r) { return detail::visible(w, all_queries, m.rows_of(r, m.total)); };

        // 2. q (and the mask's columns of its rows) to every rank whose rows the queries see; the
        //    partials back to root.
        transfers.clear();
        std::vector<shared_bytes> partials(static_cast<std::size_t>(m.ranks));
        std::vector<std::size_t> partial_from(static_cast<std::size_t>(m.ranks), SIZE_MAX);
        shared_bytes request;
        const int mask_kind = h.mask_kind;
        const std::size_t mask_elem = mask_kind == 1 ? 1 : mask_kind == 2 ? sizeof(float) : 0;
        if (m.rank == m.root) {
            for (int r = 0; r < m.ranks; ++r) {
                if (r == m.root || !sees(r)) continue;
                const row_range k = m.rows_of(r, m.total);
                auto data = std::make_shared<detail::bytes>(q_values * sizeof(float) + mask_values(k) * mask_elem);
                std::memcpy(data->data(), queries.q.data(), q_values * sizeof(float));
                std::byte* at = data->data() + q_values * sizeof(float);
                // The mask's columns of rank r's rows, every other dimension as it is.
                const std::size_t rows = w.mask_dims[0] * w.mask_dims[1] * w.mask_dims[2];
                const std::size_t cols = mask_columns(k), first = w.mask_dims[3] == 1 ? 0 : k.first;
                for (std::size_t i = 0; i < rows && mask_kind != 0; ++i) {
                    const std::size_t from = i * w.mask_dims[3] + first;
                    if (mask_kind == 1)
                        std::memcpy(at, w.mask.data() + from, cols);
                    else
                        std::memcpy(at, w.additive.data() + from, cols * sizeof(float));
                    at += cols * mask_elem;
                }
                transfers.push_back(ch.post_send(std::move(data), r, tag_queries, "the queries"));
                partials[static_cast<std::size_t>(r)] = std::make_shared<detail::bytes>(partial_bytes());
                partial_from[static_cast<std::size_t>(r)] =
                    ch.post_recv(partials[static_cast<std::size_t>(r)], r, tag_partial,
                                 "the partial results of rank " + std::to_string(r));
            }
        } else if (sees(m.rank)) {
            const row_range k = m.rows_of(m.rank, m.total);
            request = std::make_shared<detail::bytes>(q_values * sizeof(float) + mask_values(k) * mask_elem);
            transfers.push_back(ch.post_recv(request, m.root, tag_queries, "the queries"));
        }

        // 3. The partial of this rank's rows: root's while the others' travel.
        std::vector<detail::merged_rows> mine;
        std::vector<float> q_rows, mask_bytes_f;
        std::vector<std::uint8_t> mask_bytes;
        if (sees(m.rank)) {
            const row_range k = m.rows_of(m.rank, m.total);
            if (m.rank != m.root) {
                ch.wait(transfers);  // the queries first
                transfers.clear();
                q_rows.resize(q_values);
                detail::from_bytes(*request, 0, std::span<float>(q_rows));
                const std::size_t n = mask_values(k), at = q_values * sizeof(float);
                if (mask_kind == 1) {
                    mask_bytes.resize(n);
                    std::memcpy(mask_bytes.data(), request->data() + at, n);
                    w.mask = mask_bytes;
                } else if (mask_kind == 2) {
                    mask_bytes_f.resize(n);
                    detail::from_bytes(*request, at, std::span<float>(mask_bytes_f));
                    w.additive = mask_bytes_f;
                }
                w.mask_dims[3] = mask_columns(k);
                w.mask_first_key = w.mask_dims[3] == 1 ? 0 : k.first;
            }
            const std::span<const float> q = m.rank == m.root ? queries.q : std::span<const float>(q_rows);
            mine.emplace_back(w, s.q_len);
            ch.wait(transfers, [&] {
                const detail::block_problem b(w, all_queries, q, k, {}, {});
                mine[0].merge(m.shard->partial(b.problem()));
                ++stats.blocks_computed;
            });
            transfers.clear();
            ++stats.steps;
            if (m.rank != m.root)
                transfers.push_back(ch.post_send(detail::to_bytes(mine[0].out(), mine[0].lse()), m.root, tag_partial,
                                                 "its partial results"));
        }
        for (int r = 0; r < m.ranks; ++r)
            if (partial_from[static_cast<std::size_t>(r)] != SIZE_MAX)
                transfers.push_back(partial_from[static_cast<std::size_t>(r)]);
        ch.wait(transfers);

        // 4. Root merges in rank order and applies the sinks once.
        if (m.rank == m.root) {
            detail::merged_rows merged(w, s.q_len);
            for (int r = 0; r < m.ranks; ++r) {
                if (r == m.root) {
                    if (!mine.empty()) merged.merge(mine[0].out(), mine[0].lse());
                } else if (partials[static_cast<std::size_t>(r)]) {
                    std::vector<double> o(s.batch * s.q_heads * s.q_len * s.d_v), l(s.batch * s.q_heads * s.q_len);
                    detail::from_bytes(*partials[static_cast<std::size_t>(r)], 0, std::span<double>(o));
                    detail::from_bytes(*partials[static_cast<std::size_t>(r)], o.size() * sizeof(double),
                                       std::span<double>(l));
                    merged.merge(o, l);
                }
            }
            result.output.assign(s.batch * s.q_heads * s.q_len * s.d_v, 0.0f);
            if (s.q_len > 0 && w.options.return_lse) result.lse.assign(s.batch * s.q_heads * s.q_len, 0.0f);
            merged.finish(s.q_len, 0, result.output, result.lse);
            result.shape = s;
            result.device = m.compute->name() + " (" + std::to_string(m.ranks) + " ranks)";
        }
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "decoding");
    stats.agreement_ms = ch.agreement_ms();
    stats.compute_ms = ch.compute_ms();
    stats.comm_ms = ch.comm_ms();
    stats.exposed_ms = ch.exposed_ms();
    stats.bytes_sent = ch.bytes_sent();
    stats.bytes_received = ch.bytes_received();
    stats.total_ms = detail::ms_between(start, detail::clock::now());
    m.last = stats;
    return result;
}

std::size_t sharded_kv_cache::size() const { return impl_->total; }
std::size_t sharded_kv_cache::capacity() const {
    return impl_->shape.rows_per_rank * static_cast<std::size_t>(impl_->ranks);
}
std::size_t sharded_kv_cache::local_size() const { return impl_->rows_of(impl_->rank, impl_->total).size(); }
row_range sharded_kv_cache::local_rows() const { return impl_->rows_of(impl_->rank, impl_->total); }
const sharded_kv_cache_shape& sharded_kv_cache::shape() const { return impl_->shape; }
const cp_stats& sharded_kv_cache::last_stats() const { return impl_->last; }

}  // namespace qkv::mpi
