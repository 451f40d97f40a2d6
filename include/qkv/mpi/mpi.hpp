// qkv::mpi: context-parallel attention across processes and machines over MPI (CMake target
// qkv::mpi, built when MPI is found). qkv/mpi/vulkan.hpp adds the Vulkan backend.
#pragma once

#include "qkv/mpi/backend.hpp"
#include "qkv/mpi/collective.hpp"
#include "qkv/mpi/error.hpp"
#include "qkv/mpi/kv_cache.hpp"
#include "qkv/mpi/layout.hpp"
#include "qkv/mpi/sdpa.hpp"
