// The float64 CPU reference backend of qkv::mpi, and a shard of a sharded cache in host memory.
#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "qkv/mpi/backend.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {

kv_shard::~kv_shard() = default;
backend::~backend() = default;

element_type backend::kv_storage(const sdpa_options& options) const { return stored_kv_type(options); }

namespace {

/// Rows kept on the host as the float32 values of their stored form.
class cpu_shard final : public kv_shard {
public:
    explicit cpu_shard(const kv_layout& s) : shape_(s) {
        validate(s, "a cache shard");
        k_.resize(s.batch * s.kv_heads * s.capacity * s.d_qk);
        v_.resize(s.batch * s.kv_heads * s.capacity * s.d_v);
    }

    void append(std::span<const float> k, std::span<const float> v, std::size_t rows) override {
        const std::size_t bh = shape_.batch * shape_.kv_heads;
        if (size_ + rows > shape_.capacity)
            throw qkv::invalid_argument("a cache shard holds " + std::to_string(shape_.capacity) + " rows; appending " +
                                        std::to_string(rows) + " to " + std::to_string(size_) + " would pass it");
        if (k.size() != bh * rows * shape_.d_qk || v.size() != bh * rows * shape_.d_v)
            throw qkv::invalid_argument("a cache shard's append: k or v does not hold (B, Hkv, rows, E/Ev) values");
        for (std::size_t h = 0; h < bh; ++h) {
            std::copy_n(k.data() + h * rows * shape_.d_qk, rows * shape_.d_qk,
                        k_.data() + (h * shape_.capacity + size_) * shape_.d_qk);
            std::copy_n(v.data() + h * rows * shape_.d_v, rows * shape_.d_v,
                        v_.data() + (h * shape_.capacity + size_) * shape_.d_v);
        }
        size_ += rows;
    }

    sdpa_output_f64 partial(const sdpa_problem& queries) override {
        // The rows held, contiguous per (batch, kv head).
        const std::size_t bh = shape_.batch * shape_.kv_heads;
        std::vector<float> k(bh * size_ * shape_.d_qk), v(bh * size_ * shape_.d_v);
        for (std::size_t h = 0; h < bh; ++h) {
            std::copy_n(k_.data() + h * shape_.capacity * shape_.d_qk, size_ * shape_.d_qk,
                        k.data() + h * size_ * shape_.d_qk);
            std::copy_n(v_.data() + h * shape_.capacity * shape_.d_v, size_ * shape_.d_v,
                        v.data() + h * size_ * shape_.d_v);
        }
        sdpa_problem p = queries;
        p.shape.kv_len = size_;
        p.k = k;
        p.v = v;
        p.options.kv_type.reset();  // the values are the stored form already
        return cpu::sdpa_f64(p);
    }

    std::size_t size() const override { return size_; }

private:
    kv_layout shape_;
    std::vector<float> k_, v_;
    std::size_t size_ = 0;
};

}  // namespace

std::string cpu_backend::name() const { return "cpu reference"; }

element_type cpu_backend::kv_storage(const sdpa_options& options) const {
    return options.kv_type.value_or(element_type::f32);
}

sdpa_output_f64 cpu_backend::partial(const sdpa_problem& block) {
    sdpa_problem p = block;
    p.options.kv_type.reset();  // k and v hold the stored form's values already
    return cpu::sdpa_f64(p);
}

std::unique_ptr<kv_shard> cpu_backend::make_shard(const kv_layout& layout) {
    return std::make_unique<cpu_shard>(layout);
}

}  // namespace qkv::mpi
