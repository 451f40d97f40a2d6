// The errors of qkv::mpi. A collective call of qkv::mpi either returns on every rank or throws on
// every rank (unless a rank died or hung: then the others time out), and what it throws is the
// same everywhere: the failure of the lowest-numbered rank that failed, as the same type it had
// there, its message prefixed with "rank R of N: ". The types carried across ranks are
// qkv::invalid_argument, qkv::mpi::timeout, qkv::mpi::error and (when qkv::mpi is built with
// Vulkan) qkv::vulkan::unavailable, no_matching_device, limit_exceeded, out_of_memory,
// numeric_overflow, device_lost and qkv::vulkan::error; any other qkv::error arrives as
// qkv::error, any other exception as qkv::mpi::error.
//
//   qkv::error
//   └─ qkv::mpi::error        an MPI call failed, or a rank failed with an exception qkv does not know
//      └─ qkv::mpi::timeout   a wait on other ranks outlasted comm_options::timeout; the message names
//                             the operation and the ranks waited for
#pragma once

#include "qkv/mpi/export.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {

class QKV_MPI_API error : public qkv::error {
public:
    using qkv::error::error;
};

class QKV_MPI_API timeout : public error {
public:
    using error::error;
};

}  // namespace qkv::mpi
