// Must not compile: a 2x3 matrix times a 2x4 matrix (inner dimensions 3 and 2 differ).
#include <qkv/matrix.hpp>
constexpr qkv::matrix<float, 2, 3> a{};
constexpr qkv::matrix<float, 2, 4> b{};
constexpr auto c = a * b;
