// qkv::mpi's transport: the channel (transfers under a deadline, failure notices, agreements) and
// the transfers a failure leaves behind. A failure travels as failure.hpp encodes it; the
// collective calls over the channel are collective.cpp's.
#include "mpi/channel.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <utility>

#include "qkv/mpi/error.hpp"
#include "qkv/mpi/sdpa.hpp"
#include "qkv/runtime/error.hpp"

namespace qkv::mpi {
namespace detail {
namespace {

constexpr int tag_notice = 1;
constexpr std::size_t piece_bytes = std::size_t{1} << 30;  // MPI counts are int: messages in pieces
constexpr auto poll_interval = std::chrono::microseconds(100);

// ---- transfers left behind by a failure ------------------------------------------------------
// A send whose receiver stopped cannot always be cancelled: its request and its buffer are parked
// here until it completes (tested whenever a channel is made) or MPI is finalised by
// qkv::mpi::environment.

struct parked {
    std::vector<MPI_Request> requests;
    shared_bytes data;
    bool collective = false;  // MPI_Request_free may not release a non-blocking collective's request
};

std::mutex& graveyard_mutex() {
    static std::mutex m;
    return m;
}
std::vector<parked>& graveyard() {
    static std::vector<parked> g;
    return g;
}

void park(std::vector<MPI_Request> requests, shared_bytes data, bool collective = false) {
    const std::lock_guard lock(graveyard_mutex());
    graveyard().push_back({std::move(requests), std::move(data), collective});
}

void purge_graveyard() {
    const std::lock_guard lock(graveyard_mutex());
    auto& g = graveyard();
    std::erase_if(g, [](parked& p) {
        int flag = 0;
        MPI_Testall(static_cast<int>(p.requests.size()), p.requests.data(), &flag, MPI_STATUSES_IGNORE);
        return flag != 0;
    });
}

failure_record record_of(const std::vector<std::byte>& notice) {
    failure_record r;
    std::memcpy(&r, notice.data(), std::min(notice.size(), sizeof r));
    return r;
}

double seconds(std::chrono::milliseconds ms) { return static_cast<double>(ms.count()) / 1000.0; }

std::string seconds_text(std::chrono::milliseconds ms) {
    char text[32];
    std::snprintf(text, sizeof text, "%g s", seconds(ms));
    return text;
}

}  // namespace

void finalize_mpi() {
    // Transfers a failure left behind: a point-to-point request is released (MPI finishes or drops
    // it); an agreement another rank never joined is given a moment, then left to MPI_Finalize.
    // Their buffers outlive MPI (`keep` lives until after MPI_Finalize: MPI may still write them).
    std::vector<parked> keep;
    {
        const std::lock_guard lock(graveyard_mutex());
        keep.swap(graveyard());
    }
    const auto until = clock::now() + std::chrono::seconds(1);
    for (parked& p : keep) {
        int flag = 0;
        while (p.collective && !flag && clock::now() < until) {
            MPI_Testall(static_cast<int>(p.requests.size()), p.requests.data(), &flag, MPI_STATUSES_IGNORE);
            if (!flag) std::this_thread::sleep_for(poll_interval);
        }
        if (!p.collective)
            for (MPI_Request& r : p.requests)
                if (r != MPI_REQUEST_NULL) MPI_Request_free(&r);
    }
    MPI_Finalize();
}

void check_mpi(int rc, const char* call) {
    if (rc == MPI_SUCCESS) return;
    char text[MPI_MAX_ERROR_STRING] = {};
    int n = 0;
    MPI_Error_string(rc, text, &n);
    throw qkv::mpi::error(std::string(call) + " failed: " + std::string(text, static_cast<std::size_t>(n)));
}

void fingerprint::add(const void* data, std::size_t n) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (std::size_t i = 0; i < n; ++i) {
        h_ ^= p[i];
        h_ *= 1099511628211ull;
    }
}

std::string rank_prefix(int rank, int size) {
    return "rank " + std::to_string(rank) + " of " + std::to_string(size) + ": ";
}

// ---- channel ---------------------------------------------------------------------------------

channel::channel(MPI_Comm user, const comm_options& options, std::string operation)
    : options_(options), operation_(std::move(operation)) {
    if (options_.timeout.count() <= 0)
        throw qkv::invalid_argument(operation_ + ": comm_options::timeout must be positive (it is " +
                                    std::to_string(options_.timeout.count()) + " ms)");
    int initialised = 0, finalised = 0;
    MPI_Initialized(&initialised);
    MPI_Finalized(&finalised);
    if (!initialised || finalised)
        throw qkv::mpi::error(operation_ +
                              ": MPI is not running (initialise it first, e.g. with qkv::mpi::environment)");
    purge_graveyard();
    check_mpi(MPI_Comm_rank(user, &rank_), "MPI_Comm_rank");
    check_mpi(MPI_Comm_size(user, &size_), "MPI_Comm_size");
    MPI_Request dup = MPI_REQUEST_NULL;
    check_mpi(MPI_Comm_idup(user, &comm_, &dup), "MPI_Comm_idup");
    const auto start = clock::now(), deadline = start + options_.timeout;
    for (;;) {
        int flag = 0;
        check_mpi(MPI_Test(&dup, &flag, MPI_STATUS_IGNORE), "MPI_Test");
        if (flag) break;
        if (clock::now() > deadline)
            throw_timeout(rank_prefix(rank_, size_) + "timed out after " + seconds_text(options_.timeout) + " in " +
                          operation_ +
                          ": not every rank of the communicator started it (each rank must make the "
                          "same collective calls in the same order)");
        std::this_thread::sleep_for(poll_interval);
    }
    agreement_ms_ += ms_between(start, clock::now());  // every rank arriving: a synchronisation too
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
}

channel::~channel() {
    try {
        abandon_pending();
        for (auto& [request, data] : notice_sends_) {
            if (request == MPI_REQUEST_NULL) continue;
            int flag = 0;
            MPI_Test(&request, &flag, MPI_STATUS_IGNORE);
            if (!flag) park({request}, data);
        }
    } catch (...) {  // nothing may escape a destructor; parked transfers are MPI's to finish
    }
    if (comm_ != MPI_COMM_NULL && !poisoned_) MPI_Comm_free(&comm_);
}

std::size_t channel::post_send(shared_bytes data, int peer, int tag, std::string what) {
    const std::size_t posted = post(std::move(data), peer, tag, std::move(what), true);
    sent_ += transfers_.back().data->size();
    return posted;
}

std::size_t channel::post_recv(shared_bytes data, int peer, int tag, std::string what) {
    return post(std::move(data), peer, tag, std::move(what), false);
}

std::size_t channel::post(shared_bytes data, int peer, int tag, std::string what, bool send) {
    transfer t{.requests = {}, .data = std::move(data), .peer = peer, .send = send, .what = std::move(what)};
    for (std::size_t at = 0; at < t.data->size(); at += piece_bytes) {
        const int n = static_cast<int>(std::min(piece_bytes, t.data->size() - at));
        MPI_Request r = MPI_REQUEST_NULL;
        if (send)
            check_mpi(MPI_Isend(t.data->data() + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Isend");
        else
            check_mpi(MPI_Irecv(t.data->data() + at, n, MPI_BYTE, peer, tag, comm_, &r), "MPI_Irecv");
        t.requests.push_back(r);
    }
    t.posted = clock::now();
    transfers_.push_back(std::move(t));
    return transfers_.size() - 1;
}

bool channel::done(std::size_t which) const { return transfers_.at(which).finished; }

void channel::poll(std::span<const std::size_t> which, bool& all_done) {
    all_done = true;
    for (const std::size_t i : which) {
        transfer& t = transfers_.at(i);
        if (t.finished) continue;
        int flag = 0;
        check_mpi(MPI_Testall(static_cast<int>(t.requests.size()), t.requests.data(), &flag, MPI_STATUSES_IGNORE),
                  "MPI_Testall");
        if (flag) {
            t.finished = true;
            t.done = clock::now();
            if (!t.send) received_ += t.data->size();
        } else {
            all_done = false;
        }
    }
}

void channel::poll_others() {
    for (std::size_t i = 0; i < transfers_.size(); ++i) {
        if (transfers_[i].finished) continue;
        bool done = false;
        const std::size_t one[] = {i};
        poll(one, done);
    }
}

namespace {

using span_list = std::vector<std::pair<clock::time_point, clock::time_point>>;

/// The union of `spans`, as disjoint sorted intervals.
span_list merged(span_list spans) {
    std::sort(spans.begin(), spans.end());
    span_list out;
    for (const auto& s : spans) {
        if (!out.empty() && s.first <= out.back().second)
            out.back().second = std::max(out.back().second, s.second);
        else
            out.push_back(s);
    }
    return out;
}

double length_ms(const span_list& spans) {
    double total = 0;
    for (const auto& [a, b] : spans) total += ms_between(a, b);
    return total;
}

}  // namespace

double channel::comm_ms() const {
    span_list in_flight;
    for (const transfer& t : transfers_)
        if (!t.requests.empty() && t.done > t.posted) in_flight.emplace_back(t.posted, t.done);
    return length_ms(merged(std::move(in_flight)));
}

double channel::exposed_ms() const {
    // The in-flight time not covered by work.
    span_list in_flight;
    for (const transfer& t : transfers_)
        if (!t.requests.empty() && t.done > t.posted) in_flight.emplace_back(t.posted, t.done);
    const span_list comm = merged(std::move(in_flight)), work = merged(work_spans_);
    double covered = 0;
    for (const auto& [a, b] : comm)
        for (const auto& [c, d] : work) {
            const auto from = std::max(a, c), to = std::min(b, d);
            if (from < to) covered += ms_between(from, to);
        }
    return length_ms(comm) - covered;
}

void channel::check_notices() {
    // A notice the last agreement kept for this stage (its sender had left that agreement first).
    for (const auto& [p, notice] : notices_)
        if (record_of(notice).stage >= stage_) {
            poisoned_ = true;
            throw peer_failed(p);
        }
    int flag = 0;
    MPI_Status status;
    check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag_notice, comm_, &flag, &status), "MPI_Iprobe");
    if (!flag) return;
    std::vector<std::byte> r(sizeof(failure_record));
    check_mpi(
        MPI_Recv(r.data(), sizeof(failure_record), MPI_BYTE, status.MPI_SOURCE, tag_notice, comm_, MPI_STATUS_IGNORE),
        "MPI_Recv");
    notices_[status.MPI_SOURCE] = std::move(r);
    poisoned_ = true;
    throw peer_failed(status.MPI_SOURCE);
}

void channel::notify(const std::exception_ptr& failure) {
    if (notified_) return;
    notified_ = true;
    const failure_record r = make_record(failure, 0, true, stage_);
    for (int p = 0; p < size_; ++p) {
        if (p == rank_) continue;
        auto data = std::make_shared<bytes>(sizeof r);
        std::memcpy(data->data(), &r, sizeof r);
        MPI_Request request = MPI_REQUEST_NULL;
        check_mpi(MPI_Isend(data->data(), static_cast<int>(data->size()), MPI_BYTE, p, tag_notice, comm_, &request),
                  "MPI_Isend");
        notice_sends_.emplace_back(request, std::move(data));
    }
}

void channel::time_out(std::span<const std::size_t> which, const std::string& during) {
    poisoned_ = true;
    std::string pending;
    for (const std::size_t i : which) {
        const transfer& t = transfers_.at(i);
        if (t.finished) continue;
        if (!pending.empty()) pending += "; ";
        pending += t.what + (t.send ? " to rank " : " from rank ") + std::to_string(t.peer);
    }
    throw_timeout(rank_prefix(rank_, size_) + "timed out after " + seconds_text(options_.timeout) + " in " +
                  operation_ + " (" + during + ") waiting for: " + pending +
                  " (QKV_MPI_TIMEOUT or comm_options::timeout sets the limit)");
}

void channel::wait(std::span<const std::size_t> which, const std::function<void()>& work) {
    const auto start = clock::now();
    std::future<void> running;
    if (work) running = std::async(std::launch::async, work);
    bool busy = running.valid(), all_done = false;
    auto deadline = busy ? clock::time_point::max() : start + options_.timeout;
    for (;;) {
        if (!all_done) poll(which, all_done);
        poll_others();
        const auto now = clock::now();
        if (busy && running.wait_for(std::chrono::seconds(0)) == std::future_status::ready) {
            busy = false;
            compute_ms_ += ms_between(start, now);
            work_spans_.emplace_back(start, now);
            deadline = now + options_.timeout;
            running.get();  // the work's exception, if it failed
        }
        if (!busy && all_done) break;
        check_notices();
        if (!busy && now > deadline) time_out(which, work ? "after computing its part" : "communicating");
        if (busy)
            running.wait_for(poll_interval);
        else
            std::this_thread::sleep_for(poll_interval);
    }
}

void channel::wait_requests(std::vector<MPI_Request>& requests, const std::string& during) {
    const auto deadline = clock::now() + options_.timeout;
    for (;;) {
        int flag = 0;
        check_mpi(MPI_Testall(static_cast<int>(requests.size()), requests.data(), &flag, MPI_STATUSES_IGNORE),
                  "MPI_Testall");
        if (flag) return;
        if (clock::now() > deadline) {
            poisoned_ = true;
            throw_timeout(rank_prefix(rank_, size_) + "timed out after " + seconds_text(options_.timeout) + " in " +
                          operation_ + " (" + during + "): a rank did not arrive (it may have died or hung)");
        }
        std::this_thread::sleep_for(poll_interval);
    }
}

void channel::abandon_pending() {
    for (transfer& t : transfers_) {
        if (t.finished) continue;
        poisoned_ = true;
        t.finished = true;
        for (MPI_Request& r : t.requests)
            if (r != MPI_REQUEST_NULL) MPI_Cancel(&r);
        // A cancelled receive completes at once; a send may not cancel (its receiver stopped):
        // give it a moment, then park it with its buffer.
        const auto until = clock::now() + std::chrono::milliseconds(t.send ? 5 : 1000);
        int flag = 0;
        while (!flag && clock::now() < until) {
            MPI_Testall(static_cast<int>(t.requests.size()), t.requests.data(), &flag, MPI_STATUSES_IGNORE);
            if (!flag) std::this_thread::sleep_for(poll_interval);
        }
        if (!flag) park(std::move(t.requests), t.data);
    }
}

void channel::agree(std::exception_ptr local, std::uint64_t fp, const std::string& stage) {
    const auto start = clock::now();
    bool origin = false;
    if (local) {
        try {
            std::rethrow_exception(local);
        } catch (const peer_failed&) {
        } catch (...) {
            origin = true;
        }
    }
    if (origin) notify(local);  // the others stop waiting on this rank
    // [this rank's record][every rank's record], kept alive with the request should this rank give
    // up before the others arrive.
    const auto records = std::make_shared<bytes>(sizeof(failure_record) * (static_cast<std::size_t>(size_) + 1));
    const failure_record mine = make_record(local, fp, notified_, stage_);
    std::memcpy(records->data(), &mine, sizeof mine);
    std::vector<MPI_Request> gather(1, MPI_REQUEST_NULL);
    check_mpi(
        MPI_Iallgather(records->data(), sizeof(failure_record), MPI_BYTE, records->data() + sizeof(failure_record),
                       sizeof(failure_record), MPI_BYTE, comm_, gather.data()),
        "MPI_Iallgather");
    try {
        wait_requests(gather, stage + ": agreeing on the outcome");
    } catch (const qkv::mpi::timeout&) {
        // Giving up: tell the late ranks, so that when they arrive they fail too, not succeed.
        poisoned_ = true;
        park(gather, records, true);
        notify(std::current_exception());
        throw;
    }
    std::vector<failure_record> all(static_cast<std::size_t>(size_));
    std::memcpy(all.data(), records->data() + sizeof(failure_record), all.size() * sizeof(failure_record));
    // Every failure notice sent is received, so that nothing is left in flight; and any other that
    // came: from a rank that gave up waiting for this agreement after contributing its record, or
    // from one that ended it before this rank and has failed in the next stage already (kept for
    // that stage: the others meet this rank in its closing agreement).
    std::vector<MPI_Request> drain;
    std::vector<std::pair<int, shared_bytes>> drained;  // by sender; MPI's until the receive is done
    for (int p = 0; p < size_; ++p) {
        if (p == rank_ || !all[static_cast<std::size_t>(p)].notified || notices_.count(p)) continue;
        drained.emplace_back(p, std::make_shared<bytes>(sizeof(failure_record)));
        drain.push_back(MPI_REQUEST_NULL);
        check_mpi(MPI_Irecv(drained.back().second->data(), sizeof(failure_record), MPI_BYTE, p, tag_notice, comm_,
                            &drain.back()),
                  "MPI_Irecv");
    }
    if (!drain.empty()) {
        try {
            wait_requests(drain, stage + ": receiving failure notices");
        } catch (const qkv::mpi::timeout&) {  // the receives are cancelled and parked with their buffers
            for (std::size_t i = 0; i < drain.size(); ++i) {
                if (drain[i] == MPI_REQUEST_NULL) continue;
                MPI_Cancel(&drain[i]);
                park({drain[i]}, drained[i].second);
            }
            throw;
        }
        for (auto& [p, notice] : drained) notices_[p] = std::move(*notice);
    }
    for (;;) {
        int flag = 0;
        MPI_Status status;
        check_mpi(MPI_Iprobe(MPI_ANY_SOURCE, tag_notice, comm_, &flag, &status), "MPI_Iprobe");
        if (!flag) break;
        std::vector<std::byte> r(sizeof(failure_record));
        check_mpi(MPI_Recv(r.data(), sizeof(failure_record), MPI_BYTE, status.MPI_SOURCE, tag_notice, comm_,
                           MPI_STATUS_IGNORE),
                  "MPI_Recv");
        notices_.emplace(status.MPI_SOURCE, std::move(r));
    }
    if (!notice_sends_.empty()) {
        std::vector<MPI_Request> sends;
        for (auto& [request, data] : notice_sends_) sends.push_back(request);
        wait_requests(sends, stage + ": delivering this rank's failure notice");
        notice_sends_.clear();
    }
    agreement_ms_ += ms_between(start, clock::now());

    // A rank whose record shows no failure but that sent a notice in this stage (or before) gave up
    // after contributing it; a notice of the next stage is that stage's.
    const failure_record* late = nullptr;
    int late_rank = -1;
    failure_record late_record;
    for (const auto& [p, notice] : notices_) {
        if (!all[static_cast<std::size_t>(p)].succeeded()) continue;
        late_record = record_of(notice);
        if (late_record.stage > stage_) continue;
        late = &late_record;
        late_rank = p;
        break;  // the lowest such rank (the map is ordered)
    }
    ++stage_;
    bool failed = late != nullptr;
    for (const failure_record& r : all) failed = failed || r.what != failure_ok;
    if (failed) {
        poisoned_ = true;  // another rank may still be sending what this one no longer waits for
        abandon_pending();
    }
    for (int p = 0; p < size_; ++p) {
        const failure_record& r = all[static_cast<std::size_t>(p)];
        if (r.succeeded()) continue;
        rethrow(r.what, rank_prefix(p, size_) + r.text());
    }
    if (late) {
        const std::string text = late->text();  // a timeout's message names its rank already
        rethrow(late->what, text.rfind("rank ", 0) == 0 ? text : rank_prefix(late_rank, size_) + text);
    }
    for (int p = 0; p < size_; ++p)
        if (all[static_cast<std::size_t>(p)].what == failure_stopped)
            throw qkv::mpi::error(rank_prefix(p, size_) + operation_ + " stopped, yet no rank reports a failure");
    for (int p = 1; p < size_; ++p)
        if (all[static_cast<std::size_t>(p)].fingerprint != all[0].fingerprint)
            throw qkv::invalid_argument(rank_prefix(p, size_) + "its " + operation_ +
                                        " call differs from rank 0's (shapes, options, masks, sinks, the whole inputs' "
                                        "checksum or layout): every rank must describe the same problem");
}

}  // namespace detail

}  // namespace qkv::mpi
