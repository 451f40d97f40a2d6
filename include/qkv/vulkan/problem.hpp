// Moved to qkv/runtime/problem.hpp (the backend-neutral qkv::runtime library); this path forwards.
#pragma once

#include "qkv/runtime/problem.hpp"
