// Moved to qkv/runtime/cpu.hpp (the backend-neutral qkv::runtime library); this path forwards.
#pragma once

#include "qkv/runtime/cpu.hpp"
