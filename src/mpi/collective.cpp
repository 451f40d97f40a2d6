// The collective calls of qkv/mpi/collective.hpp: MPI's environment (and the transfers a failure
// left behind, released before MPI_Finalize), the agreement, and gathering rows, over the channel.
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "mpi/channel.hpp"
#include "qkv/mpi/collective.hpp"
#include "qkv/mpi/error.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {

std::chrono::milliseconds default_timeout() {
    const char* text = std::getenv("QKV_MPI_TIMEOUT");
    if (text == nullptr || *text == '\0') return std::chrono::milliseconds(120000);
    char* end = nullptr;
    errno = 0;
    const double s = std::strtod(text, &end);
    if (end == text || *end != '\0' || errno != 0 || !std::isfinite(s) || s <= 0 || s > 1e9)
        throw qkv::invalid_argument(std::string("QKV_MPI_TIMEOUT is '") + text +
                                    "': it must be a positive number of seconds (e.g. 120 or 0.5)");
    return std::chrono::milliseconds(std::max<long long>(1, static_cast<long long>(std::llround(s * 1000.0))));
}

environment::environment(int& argc, char**& argv) {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw error("qkv::mpi::environment: MPI has been finalised already; it cannot start again");
    if (!initialised) {
        detail::check_mpi(MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &level_), "MPI_Init_thread");
        owns_ = true;
    }
    start();
}

environment::environment() {
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (finalised) throw error("qkv::mpi::environment: MPI has been finalised already; it cannot start again");
    if (!initialised) {
        detail::check_mpi(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &level_), "MPI_Init_thread");
        owns_ = true;
    }
    start();
}

void environment::start() {
    if (!owns_) {
        detail::check_mpi(MPI_Query_thread(&level_), "MPI_Query_thread");
        return;
    }
    // Made now, while every rank is in step: after a timeout a new communicator could not be.
    detail::check_mpi(MPI_Comm_dup(MPI_COMM_WORLD, &world_), "MPI_Comm_dup");
}

bool timed_out() { return detail::out_of_step(); }

namespace {

/// Whether every rank of `world` enters the barrier within `grace`.
bool all_arrive(MPI_Comm world, std::chrono::milliseconds grace) {
    MPI_Request barrier = MPI_REQUEST_NULL;
    if (world == MPI_COMM_NULL || MPI_Ibarrier(world, &barrier) != MPI_SUCCESS) return false;
    const auto deadline = std::chrono::steady_clock::now() + grace;
    for (;;) {
        int flag = 0;
        if (MPI_Test(&barrier, &flag, MPI_STATUS_IGNORE) != MPI_SUCCESS) return false;
        if (flag) return true;
        if (std::chrono::steady_clock::now() > deadline) return false;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
}

}  // namespace

environment::~environment() {
    if (!owns_) return;
    // After a timeout a rank may never reach MPI_Finalize, which waits for every rank: unless all
    // arrive within the grace, end the whole job instead, so that no rank waits forever.
    if (detail::out_of_step() && !all_arrive(world_, grace_)) MPI_Abort(MPI_COMM_WORLD, 1);
    detail::finalize_mpi();
}

void agree(MPI_Comm comm, std::exception_ptr local, const comm_options& options) {
    detail::channel ch(comm, options, "qkv::mpi::agree");
    ch.agree(std::move(local), 0, "agree");
}

std::vector<float> gather_rows(MPI_Comm comm, std::span<const float> local, std::size_t outer, std::size_t length,
                               std::size_t width, layout how, int root, const comm_options& options) {
    detail::channel ch(comm, options, "qkv::mpi::gather_rows");
    const int ranks = ch.size();
    detail::fingerprint fp;
    for (const std::size_t v : {outer, length, width}) fp.add_value(v);
    fp.add_value(how);
    fp.add_value(root);
    std::exception_ptr failure;
    std::vector<sequence_slice> slices;
    try {
        if (root < 0 || root >= ranks)
            throw qkv::invalid_argument("gather_rows: root " + std::to_string(root) + " is not a rank of the " +
                                        std::to_string(ranks) + "-rank communicator");
        for (int p = 0; p < ranks; ++p) slices.push_back(slice_of(length, ranks, p, how));
        const std::size_t expect = outer * slices[static_cast<std::size_t>(ch.rank())].rows() * width;
        if (local.size() != expect)
            throw qkv::invalid_argument("gather_rows: this rank holds " + std::to_string(local.size()) +
                                        " elements, expected outer * rows * width = " + std::to_string(expect));
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "checking the slices");

    std::vector<float> whole;
    std::vector<detail::shared_bytes> parts(static_cast<std::size_t>(ranks));
    try {
        std::vector<std::size_t> transfers;
        if (ch.rank() == root) {
            whole.assign(outer * length * width, 0.0f);
            for (int p = 0; p < ranks; ++p) {
                if (p == root) continue;
                const std::size_t n = outer * slices[static_cast<std::size_t>(p)].rows() * width;
                if (n == 0) continue;
                parts[static_cast<std::size_t>(p)] = std::make_shared<detail::bytes>(n * sizeof(float));
                transfers.push_back(ch.post_recv(parts[static_cast<std::size_t>(p)], p, 2, "a slice"));
            }
        } else if (!local.empty()) {
            auto data = std::make_shared<detail::bytes>(local.size() * sizeof(float));
            std::memcpy(data->data(), local.data(), data->size());
            transfers.push_back(ch.post_send(std::move(data), root, 2, "its slice"));
        }
        ch.wait(transfers);
        if (ch.rank() == root) {
            put_rows(local, outer, length, width, slices[static_cast<std::size_t>(root)], std::span<float>(whole));
            for (int p = 0; p < ranks; ++p) {
                const auto& part = parts[static_cast<std::size_t>(p)];
                if (!part) continue;
                std::vector<float> values(part->size() / sizeof(float));
                std::memcpy(values.data(), part->data(), part->size());
                put_rows(std::span<const float>(values), outer, length, width, slices[static_cast<std::size_t>(p)],
                         std::span<float>(whole));
            }
        }
    } catch (...) {
        failure = std::current_exception();
    }
    ch.agree(failure, fp.value(), "gathering");
    return whole;
}

}  // namespace qkv::mpi
