// The options of `qkv sdpa` and `qkv bench` beyond PyTorch's SDPA (qkv/runtime/sdpa.hpp): the
// sliding window, softcap, ALiBi and the K/V storage type, parsed from their command-line text.
// Every bad value is a usage_error (exit 2) naming the flag and the value.
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "qkv/runtime/element_type.hpp"

namespace qkv::cli {

/// "--window LEFT,RIGHT": two integers, each -1 (that side unbounded) or at least 0.
std::pair<std::int64_t, std::int64_t> parse_window(const std::string& text);

/// A finite float32 above 0 for `flag` ("--softcap C", "--alibi MAX_BIAS").
float parse_positive(const std::string& flag, const std::string& text);

/// "--kv-type f32|f16|q8_0|q4_0".
qkv::element_type parse_kv_type(const std::string& text);

}  // namespace qkv::cli
