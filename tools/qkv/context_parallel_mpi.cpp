// `qkv sdpa --context-parallel` and `qkv bench --context-parallel` over qkv::mpi (built when MPI
// is found). Every rank runs the same command; every step's outcome is agreed across the ranks
// (qkv::mpi::agree), so a failure anywhere ends every rank with the same exception and exit
// status, never a hang (every wait has a deadline: --mpi-timeout).
#include <mpi.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "context_parallel.hpp"
#include "errors.hpp"
#include "option_flags.hpp"
#include "output_files.hpp"
#include "qkv/mpi/mpi.hpp"
#include "qkv/mpi/vulkan.hpp"
#include "qkv/runtime/cpu.hpp"
#include "qkv/runtime/sdpa.hpp"
#include "qkv/version.hpp"
#include "qkv/vulkan/context.hpp"
#include "qkv/vulkan/error.hpp"

namespace qkv::cli {
namespace {

/// The flags as qkv::mpi's options (each bad value a usage_error naming its flag).
qkv::mpi::cp_options parse_flags(const context_parallel_flags& f) {
    qkv::mpi::cp_options o;
    if (f.mode.empty() || f.mode == "ring")
        o.mode = qkv::mpi::cp_mode::ring;
    else if (f.mode == "allgather")
        o.mode = qkv::mpi::cp_mode::allgather;
    else
        throw usage_error("--context-parallel: '" + f.mode + "' is not ring or allgather");
    if (f.slicing == "zigzag")
        o.slicing = qkv::mpi::layout::zigzag;
    else if (f.slicing == "contiguous")
        o.slicing = qkv::mpi::layout::contiguous;
    else
        throw usage_error("--cp-slicing: '" + f.slicing + "' is not zigzag or contiguous");
    if (f.timeout_option != nullptr && f.timeout_option->count() > 0) {
        char* end = nullptr;
        errno = 0;
        const double s = std::strtod(f.timeout.c_str(), &end);
        if (f.timeout.empty() || *end != '\0' || errno != 0 || !std::isfinite(s) || s <= 0 || s > 1e9)
            throw usage_error("--mpi-timeout: '" + f.timeout + "' is not a positive number of seconds");
        o.comm.timeout = std::chrono::milliseconds(std::max<long long>(1, std::llround(s * 1000.0)));
    } else {
        try {
            o.comm.timeout = qkv::mpi::default_timeout();
        } catch (const qkv::invalid_argument& e) {
            throw usage_error(e.what());
        }
    }
    return o;
}

/// A failure as it travels to the other ranks: the tool's usage_error as qkv::invalid_argument
/// (exit status 2 on every rank, as on the rank that failed).
std::exception_ptr travelling(std::exception_ptr failure) {
    if (!failure) return failure;
    try {
        std::rethrow_exception(failure);
    } catch (const usage_error& e) {
        return std::make_exception_ptr(qkv::invalid_argument(e.what()));
    } catch (...) {
        return failure;
    }
}

int world_rank() {
    int r = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &r);
    return r;
}
int world_size() {
    int n = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &n);
    return n;
}

/// Runs `step` on every rank. An agreed failure (every rank throws the same) is printed by rank 0
/// alone, before any rank leaves (mpirun ends the job when the first rank exits with an error,
/// which could cut rank 0 short): rank 0 prints, every rank silences its stderr for main()'s
/// report, they meet once more, and then all rethrow, keeping main()'s exit status. A timeout is
/// each rank's own and printed by each (the others may be gone).
template <class Step>
auto agreed(Step&& step) {
    try {
        return step();
    } catch (const qkv::mpi::timeout&) {
        throw;
    } catch (const std::exception& e) {
        if (world_rank() == 0) std::cerr << "qkv: " << e.what() << std::endl;
        std::cerr.setstate(std::ios::badbit);
        try {
            qkv::mpi::agree(MPI_COMM_WORLD, nullptr, {.timeout = std::chrono::seconds(10)});
        } catch (...) {  // the failure above is what is reported
        }
        throw;
    }
}

/// Runs `body` with MPI up. After a timeout qkv::mpi::environment waits --mpi-timeout more for
/// the late ranks, then ends the whole job (MPI_Abort: a frozen rank would never reach
/// MPI_Finalize; mpirun's exit status is then 1), so main() might never print the failure: a rank
/// that timed out prints it here first (a rank whose stderr agreed() silenced prints nothing).
template <class Body>
void with_mpi(const context_parallel_flags& flags, Body&& body) {
    qkv::mpi::environment mpi;
    try {
        mpi.finalize_grace(parse_flags(flags).comm.timeout);
    } catch (...) {  // a bad flag fails in the body, agreed by every rank
    }
    try {
        body();
    } catch (const std::exception& e) {
        if (qkv::mpi::timed_out()) std::cerr << "qkv: " << e.what() << std::endl;
        throw;
    }
}

/// Every rank's outcome of a local step, agreed.
void settle(std::exception_ptr local, const qkv::mpi::comm_options& comm) {
    agreed([&] { qkv::mpi::agree(MPI_COMM_WORLD, travelling(std::move(local)), comm); });
}

std::optional<qkv::vulkan::context> open_device(backend choice, const std::string& device) {
    std::optional<qkv::vulkan::context> ctx;
    if (choice == backend::vulkan) ctx.emplace(open_context(device));
    return ctx;
}

/// This rank's part of the whole problem: its rows of q, k and v; the masks and sinks whole; the
/// whole q, k and v's checksum.
struct rank_part {
    std::vector<float> q, k, v;
    qkv::mpi::cp_problem problem;
};

rank_part take_part(const qkv::sdpa_problem& whole, qkv::mpi::layout how, int ranks, int rank) {
    const qkv::sdpa_shape& s = whole.shape;
    const auto qs = qkv::mpi::slice_of(s.q_len, ranks, rank, how), ks = qkv::mpi::slice_of(s.kv_len, ranks, rank, how);
    rank_part p;
    p.q = qkv::mpi::take_rows<float>(whole.q, s.batch * s.q_heads, s.q_len, s.d_qk, qs);
    p.k = qkv::mpi::take_rows<float>(whole.k, s.batch * s.kv_heads, s.kv_len, s.d_qk, ks);
    p.v = qkv::mpi::take_rows<float>(whole.v, s.batch * s.kv_heads, s.kv_len, s.d_v, ks);
    p.problem = {
        .shape = s,
        .q = p.q,
        .k = p.k,
        .v = p.v,
        .mask = whole.mask,
        .additive_mask = whole.additive_mask,
        .mask_shape = whole.mask_shape,
        .options = whole.options,
        .sinks = whole.sinks,
        // Every rank read (or drew) the whole inputs: their contents are agreed too.
        .inputs_checksum = qkv::mpi::checksum(whole.v, qkv::mpi::checksum(whole.k, qkv::mpi::checksum(whole.q)))};
    return p;
}

void run_sdpa_ranks(const context_parallel_flags& flags, const std::function<context_parallel_job()>& prepare) {
    const int rank = world_rank(), ranks = world_size();

    // 1. On every rank: the flags, the inputs, the device; rank 0 reserves the outputs.
    qkv::mpi::cp_options options;
    std::optional<context_parallel_job> job;
    std::optional<qkv::vulkan::context> gpu;
    output_set files;
    std::exception_ptr failure;
    try {
        options = parse_flags(flags);
        job.emplace(prepare());
        if (job->options.return_weights)
            throw usage_error(
                "--weights is not available with --context-parallel: each row's weights span every rank; write "
                "--lse instead");
        gpu = open_device(job->choice, job->device);
        if (rank == 0) files.reserve({job->out, job->lse});  // an output that cannot be created fails now
    } catch (...) {
        failure = std::current_exception();
    }
    settle(failure, options.comm);

    // 2. Each rank its slice; 3. the whole, gathered on rank 0.
    const qkv::sdpa_problem whole = job->inputs.problem(job->options);
    const qkv::sdpa_shape& s = whole.shape;
    const rank_part part = take_part(whole, options.slicing, ranks, rank);
    qkv::mpi::cpu_backend cpu;
    std::optional<qkv::mpi::vulkan_backend> device;
    if (gpu) device.emplace(*gpu);
    qkv::mpi::backend& compute = device ? static_cast<qkv::mpi::backend&>(*device) : cpu;
    const qkv::mpi::cp_output o =
        agreed([&] { return qkv::mpi::sdpa(MPI_COMM_WORLD, compute, part.problem, options); });
    const std::vector<float> out = agreed([&] {
        return qkv::mpi::gather_rows(MPI_COMM_WORLD, o.output, s.batch * s.q_heads, s.q_len, s.d_v, options.slicing, 0,
                                     options.comm);
    });
    const std::vector<float> lse = job->lse.empty() ? std::vector<float>{} : agreed([&] {
        return qkv::mpi::gather_rows(MPI_COMM_WORLD, o.lse, s.batch * s.q_heads, s.q_len, 1, options.slicing, 0,
                                     options.comm);
    });

    // 4. Rank 0 writes, all or nothing; every rank learns how that went.
    try {
        if (rank == 0) {
            std::vector<std::size_t> out_shape = job->inputs.out_shape(), lse_shape = out_shape;
            lse_shape.pop_back();
            files.commit({{job->out, out_shape, std::span<const float>(out)},
                          {job->lse, lse_shape, std::span<const float>(lse)}});
        }
    } catch (...) {
        failure = std::current_exception();
    }
    settle(failure, options.comm);
}

}  // namespace

void run_sdpa_context_parallel(const context_parallel_flags& flags,
                               const std::function<context_parallel_job()>& prepare) {
    with_mpi(flags, [&] { run_sdpa_ranks(flags, prepare); });
}

// ---- qkv bench --context-parallel ---------------------------------------------------------------

namespace {

double median(std::vector<double> v) {
    if (v.empty()) return 0;
    std::sort(v.begin(), v.end());
    const std::size_t n = v.size();
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::string fixed(double value, int decimals) {
    char text[64];
    std::snprintf(text, sizeof text, "%.*f", decimals, value);
    return text;
}

void run_bench_ranks(const context_parallel_flags& flags, const context_parallel_bench& b) {
    const int rank = world_rank(), ranks = world_size();
    qkv::mpi::cp_options options;
    std::optional<qkv::vulkan::context> gpu;
    output_set json_out;  // rank 0's --json: renamed into place only when the whole run succeeded
    std::exception_ptr failure;
    const std::size_t kv_seq = b.kv_seq ? b.kv_seq : b.seq;
    const qkv::sdpa_shape s{.batch = b.batch,
                            .q_heads = b.heads,
                            .kv_heads = b.kv_heads,
                            .q_len = b.seq,
                            .kv_len = kv_seq,
                            .d_qk = b.dim,
                            .d_v = b.dim};
    try {
        options = parse_flags(flags);
        if (b.heads % b.kv_heads != 0)
            throw usage_error("--kv-heads " + std::to_string(b.kv_heads) + " must divide --heads " +
                              std::to_string(b.heads));
        qkv::validate_description({.shape = s, .options = b.options});  // before any timing
        gpu = open_device(b.choice, b.device);
        if (rank == 0 && !b.json_file.empty()) {
            const named_file out{"--json", b.json_file};
            check_output_paths({&out, 1}, {});
            json_out.reserve({b.json_file});
        }
    } catch (...) {
        failure = std::current_exception();
    }
    settle(failure, options.comm);

    // The same inputs on every rank (one seed), each rank its slice.
    std::mt19937_64 rng(b.seed);
    std::normal_distribution<double> n01(0.0, 1.0);
    const auto draw = [&](std::size_t n) {
        std::vector<float> x(n);
        for (float& e : x) e = static_cast<float>(n01(rng));
        return x;
    };
    const std::vector<float> q = draw(s.batch * s.q_heads * s.q_len * s.d_qk),
                             k = draw(s.batch * s.kv_heads * s.kv_len * s.d_qk),
                             v = draw(s.batch * s.kv_heads * s.kv_len * s.d_v);
    qkv::sdpa_problem whole{.shape = s, .q = q, .k = k, .v = v, .options = b.options};
    const rank_part part = take_part(whole, options.slicing, ranks, rank);
    qkv::mpi::cpu_backend cpu;
    std::optional<qkv::mpi::vulkan_backend> device;
    if (gpu) device.emplace(*gpu);
    qkv::mpi::backend& compute = device ? static_cast<qkv::mpi::backend&>(*device) : cpu;

    // The whole call on rank 0 alone (the others wait), for comparison.
    double single_ms = 0;
    try {
        if (rank == 0) {
            std::vector<double> t;
            for (int i = 0; i < b.warmup + b.repeat; ++i) {
                const auto start = std::chrono::steady_clock::now();
                (void)(gpu ? gpu->sdpa(whole) : qkv::cpu::sdpa(whole));
                if (i >= b.warmup)
                    t.push_back(
                        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count());
            }
            single_ms = median(t);
        }
    } catch (...) {
        failure = std::current_exception();
    }
    settle(failure, options.comm);

    // The context-parallel calls; each metric's median over the timed ones.
    std::vector<qkv::mpi::cp_stats> runs;
    for (int i = 0; i < b.warmup + b.repeat; ++i) {
        const qkv::mpi::cp_output o =
            agreed([&] { return qkv::mpi::sdpa(MPI_COMM_WORLD, compute, part.problem, options); });
        if (i >= b.warmup) runs.push_back(o.stats);
    }
    qkv::mpi::cp_stats mine = runs.front();
    const auto med = [&](double qkv::mpi::cp_stats::*field) {
        std::vector<double> values;
        for (const auto& r : runs) values.push_back(r.*field);
        return median(values);
    };
    mine.compute_ms = med(&qkv::mpi::cp_stats::compute_ms);
    mine.comm_ms = med(&qkv::mpi::cp_stats::comm_ms);
    mine.exposed_ms = med(&qkv::mpi::cp_stats::exposed_ms);
    mine.agreement_ms = med(&qkv::mpi::cp_stats::agreement_ms);
    mine.total_ms = med(&qkv::mpi::cp_stats::total_ms);
    const std::vector<qkv::mpi::cp_stats> all =
        agreed([&] { return qkv::mpi::gather_stats(MPI_COMM_WORLD, mine, 0, options.comm); });

    try {
        if (rank == 0) {
            const std::string who = compute.name();
            const std::string changed = options_label(b.options);
            const std::string label = changed.empty() ? std::string("defaults") : changed;
            std::cout << "qkv " << qkv::version_string << " bench --context-parallel "
                      << qkv::mpi::to_string(options.mode) << ": " << ranks << " ranks, "
                      << qkv::mpi::to_string(options.slicing) << " slices, " << who << "\n"
                      << "B " << s.batch << ", Hq " << s.q_heads << ", Hkv " << s.kv_heads << ", L " << s.q_len
                      << ", S " << s.kv_len << ", d " << s.d_qk << ", options: " << label << "; medians of " << b.repeat
                      << " calls after " << b.warmup << " warm-up\n"
                      << "The whole call on rank 0 alone: " << fixed(single_ms, 2) << " ms\n\n"
                      << "rank  total ms  compute ms  comm ms  exposed ms  overlap  agree ms   sent MiB  recv MiB  "
                         "blocks  skipped\n";
            nlohmann::ordered_json j;
            j["qkv"] = qkv::version_string;
            j["mode"] = qkv::mpi::to_string(options.mode);
            j["slicing"] = qkv::mpi::to_string(options.slicing);
            j["ranks"] = ranks;
            j["device"] = who;
            j["shape"] = {{"batch", s.batch}, {"q_heads", s.q_heads}, {"kv_heads", s.kv_heads},
                          {"q_len", s.q_len}, {"kv_len", s.kv_len},   {"d", s.d_qk}};
            j["options"] = options_json(b.options);
            j["single_process_ms"] = single_ms;
            for (const qkv::mpi::cp_stats& r : all) {
                char line[256];
                std::snprintf(line, sizeof line,
                              "%4d  %8.2f  %10.2f  %7.2f  %10.2f  %6.1f%%  %8.2f  %9.3f  %8.3f  %6zu  %7zu\n", r.rank,
                              r.total_ms, r.compute_ms, r.comm_ms, r.exposed_ms, 100.0 * r.overlap(), r.agreement_ms,
                              static_cast<double>(r.bytes_sent) / 1048576.0,
                              static_cast<double>(r.bytes_received) / 1048576.0, r.blocks_computed, r.blocks_skipped);
                std::cout << line;
                j["per_rank"].push_back({{"rank", r.rank},
                                         {"total_ms", r.total_ms},
                                         {"compute_ms", r.compute_ms},
                                         {"comm_ms", r.comm_ms},
                                         {"exposed_ms", r.exposed_ms},
                                         {"overlap", r.overlap()},
                                         {"agreement_ms", r.agreement_ms},
                                         {"bytes_sent", r.bytes_sent},
                                         {"bytes_received", r.bytes_received},
                                         {"blocks_computed", r.blocks_computed},
                                         {"blocks_skipped", r.blocks_skipped},
                                         {"steps", r.steps}});
            }
            std::cout << "\ncompute: the backend's partial calls and the merges (worker thread); comm: while this "
                         "rank's transfers were in flight; exposed: waiting with nothing left to compute; overlap = "
                         "1 - exposed / comm\n";
            if (!b.json_file.empty()) {
                const std::string text = j.dump(2) + "\n";
                json_out.commit({{b.json_file, {}, std::string_view(text)}});
            }
        }
    } catch (...) {
        failure = std::current_exception();
    }
    settle(failure, options.comm);
}

}  // namespace

void run_bench_context_parallel(const context_parallel_flags& flags, const context_parallel_bench& b) {
    with_mpi(flags, [&] { run_bench_ranks(flags, b); });
}

}  // namespace qkv::cli
