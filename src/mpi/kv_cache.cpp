// The sharded K/V cache (qkv/mpi/kv_cache.hpp).
#include "qkv/mpi/kv_cache.hpp"

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
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
using detail::shared_bytes;

constexpr int tag_rows = 6, tag_header = 7, tag_queries = 8, tag_partial = 9;

/// What root tells every rank about a decode step: the shape and the options (by their field
/// lists, blocks.hpp's problem_bytes), then the masks' kind (0 none, 1 bool, 2 float) and their
/// four broadcast dimensions.
std::size_t header_bytes() { return detail::problem_bytes_size() + 4 + 4 * 8; }

shared_bytes make_header(const detail::whole& w) {
    auto out = std::make_shared<detail::bytes>(detail::problem_bytes(w.shape, w.options));
    detail::put_le(*out, !w.mask.empty() ? 1 : !w.additive.empty() ? 2 : 0, 4);
    for (const std::size_t d : w.mask_dims) detail::put_le(*out, d, 8);
    return out;
}

/// The whole problem a header describes (its masks' dimensions, not their values), and the masks'
/// kind.
std::uint32_t read_header(const detail::bytes& h, detail::whole& w) {
    std::size_t at = 0;
    detail::problem_from_bytes(h, at, w.shape, w.options);
    const auto kind = static_cast<std::uint32_t>(detail::get_le(h, at, 4));
    for (std::size_t& d : w.mask_dims) d = static_cast<std::size_t>(detail::get_le(h, at, 8));
    return kind;
}

}  // namespace

struct sharded_kv_cache::impl {
    MPI_Comm comm = MPI_COMM_NULL;  // a duplicate of the caller's: every operation's channel duplicates it again
    backend* compute = nullptr;
    kv_layout layout;  // capacity: each rank's
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
        const std::size_t first = static_cast<std::size_t>(r) * layout.capacity;
        const std::size_t end = std::min(size, first + layout.capacity);
        return {first, std::max(first, end)};
    }

    [[nodiscard]] detail::whole kv_whole() const {
        detail::whole w;
        w.shape = {.batch = layout.batch,
                   .q_heads = layout.kv_heads,
                   .kv_heads = layout.kv_heads,
                   .q_len = 1,
                   .kv_len = 1,
                   .d_qk = layout.d_qk,
                   .d_v = layout.d_v};
        w.wire = layout.type;
        return w;
    }

    void check_usable() const {
        if (broken)
            throw qkv::mpi::error(
                "this sharded_kv_cache failed in an earlier append on some rank and is no longer consistent");
    }
};

sharded_kv_cache::sharded_kv_cache(MPI_Comm comm, backend& compute, const kv_layout& layout, int root,
                                   const comm_options& options)
    : impl_(std::make_unique<impl>()) {
    impl& m = *impl_;
    m.compute = &compute;
    m.layout = layout;
    m.root = root;
    m.options = options;
    channel ch(comm, options, "qkv::mpi::sharded_kv_cache");
    m.ranks = ch.size();
    m.rank = ch.rank();
    detail::fingerprint fp;
    for (const std::size_t v : {layout.batch, layout.kv_heads, layout.capacity, layout.d_qk, layout.d_v})
        fp.add_value(v);
    fp.add_value(layout.type);
    fp.add_value(root);
    std::exception_ptr failure;
    try {
        if (root < 0 || root >= m.ranks)
            throw qkv::invalid_argument("sharded_kv_cache: root " + std::to_string(root) +
                                        " is not a rank of the communicator");
        validate(layout, "sharded_kv_cache");
        m.shard = compute.make_shard(layout);
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
    const std::size_t bh = m.layout.batch * m.layout.kv_heads;
    // Root quantizes the new rows once, cut by the rank that will hold them.
    std::vector<shared_bytes> pieces(static_cast<std::size_t>(m.ranks));
    const auto piece_of = [&](int r) {  // new rows' positions [first, end) within [0, rows) that rank r takes
        const row_range held = m.rows_of(r, m.total + rows), before = m.rows_of(r, m.total);
        return row_range{before.end - m.total, held.end - m.total};
    };
    std::exception_ptr failure;
    try {
        m.check_usable();
        require_supported(entry_point::mpi_append, features_of(m.layout.type));
        if (m.total + rows > m.layout.capacity * static_cast<std::size_t>(m.ranks))
            throw qkv::invalid_argument("sharded_kv_cache::append: " + std::to_string(rows) + " rows after " +
                                        std::to_string(m.total) + " pass the cache's capacity of " +
                                        std::to_string(m.layout.capacity * static_cast<std::size_t>(m.ranks)) +
                                        " rows (" + std::to_string(m.ranks) + " ranks of " +
                                        std::to_string(m.layout.capacity) + ")");
        if (m.rank == m.root) {
            if (k.size() != bh * rows * m.layout.d_qk || v.size() != bh * rows * m.layout.d_v)
                throw qkv::invalid_argument(
                    "sharded_kv_cache::append: k holds " + std::to_string(k.size()) + " and v " +
                    std::to_string(v.size()) +
                    " values, expected (B, Hkv, rows, E) = " + std::to_string(bh * rows * m.layout.d_qk) +
                    " and (B, Hkv, rows, Ev) = " + std::to_string(bh * rows * m.layout.d_v));
            for (int r = 0; r < m.ranks; ++r) {
                const row_range p = piece_of(r);
                if (p.size() == 0) continue;
                const sequence_slice s{{p}};
                const std::vector<float> kr = take_rows(k, bh, rows, m.layout.d_qk, s);
                const std::vector<float> vr = take_rows(v, bh, rows, m.layout.d_v, s);
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

namespace {

/// One decode step of a sharded cache, as its named steps: root checks the queries; every rank
/// holding rows learns the problem; root sends q (and the masks' columns) to every rank whose rows
/// the queries see; each computes its partial (root's own while the others' travel) and sends it
/// back; root merges them in rank order and applies the sinks once.
class decode_step {
public:
    decode_step(sharded_kv_cache::impl& m, channel& ch, const sdpa_problem& queries, cp_stats& stats)
        : m_(m), ch_(ch), queries_(queries), stats_(stats) {}

    /// On root: the one check of a call against a cache, and the whole problem from it.
    void check() {
        m_.check_usable();
        if (m_.rank != m_.root) return;
        const sdpa_problem p = check_against_cache(queries_, m_.layout, m_.total, "sharded_kv_cache::decode");
        require_supported(entry_point::mpi_decode, p);
        w_ = detail::whole{.shape = p.shape,
                           .options = p.options,
                           .mask = p.mask,
                           .additive = p.additive_mask,
                           .sinks = p.sinks,
                           .wire = m_.layout.type};
        detail::complete(w_, p.mask_shape);
    }

    /// Every rank holding rows learns the problem (not q, the masks or the sinks).
    void announce() {
        shared_bytes header = mine_is_root() ? make_header(w_) : std::make_shared<detail::bytes>(header_bytes());
        std::vector<std::size_t> transfers;
        if (mine_is_root()) {
            for (int r = 0; r < m_.ranks; ++r)
                if (r != m_.root && m_.rows_of(r, m_.total).size() > 0)
                    transfers.push_back(ch_.post_send(header, r, tag_header, "the decode step"));
        } else if (m_.rows_of(m_.rank, m_.total).size() > 0) {
            transfers.push_back(ch_.post_recv(header, m_.root, tag_header, "the decode step"));
        }
        ch_.wait(transfers);
        detail::whole told{.wire = m_.layout.type};
        mask_kind_ = read_header(*header, told);
        if (!mine_is_root()) {
            const std::array<std::size_t, 4> dims = told.mask_dims;
            w_ = told;
            detail::complete(w_, {});
            w_.mask_dims = dims;
        }
    }

    /// Root: q and the masks' columns of its rows to every rank whose rows the queries see, and a
    /// receive of its partial; another rank that is seen: the receive of its queries.
    void send_queries() {
        partials_.assign(static_cast<std::size_t>(m_.ranks), nullptr);
        partial_from_.assign(static_cast<std::size_t>(m_.ranks), SIZE_MAX);
        if (mine_is_root()) {
            for (int r = 0; r < m_.ranks; ++r) {
                if (r == m_.root || !sees(r)) continue;
                transfers_.push_back(
                    ch_.post_send(queries_for(m_.rows_of(r, m_.total)), r, tag_queries, "the queries"));
                partials_[static_cast<std::size_t>(r)] = std::make_shared<detail::bytes>(partial_bytes());
                partial_from_[static_cast<std::size_t>(r)] =
                    ch_.post_recv(partials_[static_cast<std::size_t>(r)], r, tag_partial,
                                  "the partial results of rank " + std::to_string(r));
            }
        } else if (sees(m_.rank)) {
            request_ = std::make_shared<detail::bytes>(request_bytes(m_.rows_of(m_.rank, m_.total)));
            transfers_.push_back(ch_.post_recv(request_, m_.root, tag_queries, "the queries"));
        }
    }

    /// This rank's partial over the rows it holds (root's while the others' travel); sent to root.
    void compute_own() {
        if (!sees(m_.rank)) return;
        const sdpa_shape& s = w_.shape;
        const row_range k = m_.rows_of(m_.rank, m_.total);
        if (!mine_is_root()) {
            ch_.wait(transfers_);  // the queries first
            transfers_.clear();
            take_request(k);
        }
        const std::span<const float> q = mine_is_root() ? queries_.q : std::span<const float>(q_rows_);
        mine_.emplace_back(w_, s.q_len);
        ch_.wait(transfers_, [&] {
            const detail::block_problem b(w_, {0, s.q_len}, q, k, {}, {});
            mine_[0].merge(m_.shard->partial(b.problem()));
            ++stats_.blocks_computed;
        });
        transfers_.clear();
        ++stats_.steps;
        if (!mine_is_root())
            transfers_.push_back(ch_.post_send(detail::to_bytes(mine_[0].out(), mine_[0].lse()), m_.root, tag_partial,
                                               "its partial results"));
    }

    /// Waits for the partials (root) or for its own to leave; root merges them in rank order and
    /// applies the sinks once.
    [[nodiscard]] sdpa_output merge() {
        for (int r = 0; r < m_.ranks; ++r)
            if (partial_from_[static_cast<std::size_t>(r)] != SIZE_MAX)
                transfers_.push_back(partial_from_[static_cast<std::size_t>(r)]);
        ch_.wait(transfers_);
        sdpa_output result;
        if (!mine_is_root()) return result;
        const sdpa_shape& s = w_.shape;
        detail::merged_rows merged(w_, s.q_len);
        for (int r = 0; r < m_.ranks; ++r) {
            if (r == m_.root) {
                if (!mine_.empty()) merged.merge(mine_[0].out(), mine_[0].lse());
            } else if (partials_[static_cast<std::size_t>(r)]) {
                std::vector<double> o(s.batch * s.q_heads * s.q_len * s.d_v), l(s.batch * s.q_heads * s.q_len);
                detail::from_bytes(*partials_[static_cast<std::size_t>(r)], 0, std::span<double>(o));
                detail::from_bytes(*partials_[static_cast<std::size_t>(r)], o.size() * sizeof(double),
                                   std::span<double>(l));
                merged.merge(o, l);
            }
        }
        result.output.assign(s.batch * s.q_heads * s.q_len * s.d_v, 0.0f);
        if (s.q_len > 0 && w_.options.return_lse) result.lse.assign(s.batch * s.q_heads * s.q_len, 0.0f);
        merged.finish(s.q_len, 0, result.output, result.lse);
        result.shape = s;
        result.device = m_.compute->name() + " (" + std::to_string(m_.ranks) + " ranks)";
        return result;
    }

private:
    [[nodiscard]] bool mine_is_root() const { return m_.rank == m_.root; }
    [[nodiscard]] bool sees(int r) const { return detail::visible(w_, {0, w_.shape.q_len}, m_.rows_of(r, m_.total)); }
    [[nodiscard]] std::size_t q_values() const {
        const sdpa_shape& s = w_.shape;
        return s.batch * s.q_heads * s.q_len * s.d_qk;
    }
    [[nodiscard]] std::size_t partial_bytes() const {
        const sdpa_shape& s = w_.shape;
        return s.batch * s.q_heads * s.q_len * (s.d_v + 1) * sizeof(double);
    }
    [[nodiscard]] std::size_t mask_element() const { return mask_kind_ == 1 ? 1 : mask_kind_ == 2 ? sizeof(float) : 0; }
    /// The masks' columns of keys `k` (all of them where the masks broadcast along the keys).
    [[nodiscard]] std::size_t mask_columns(row_range k) const { return w_.mask_dims[3] == 1 ? 1 : k.size(); }
    [[nodiscard]] std::size_t request_bytes(row_range k) const {
        return q_values() * sizeof(float) +
               w_.mask_dims[0] * w_.mask_dims[1] * w_.mask_dims[2] * mask_columns(k) * mask_element();
    }

    /// q, then the masks' columns of keys `k`, every other dimension as it is.
    [[nodiscard]] shared_bytes queries_for(row_range k) const {
        auto data = std::make_shared<detail::bytes>(request_bytes(k));
        std::memcpy(data->data(), queries_.q.data(), q_values() * sizeof(float));
        std::byte* at = data->data() + q_values() * sizeof(float);
        const std::size_t rows = w_.mask_dims[0] * w_.mask_dims[1] * w_.mask_dims[2];
        const std::size_t cols = mask_columns(k), first = w_.mask_dims[3] == 1 ? 0 : k.first;
        for (std::size_t i = 0; i < rows && mask_kind_ != 0; ++i) {
            const std::size_t from = i * w_.mask_dims[3] + first;
            if (mask_kind_ == 1)
                std::memcpy(at, w_.mask.data() + from, cols);
            else
                std::memcpy(at, w_.additive.data() + from, cols * sizeof(float));
            at += cols * mask_element();
        }
        return data;
    }

    /// The queries and masks root sent, for keys `k`.
    void take_request(row_range k) {
        q_rows_.resize(q_values());
        detail::from_bytes(*request_, 0, std::span<float>(q_rows_));
        const std::size_t n = w_.mask_dims[0] * w_.mask_dims[1] * w_.mask_dims[2] * mask_columns(k);
        const std::size_t at = q_values() * sizeof(float);
        if (mask_kind_ == 1) {
            mask_bytes_.resize(n);
            std::memcpy(mask_bytes_.data(), request_->data() + at, n);
            w_.mask = mask_bytes_;
        } else if (mask_kind_ == 2) {
            mask_floats_.resize(n);
            detail::from_bytes(*request_, at, std::span<float>(mask_floats_));
            w_.additive = mask_floats_;
        }
        w_.mask_dims[3] = mask_columns(k);
        w_.mask_first_key = w_.mask_dims[3] == 1 ? 0 : k.first;
    }

    sharded_kv_cache::impl& m_;
    channel& ch_;
    const sdpa_problem& queries_;
    cp_stats& stats_;
    detail::whole w_;
    std::uint32_t mask_kind_ = 0;
    std::vector<std::size_t> transfers_;
    std::vector<shared_bytes> partials_;
    std::vector<std::size_t> partial_from_;
    shared_bytes request_;
    std::vector<float> q_rows_, mask_floats_;
    std::vector<std::uint8_t> mask_bytes_;
    std::vector<detail::merged_rows> mine_;
};

}  // namespace

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
    decode_step step(m, ch, queries, stats);
    std::exception_ptr failure;
    try {
        step.check();
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "checking the queries");
    sdpa_output result;
    try {
        step.announce();
        step.send_queries();
        step.compute_own();
        result = step.merge();
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
    return impl_->layout.capacity * static_cast<std::size_t>(impl_->ranks);
}
std::size_t sharded_kv_cache::local_size() const { return impl_->rows_of(impl_->rank, impl_->total).size(); }
row_range sharded_kv_cache::local_rows() const { return impl_->rows_of(impl_->rank, impl_->total); }
const kv_layout& sharded_kv_cache::layout() const { return impl_->layout; }
const cp_stats& sharded_kv_cache::last_stats() const { return impl_->last; }

}  // namespace qkv::mpi
