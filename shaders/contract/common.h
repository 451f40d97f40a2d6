// The host–shader contract, shared word for word by C++ (src/) and GLSL (shaders/).
//
// Each kernel family has one header in this folder, included by its shaders and by the host code
// that records them. It holds everything the two sides must agree on: the push-constant block (a
// struct of 32-bit members), flag bits, binding indices and specialization-constant ids. Nothing
// is written twice, so the two sides cannot drift apart; the C++ side adds static_asserts on sizes
// and offsets where a layout rule could differ.
//
// Write a contract header like this:
//
//   #include "common.h"
//   QKV_CONTRACT_BEGIN
//   struct example_push {        // GLSL: layout(push_constant) uniform Push { example_push p; };
//       uint rows;               // only uint, int and float members: 4 bytes each, no padding
//       float scale;
//   };
//   QKV_CONST uint EXAMPLE_FLAG_CAUSAL = 1u;
//   QKV_CONST uint EXAMPLE_BINDING_Q = 0u;
//   QKV_CONTRACT_END
//   QKV_CONTRACT_CHECK(sizeof(example_push) == 8u)   // checked by the C++ compiler only
//
// A function both sides must compute alike is written once too, as QKV_FUNCTION, in the subset
// of GLSL and C++ they share (float literals with an f suffix, so that C++ computes in float).
//
// In C++ these land in namespace qkv::contract (uint is std::uint32_t); in GLSL they are globals.
#ifndef QKV_CONTRACT_COMMON_H
#define QKV_CONTRACT_COMMON_H

#ifdef __cplusplus
#include <cstdint>
namespace qkv::contract {
using uint = std::uint32_t;
}
#define QKV_CONTRACT_BEGIN namespace qkv::contract {
#define QKV_CONTRACT_END }
#define QKV_CONST inline constexpr
#define QKV_FUNCTION inline
#define QKV_CONTRACT_CHECK(condition) static_assert(condition, #condition);
#else
#define QKV_CONTRACT_BEGIN
#define QKV_CONTRACT_END
#define QKV_CONST const
#define QKV_FUNCTION
#define QKV_CONTRACT_CHECK(condition)
#endif

QKV_CONTRACT_BEGIN
/// Push constants guaranteed by every Vulkan implementation (maxPushConstantsSize >= 128).
QKV_CONST uint PUSH_CONSTANT_BYTES_GUARANTEED = 128u;
QKV_CONTRACT_END

#endif
