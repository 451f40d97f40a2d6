// The plan's per-device choices (src/plan/attention_plan.cpp, src/kernels/gemm_tiles.cpp), pure functions of a device
// description, against the fake devices of support/fake_devices.hpp: discrete GPUs with subgroups of
// 32 and 64, an integrated GPU, a CPU implementation like lavapipe, and the smallest device the Vulkan
// spec allows. No Vulkan device needed, so the GPU choices run in CI too.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "plan/attention_plan.hpp"
#include "plan/settings.hpp"
#include "qkv/vulkan/error.hpp"
#include "support/catch.hpp"
#include "support/fake_devices.hpp"

using qkv::kernel_family;
using qkv::vulkan::device_info;
using qkv::vulkan::device_type;
using namespace qkv::vulkan::detail;

namespace {

using fake = qkv::test::fake_device;
using qkv::test::fake_devices;

qkv::attention_problem problem(std::size_t batch, std::size_t seq, std::size_t d_in, std::size_t d, std::size_t heads,
                               std::size_t d_out, qkv::implementation impl) {
    qkv::attention_problem p;
    p.shape.batch = batch;
    p.shape.seq = seq;
    p.shape.d_in = d_in;
    p.shape.d_k = p.shape.d_v = d;
    p.shape.heads = heads;
    p.shape.d_out = d_out;
    p.options.implementation = impl;
    return p;
}

device_facts facts_for(const fake& f, std::uint32_t cpu_chunk_keys, family_refusal refusal = {}) {
    device_facts facts;
    facts.subgroups = f.control;
    facts.cpu_chunk_keys = cpu_chunk_keys;
    facts.cpu_refusal = refusal;
    return facts;
}

plan plan_for(const fake& f, const qkv::attention_problem& pr, const device_facts& facts,
              kernel_family asked = kernel_family::automatic) {
    plan p = make_plan(pr, f.info, 256);
    choose_kernels(p, f.info, facts, asked);
    return p;
}

/// A product's tiles fit the device, and on a CPU device every dispatch's loops stay under the limit.
void check_step(const fake& f, const gemm_step& s, std::uint32_t k, const char* what) {
    INFO(f.name << ", " << what << ": " << s.tiles.bm << "x" << s.tiles.bn << "x" << s.tiles.bk << ", chunk "
                << s.chunk_k);
    CHECK(s.tiles.threads() >= 1);
    CHECK(s.tiles.threads() <= f.info.max_workgroup_invocations);
    CHECK(s.tiles.shared_bytes() <= f.info.max_shared_memory);
    CHECK(s.tiles.bm % s.tiles.tm == 0);
    CHECK(s.tiles.bn % s.tiles.tn == 0);
    CHECK(s.chunk_k >= 1);
    if (f.info.type == device_type::cpu) {
        CHECK(s.tiles.loop_iterations(std::min(s.chunk_k, std::max(k, 1u))) < cpu_loop_limit);
        // CPU family: one subgroup per workgroup, never more lanes than the device has.
        CHECK(s.tiles.cpu);
        CHECK(s.tiles.threads() == f.info.subgroup_size);
    } else {
        CHECK(s.chunk_k >= k);  // one dispatch covers the whole K
        CHECK_FALSE(s.tiles.cpu);
    }
}

}  // namespace

TEST_CASE("plan: products' tiles and K chunks fit every fake device", "[plan]") {
    for (const fake& f : fake_devices()) {
        for (std::size_t seq : {1u, 3u, 17u, 113u, 2048u}) {
            for (std::size_t d_in : {1u, 64u, 100000u}) {
                const auto pr = problem(2, seq, d_in, 64, 4, 48, qkv::implementation::staged);
                const plan p = plan_for(f, pr, facts_for(f, 64));
                INFO("seq " << seq << ", d_in " << d_in);
                check_step(f, p.project, p.d_in, "project");
                check_step(f, p.scores, p.d_k / p.heads, "scores");
                check_step(f, p.aggregate, p.seq, "aggregate");
                check_step(f, p.out_projection, p.d_v, "output projection");
                // The softmax: a power of two, within the device, at least a subgroup where it can be.
                CHECK(p.softmax_workgroup >= 1);
                CHECK((p.softmax_workgroup & (p.softmax_workgroup - 1)) == 0);
                CHECK(p.softmax_workgroup <= f.info.max_workgroup_invocations);
                CHECK(p.softmax == (f.info.subgroup_arithmetic ? shader_id::softmax_subgroup : shader_id::softmax));
                if (f.info.type == device_type::cpu)
                    CHECK(softmax_loop_iterations(p.softmax_workgroup, p.seq, f.info.subgroup_size,
                                                  f.info.subgroup_arithmetic) < cpu_loop_limit);
            }
        }
    }
}

TEST_CASE("plan: a K long enough to pass the CPU loop limit is split, elsewhere it is not", "[plan]") {
    for (const fake& f : fake_devices()) {
        const plan p = plan_for(f, problem(1, 17, 300000, 8, 1, 0, qkv::implementation::staged), facts_for(f, 64));
        INFO(f.name);
        if (f.info.type == device_type::cpu) {
            CHECK(p.project.chunk_k < p.d_in);
            CHECK(p.project.tiles.loop_iterations(p.project.chunk_k) < cpu_loop_limit - 1000);
            CHECK(p.project.chunk_k % p.project.tiles.bk == 0);
        } else {
            CHECK(p.project.chunk_k == p.d_in);
        }
    }
}

TEST_CASE("plan: the products' family and shaders follow the device and the request", "[plan]") {
    for (const fake& f : fake_devices()) {
        const auto pr = problem(1, 113, 32, 32, 2, 16, qkv::implementation::staged);
        const bool cpu = f.info.type == device_type::cpu;
        INFO(f.name);
        const plan p = plan_for(f, pr, facts_for(f, 64));
        CHECK(p.cpu_gemm == cpu);
        CHECK(p.project.shader == (cpu ? shader_id::project_cpu : shader_id::project));
        CHECK(p.scores.shader == (cpu ? shader_id::scores_cpu : shader_id::scores));
        CHECK(p.aggregate.shader == (cpu ? shader_id::aggregate_cpu : shader_id::aggregate));
        CHECK(p.out_projection.shader == (cpu ? shader_id::project_cpu : shader_id::project));
        // Asked for explicitly, either family runs anywhere.
        CHECK(plan_for(f, pr, facts_for(f, 64), kernel_family::block_tiles).project.shader == shader_id::project);
        CHECK(plan_for(f, pr, facts_for(f, 64), kernel_family::row_tiles).project.shader == shader_id::project_cpu);
        // fp16 storage: the _f16 twins (the output projection reads float32).
        auto half = pr;
        half.options.precision = qkv::precision::fp16;
        const plan h = plan_for(f, half, facts_for(f, 64));
        CHECK(h.project.shader == (cpu ? shader_id::project_cpu_f16 : shader_id::project_f16));
        CHECK(h.scores.shader == (cpu ? shader_id::scores_cpu_f16 : shader_id::scores_f16));
        CHECK(h.out_projection.shader == (cpu ? shader_id::project_cpu : shader_id::project));
    }
}

TEST_CASE("plan: the projection's texel variant where the device reads RGBA32F texel buffers", "[plan]") {
    for (fake f : fake_devices()) {
        INFO(f.name);
        f.info.subgroup_shuffle = false;  // the per-lane fetches (project_cpu_tx); the shuffles' variants below
        const bool cpu = f.info.type == device_type::cpu;
        device_facts texels = facts_for(f, 64);
        texels.projection_texels = true;
        const auto pr = problem(1, 113, 32, 32, 2, 16, qkv::implementation::staged);
        const plan p = plan_for(f, pr, texels);
        CHECK(p.project.shader == (cpu ? shader_id::project_cpu_tx : shader_id::project));
        CHECK(p.out_projection.shader == (cpu ? shader_id::project_cpu : shader_id::project));
        if (cpu) {
            // Whole texels: TN and BK multiples of 4, the K chunk too.
            CHECK(p.project.tiles.tn % 4 == 0);
            CHECK(p.project.tiles.bk % 4 == 0);
            CHECK(p.project.chunk_k % 4 == 0);
            CHECK(p.project.tiles.bm == p.project.tiles.threads() * p.project.tiles.tm);
            check_step(f, p.project, p.d_in, "project (texels)");
        }
        // The view ends after X and the weights, on a whole texel.
        CHECK(projection_view_bytes(p) % 16 == 0);
        CHECK(projection_view_bytes(p) >= p.w.offset + p.w.size);
        CHECK(projection_view_bytes(p) >= p.x.offset + p.x.size);
        auto half = pr;
        half.options.precision = qkv::precision::fp16;
        CHECK(plan_for(f, half, texels).project.shader ==
              (cpu ? shader_id::project_cpu_tx_f16 : shader_id::project_f16));
        // Without the facts, or with rows that do not start on whole texels: the storage-buffer variant.
        CHECK(plan_for(f, pr, facts_for(f, 64)).project.shader == (cpu ? shader_id::project_cpu : shader_id::project));
        CHECK(plan_for(f, problem(1, 113, 17, 32, 2, 0, qkv::implementation::fused), texels).project.shader ==
              (cpu ? shader_id::project_cpu : shader_id::project));
        CHECK(plan_for(f, problem(1, 113, 32, 3, 1, 0, qkv::implementation::fused), texels).project.shader ==
              (cpu ? shader_id::project_cpu : shader_id::project));
        // A long K is split into whole texels, each dispatch under the loop limit.
        const plan big = plan_for(f, problem(1, 17, 300000, 8, 1, 0, qkv::implementation::staged), texels);
        if (cpu) {
            CHECK(big.project.shader == shader_id::project_cpu_tx);
            CHECK(big.project.chunk_k < big.d_in);
            CHECK(big.project.chunk_k % 4 == 0);
            CHECK(big.project.tiles.loop_iterations(big.project.chunk_k) < cpu_loop_limit - 1000);
        }
    }
}

TEST_CASE("plan: the fused kernel's family", "[plan]") {
    const auto pr = problem(2, 113, 16, 32, 2, 0, qkv::implementation::fused);
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        const bool cpu = f.info.type == device_type::cpu;
        // Automatic: the CPU family on CPU devices where it can run, the GPU family elsewhere.
        CHECK(plan_for(f, pr, facts_for(f, 64)).family ==
              (cpu ? kernel_family::row_tiles : kernel_family::block_tiles));
        CHECK(plan_for(f, pr, facts_for(f, 64, {"no texel format", false})).family == kernel_family::block_tiles);
        CHECK(plan_for(f, pr, facts_for(f, 64), kernel_family::block_tiles).family == kernel_family::block_tiles);
        CHECK(plan_for(f, pr, facts_for(f, 64), kernel_family::row_tiles).family == kernel_family::row_tiles);
        // Asked for but refused: a typed error saying why.
        CHECK_THROWS_AS(plan_for(f, pr, facts_for(f, 64, {"too wide", true}), kernel_family::row_tiles),
                        qkv::vulkan::limit_exceeded);
        CHECK_THROWS_AS(plan_for(f, pr, facts_for(f, 64, {"no texel format", false}), kernel_family::row_tiles),
                        qkv::vulkan::unavailable);
        // The staged implementation has no family.
        const auto staged = problem(2, 113, 16, 32, 2, 0, qkv::implementation::staged);
        CHECK(plan_for(f, staged, facts_for(f, 64)).family == kernel_family::automatic);
    }
}

TEST_CASE("plan: the fused kernel's key chunks", "[plan]") {
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        const auto pr = problem(1, 16384, 16, 64, 1, 0, qkv::implementation::fused);
        // The CPU family takes its chunk from its own plan (flash_cpu.cpp).
        const plan c = plan_for(f, pr, facts_for(f, 512), kernel_family::row_tiles);
        CHECK(c.flash_chunk_keys == 512);
        // The GPU family: one dispatch on GPUs, chunks under the loop limit on CPU devices.
        const plan g = plan_for(f, pr, facts_for(f, 512), kernel_family::block_tiles);
        if (f.info.type == device_type::cpu)
            CHECK(g.flash_chunk_keys < g.seq);
        else
            CHECK(g.flash_chunk_keys == g.seq);
        // Too many dispatches is refused before anything runs.
        CHECK_THROWS_AS(plan_for(f, pr, facts_for(f, 8), kernel_family::row_tiles), qkv::vulkan::limit_exceeded);
        // Staged: no chunks.
        CHECK(
            plan_for(f, problem(1, 17, 16, 64, 1, 0, qkv::implementation::staged), facts_for(f, 8)).flash_chunk_keys ==
            17);
    }
}

namespace {
// Sets (or, with nullptr, clears) an environment variable for the rest of a scope.
class scoped_env {
public:
    scoped_env(const char* name, const char* value) : name_(name) { put(value); }
    ~scoped_env() { put(nullptr); }
    scoped_env(const scoped_env&) = delete;
    scoped_env& operator=(const scoped_env&) = delete;

private:
    void put(const char* value) const {
#ifdef _WIN32
        _putenv_s(name_, value ? value : "");
#else
        if (value)
            setenv(name_, value, 1);
        else
            unsetenv(name_);
#endif
    }
    const char* name_;
};
}  // namespace

TEST_CASE("plan: subgroupShuffle in the cpu family only where a workgroup is surely one subgroup", "[plan]") {
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        device_info with = f.info, without = f.info;
        with.subgroup_shuffle = true;
        without.subgroup_shuffle = false;
        const std::uint32_t wg = f.info.subgroup_size;
        const bool cpu = f.info.type == device_type::cpu;
        // A CPU device's subgroup is its SIMD vector; a GPU may compile a workgroup into
        // subgroups of another size, so the shuffles could read another subgroup's lanes.
        const settings defaults;
        CHECK(cpu_shuffle(with, wg, defaults) == (cpu && wg > 0));
        CHECK_FALSE(cpu_shuffle(without, wg, defaults));
        CHECK_FALSE(cpu_shuffle(with, wg * 2, defaults));  // a workgroup of two subgroups
        {
            const scoped_env never("QKV_CPU_SHUFFLE", "0");
            CHECK_FALSE(cpu_shuffle(with, wg, read_settings({})));
        }
        {
            const scoped_env allowed("QKV_CPU_SHUFFLE", "1");
            CHECK(cpu_shuffle(with, wg, read_settings({})) == (cpu && wg > 0));
            CHECK_FALSE(cpu_shuffle(without, wg, read_settings({})));  // 1 allows, it does not force
        }
        {
            const scoped_env bad("QKV_CPU_SHUFFLE", "yes");
            CHECK_THROWS_WITH(read_settings({}), Catch::Matchers::Contains("QKV_CPU_SHUFFLE=yes: expected 0"));
        }
    }
}

TEST_CASE("plan: the projection shares the weights by shuffles, and stores eight columns where it can", "[plan]") {
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        const bool cpu = f.info.type == device_type::cpu;
        device_facts texels = facts_for(f, 64);
        texels.projection_texels = true;
        for (const bool int64 : {false, true}) {
            INFO("shaderInt64 " << int64);
            fake d = f;
            d.info.subgroup_shuffle = true;
            d.info.shader_int64 = int64;
            const bool shuffle = cpu && d.info.subgroup_size > 0;
            // d = 32: Q|K|V rows of 96 columns, whole groups of 8.
            auto pr = problem(1, 113, 32, 32, 2, 0, qkv::implementation::fused);
            auto half = pr;
            half.options.precision = qkv::precision::fp16;
            const plan p = plan_for(d, pr, texels), h = plan_for(d, half, texels);
            if (!cpu) {
                CHECK(p.project.shader == shader_id::project);
                continue;
            }
            CHECK(p.project.shader == (!shuffle ? shader_id::project_cpu_tx
                                       : int64  ? shader_id::project_cpu_tx_wide
                                                : shader_id::project_cpu_tx_shuffle));
            // float16 packs two halves in 32 bits: no 64-bit integers needed.
            CHECK(h.project.shader == (shuffle ? shader_id::project_cpu_tx_wide_f16 : shader_id::project_cpu_tx_f16));
            for (const plan* q : {&p, &h}) {
                CHECK(projection_texels(q->project.shader));
                check_step(d, q->project, q->d_in, "project (texels)");
                if (q->project.shader == shader_id::project_cpu_tx_wide ||
                    q->project.shader == shader_id::project_cpu_tx_wide_f16)
                    CHECK(q->project.tiles.tn % 8 == 0);
            }
            // d = 4 (and 12): rows of 12 (36) columns, not whole groups of 8: four-column stores.
            for (const std::size_t width : {4u, 12u}) {
                const plan narrow = plan_for(d, problem(1, 17, 8, width, 1, 0, qkv::implementation::fused), texels);
                CHECK(narrow.project.shader ==
                      (shuffle ? shader_id::project_cpu_tx_shuffle : shader_id::project_cpu_tx));
                CHECK(narrow.project.tiles.tn % 4 == 0);
                CHECK(narrow.project.tiles.tn <= narrow.ld);
            }
            // A tile wider than 8 columns but not a multiple of 8 keeps the four-column stores.
            {
                const scoped_env tiles("QKV_PROJECT_TILES", "2,12");
                const settings tuned = read_settings({});
                device_facts with_tiles = texels;
                with_tiles.set = &tuned;
                const plan odd = plan_for(d, pr, with_tiles);
                CHECK(odd.project.tiles.tn == 12);
                CHECK(odd.project.shader == (shuffle ? shader_id::project_cpu_tx_shuffle : shader_id::project_cpu_tx));
            }
            // QKV_CPU_SHUFFLE=0: the weights per lane, four-column stores.
            {
                const scoped_env never("QKV_CPU_SHUFFLE", "0");
                const settings tuned = read_settings({});
                device_facts unshuffled = texels;
                unshuffled.set = &tuned;
                CHECK(plan_for(d, pr, unshuffled).project.shader == shader_id::project_cpu_tx);
                CHECK(plan_for(d, half, unshuffled).project.shader == shader_id::project_cpu_tx_f16);
            }
        }
    }
}

TEST_CASE("plan: the staged scores and aggregation through texel views where the device shuffles", "[plan]") {
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        const bool cpu = f.info.type == device_type::cpu;
        fake d = f;
        d.info.subgroup_shuffle = true;
        const bool shuffle = cpu && d.info.subgroup_size > 0;
        device_facts texels = facts_for(d, 64);
        texels.staged_texels = true;
        const auto staged = [](std::size_t seq, std::size_t d_k, std::size_t d_v, std::size_t heads) {
            auto pr = problem(1, seq, 8, d_k, heads, 0, qkv::implementation::staged);
            pr.shape.d_v = d_v;
            return pr;
        };
        // N, d_k / H and d_v / H multiples of 4 (and so 2·d_k + d_v): both.
        const plan both = plan_for(d, staged(36, 16, 8, 2), texels);
        CHECK(both.scores.shader == (shuffle ? shader_id::scores_cpu_tx
                                     : cpu   ? shader_id::scores_cpu
                                             : shader_id::scores));
        CHECK(both.aggregate.shader == (shuffle ? shader_id::aggregate_cpu_tx
                                        : cpu   ? shader_id::aggregate_cpu
                                                : shader_id::aggregate));
        if (shuffle) {
            for (const gemm_step* s : {&both.scores, &both.aggregate}) {
                CHECK(texel_gemm(s->shader));
                CHECK_FALSE(projection_texels(s->shader));
                check_step(d, *s, s == &both.scores ? 8u : 36u, "staged (texels)");
                CHECK(s->tiles.tn % 4 == 0);
                CHECK(s->tiles.bk == 4);
                CHECK(s->vec_store);
                CHECK_FALSE(s->skip_zero);  // set per call, from the inputs
            }
        }
        // The softmax with a row per lane on any CPU device (no shuffles needed), one subgroup a
        // workgroup, its two passes of N / 4 steps under the loop limit.
        const plan unshuffled = plan_for(f, staged(36, 16, 8, 2), texels);
        for (const plan* q : {&both, &unshuffled}) {
            CHECK((q->softmax == shader_id::softmax_cpu_tx) == cpu);
            if (cpu) CHECK(q->softmax_workgroup == cpu_lanes(f.info));
        }
        CHECK(plan_for(d, staged(36, 16, 8, 2), facts_for(d, 64)).softmax != shader_id::softmax_cpu_tx);
        // N = 17: the scores still (rows of 17 scores: four scalar stores per group), the
        // aggregation and the softmax not (rows of the weights off whole texels).
        const plan odd = plan_for(d, staged(17, 16, 8, 2), texels);
        CHECK(odd.scores.shader == (shuffle ? shader_id::scores_cpu_tx
                                    : cpu   ? shader_id::scores_cpu
                                            : shader_id::scores));
        if (shuffle) CHECK_FALSE(odd.scores.vec_store);
        CHECK(odd.aggregate.shader == (cpu ? shader_id::aggregate_cpu : shader_id::aggregate));
        CHECK(odd.softmax != shader_id::softmax_cpu_tx);
        // Q and K heads off whole texels (d_k / H = 6): the scores through storage buffers, the
        // aggregation (V heads of 4) still through texels.
        const plan q6 = plan_for(d, staged(36, 12, 8, 2), texels);
        CHECK_FALSE(texel_gemm(q6.scores.shader));
        CHECK(texel_gemm(q6.aggregate.shader) == shuffle);
        // Q|K|V rows of 2·8 + 6 = 22: nothing starts on whole texels.
        const plan rows22 = plan_for(d, staged(36, 8, 6, 1), texels);
        CHECK_FALSE(texel_gemm(rows22.scores.shader));
        CHECK_FALSE(texel_gemm(rows22.aggregate.shader));
        // Without the facts (formats, view sizes), or without shuffles: storage buffers.
        CHECK_FALSE(texel_gemm(plan_for(d, staged(36, 16, 8, 2), facts_for(d, 64)).scores.shader));
        fake plain = f;  // without shuffles
        plain.info.subgroup_shuffle = false;
        CHECK_FALSE(texel_gemm(plan_for(plain, staged(36, 16, 8, 2), texels).scores.shader));
        {
            const scoped_env never("QKV_CPU_SHUFFLE", "0");
            const settings tuned = read_settings({});
            device_facts no_shuffle = texels;
            no_shuffle.set = &tuned;
            CHECK_FALSE(texel_gemm(plan_for(d, staged(36, 16, 8, 2), no_shuffle).aggregate.shader));
        }
    }
}

TEST_CASE("plan: the range guard folds by subgroup where the device has subgroup arithmetic", "[plan]") {
    for (const fake& f : fake_devices()) {
        INFO(f.name);
        for (const bool fp16 : {false, true}) {
            auto pr = problem(2, 17, 8, 8, 2, 0, qkv::implementation::fused);
            if (fp16) pr.options.precision = qkv::precision::fp16;
            const plan p = plan_for(f, pr, facts_for(f, 64));
            const shader_id expected =
                f.info.subgroup_arithmetic
                    ? (fp16 ? shader_id::range_guard_subgroup_f16 : shader_id::range_guard_subgroup)
                    : (fp16 ? shader_id::range_guard_f16 : shader_id::range_guard);
            CHECK(p.range_guard == expected);
        }
    }
}
