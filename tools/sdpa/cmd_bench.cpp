// `sdpa bench`: sweeps shapes x backends and reports time, throughput and extra memory.
//
// Structure: the flags expand into BenchCases (sweep), each case becomes Workloads (inputs
// plus the call to time: the forward, and with --backward the backward given the forward's
// results), every (workload, backend) is measured the same way, and rows go to a Report
// whose columns every output format shares. --bias / --flex make every case run that
// attention variant; --peak measures the machine's limits first and adds each row's
// fraction of them.

#include <omp.h>

#include <algorithm>
#include <iomanip>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common.h"
#include "host.h"
#include "peak.h"
#include "report.h"
#include "variants.h"

namespace sdpa::cli {
namespace {

struct BenchOptions {
  int64_t batch = 1;
  int64_t heads_q = 8;
  std::optional<int64_t> heads_kv;  // default: heads_q
  std::vector<int64_t> seq_lens = {128, 256, 512, 1024, 2048, 4096};
  int64_t head_dim = 64;
  std::string dtype = "float32";
  std::string causal = "both";
  std::vector<std::string> backends;
  bool backward = false;
  VariantOptions variant;
  bool peak = false;
  bool peak_only = false;
  int repeats = 5;
  int warmup = 1;
  uint64_t max_math_bytes = uint64_t{2} << 30;
  uint32_t seed = 0;
  bool json = false;
  bool csv = false;
  std::string command_line;  // as typed, for the context
};

// One point of the sweep.
struct BenchCase {
  int64_t batch, heads_q, heads_kv, seq_len, head_dim;
  DType dtype;
  bool causal;

  std::string describe() const {
    return "B=" + std::to_string(batch) + " Hq=" + std::to_string(heads_q) +
           " Hkv=" + std::to_string(heads_kv) + " L=S=" + std::to_string(seq_len) +
           " E=" + std::to_string(head_dim) + " " + std::string(dtype_name(dtype)) +
           (causal ? " causal" : "");
  }
};

std::vector<BenchCase> sweep(const BenchOptions& o) {
  const DType dtype = parse_dtype(o.dtype);
  const int64_t heads_kv = o.heads_kv.value_or(o.heads_q);
  if (o.heads_q % heads_kv != 0) {
    throw UsageError("--heads-q " + std::to_string(o.heads_q) +
                     " must be a multiple of --heads-kv " + std::to_string(heads_kv));
  }
  std::vector<bool> causal_modes;
  if (o.causal != "on") causal_modes.push_back(false);
  if (o.causal != "off") causal_modes.push_back(true);
  std::vector<BenchCase> cases;
  for (const int64_t seq_len : o.seq_lens) {
    for (const bool causal : causal_modes) {
      cases.push_back({o.batch, o.heads_q, heads_kv, seq_len, o.head_dim, dtype, causal});
    }
  }
  return cases;
}

// What is timed for one case: a call with its inputs bound.
struct Workload {
  std::string pass;        // "forward" or "backward"
  AttentionParams params;  // for explain()
  double flops = 0.0;
  std::function<void()> call;
};

// The forward (and with --backward the backward) of case `c`. FLOPs follow
// FlashAttention's convention: forward 4·B·Hq·L·S·E (halved when causal, scaled by the
// kept fraction of a --bias mask or the BlockMask density of a --flex mask), backward
// 2.5x the forward.
std::vector<Workload> make_workloads(const BenchCase& c, const BenchOptions& o) {
  const uint32_t seed = o.seed;
  const Tensor q = randn({c.batch, c.heads_q, c.seq_len, c.head_dim}, c.dtype, seed);
  const Tensor k = randn({c.batch, c.heads_kv, c.seq_len, c.head_dim}, c.dtype, seed + 1);
  const Tensor v = randn({c.batch, c.heads_kv, c.seq_len, c.head_dim}, c.dtype, seed + 2);
  SDPAOptions options;
  options.is_causal = c.causal;
  options.enable_gqa = c.heads_q != c.heads_kv;
  double density = 1.0;
  if (!o.variant.bias.empty()) {
    const BiasVariant bias =
        make_bias(o.variant.bias, c.batch, c.heads_q, c.seq_len, c.seq_len, o.variant);
    options.attn_mask = bias.bias;
    density = bias.density;
  }
  const auto flex = std::make_shared<FlexVariant>();
  if (!o.variant.flex.empty()) {
    *flex = make_flex(o.variant.flex, c.batch, c.heads_q, c.seq_len, c.seq_len, o.variant);
  }
  const flex::BlockMask* block_mask = flex->block_mask.get();

  Workload fwd;
  fwd.pass = "forward";
  fwd.params = make_params(q, k, v, options);
  add_flex(fwd.params, *flex);
  fwd.flops = forward_flops(fwd.params, c.causal) * density * flex->density();
  fwd.call = [q, k, v, options, flex, block_mask] {
    flex_attention(q, k, v, flex->score_mod, block_mask, options);
  };
  std::vector<Workload> out = {fwd};
  if (!o.backward) return out;

  const AttentionResult r = flex_attention(q, k, v, flex->score_mod, block_mask, options);
  const Tensor grad_out = randn(r.out.sizes(), c.dtype, seed + 3);
  SDPAOptions bwd_options = options;
  bwd_options.dropout_state = r.philox;
  Workload bwd;
  bwd.pass = "backward";
  bwd.params = make_backward_params(grad_out, q, k, v, r.out, r.lse, bwd_options);
  add_flex(bwd.params, *flex);
  bwd.flops = 2.5 * fwd.flops;
  bwd.call = [grad_out, q, k, v, r, bwd_options, flex, block_mask] {
    flex_attention_backward(grad_out, q, k, v, r.out, r.lse, flex->score_mod, block_mask,
                            bwd_options);
  };
  out.push_back(bwd);
  return out;
}

struct Measurement {
  double median_ms = 0.0;
  double min_ms = 0.0;
  int64_t peak_extra_bytes = 0;  // peak allocation above what was held before the call
};

Measurement measure(const std::function<void()>& call, int warmup, int repeats) {
  Measurement m;
  // The memory probe doubles as the first warm-up call.
  reset_peak_memory();
  const int64_t before = memory_stats().current_bytes;
  call();
  m.peak_extra_bytes = memory_stats().peak_bytes - before;
  const std::vector<double> ms = time_ms(call, std::max(warmup - 1, 0), repeats);
  m.median_ms = median(ms);
  m.min_ms = *std::min_element(ms.begin(), ms.end());
  return m;
}

// Why `backend` is not measured on `w`, or nullopt when it is.
std::optional<std::string> skip_reason(SDPBackend backend, const Workload& w, const Explanation& e,
                                       const BenchOptions& o) {
  const AttentionParams& p = w.params;
  if (backend == SDPBackend::MATH) {
    const uint64_t score_bytes =
        static_cast<uint64_t>(p.batch) * p.num_heads_q * p.q_len * p.kv_len * sizeof(float);
    if (score_bytes > o.max_math_bytes) {
      return "its " + format_bytes(static_cast<int64_t>(score_bytes)) +
             " score buffer exceeds --max-math-bytes " +
             format_bytes(static_cast<int64_t>(o.max_math_bytes));
    }
  }
  for (const BackendVerdict& v : e.verdicts) {
    if (v.backend != backend) continue;
    if (v.allowed && v.supported) return std::nullopt;
    std::string reasons;
    for (const std::string& r : v.reasons) reasons += (reasons.empty() ? "" : "; ") + r;
    return reasons;
  }
  return "no verdict from explain()";
}

// Why `backend` can run no case of the sweep, or nullopt when it can run some. Every
// case is a CPU call of the sweep's dtype, so a backend that rejects even the minimal CPU
// probe of that dtype (not built, for another device, or not for this dtype) never runs
// here; the flags aside, as --backends chooses.
std::optional<std::string> never_runs_reason(SDPBackend backend, DType dtype) {
  const sdpa_kernel only(backend);
  Reasons reasons;
  if (can_use(backend, probe_params(dtype), &reasons)) return std::nullopt;
  std::string text;
  for (const std::string& r : reasons.items) text += (text.empty() ? "" : "; ") + r;
  return text;
}

std::string variant_name(const BenchOptions& o) {
  if (!o.variant.bias.empty()) return "bias:" + o.variant.bias;
  if (!o.variant.flex.empty()) return "flex:" + o.variant.flex;
  return "none";
}

Report make_report(const BenchOptions& o, const std::optional<MachinePeak>& peak) {
  Report r;
  // The host and command fields let bench/render_benchmarks.py place the results.
  r.context = {{"sdpa", version()},
               {"command", o.command_line},
               {"cpu_model", bench::cpu_model_name()},
               {"cpu_capability", backends::cpu::get_cpu_capability()},
               {"avx512_bf16", bench::has_avx512_bf16()},
               {"amx_bf16", backends::cpu::amx_bf16_available()},
               {"omp_threads", int64_t{omp_get_max_threads()}},
               {"repeats", int64_t{o.repeats}},
               {"warmup", int64_t{o.warmup}},
               {"variant", variant_name(o)}};
  if (peak) {
    // FMA throughput of the best vector ISA, vdpbf16ps (only on CPUs with avx512_bf16)
    // and memcpy bandwidth counting bytes read plus written.
    r.context.push_back({"peak_threads", int64_t{peak->threads}});
    r.context.push_back({"peak_fp32_isa", peak->fp32_isa});
    r.context.push_back({"peak_fp32_gflops", peak->fp32_gflops});
    if (peak->bf16_gflops) r.context.push_back({"peak_bf16_gflops", *peak->bf16_gflops});
    if (peak->amx_bf16_gflops) {
      r.context.push_back({"peak_amx_bf16_gflops", *peak->amx_bf16_gflops});
    }
    r.context.push_back({"peak_copy_gbps", peak->copy_gbps});
  }
  r.columns = {{"batch"},     {"heads_q"},         {"heads_kv"},     {"q_len"},
               {"kv_len"},    {"head_dim"},        {"dtype"},        {"causal"},
               {"pass"},      {"backend"},         {"median_ms", 3}, {"min_ms", 3},
               {"gflops", 1}, {"peak_extra_bytes"}};
  if (peak) r.columns.push_back({"pct_of_peak", 1});
  return r;
}

// The peak a row's GFLOP/s is compared with: bf16 rows with that of the unit their
// products run on (AMX tiles, else vdpbf16ps, when the CPU has them), every other dtype
// with the fp32 FMA peak (half types compute in float32).
double peak_for(const MachinePeak& peak, DType dtype) {
  if (dtype != DType::kBFloat16) return peak.fp32_gflops;
  if (peak.amx_bf16_gflops) return *peak.amx_bf16_gflops;
  return peak.bf16_gflops ? *peak.bf16_gflops : peak.fp32_gflops;
}

int run_bench(const BenchOptions& o) {
  if (!o.variant.bias.empty() && !o.variant.flex.empty())
    throw UsageError("--bias and --flex are exclusive");
  std::optional<MachinePeak> peak;
  if (o.peak || o.peak_only) {
    std::cerr << "measuring the machine's peaks...\n";
    peak = measure_peak();
  }
  Report report = make_report(o, peak);
  if (o.peak_only) {
    // JSON as every other bench output (no rows); text as bare key: value lines.
    if (o.json) {
      write_report(report, ReportFormat::kJson, std::cout);
    } else {
      write_context(report, "", std::cout);
    }
    return kExitOk;
  }
  const std::vector<BenchCase> cases = sweep(o);
  const std::vector<SDPBackend> backends =
      o.backends.empty() ? default_priority_order() : parse_backends(o.backends);
  // Backends that never run here are listed under "skipped" only: a progress line per
  // case for a backend this build or machine cannot run would bury the measured ones.
  std::vector<std::optional<std::string>> never_runs;
  const DType dtype = parse_dtype(o.dtype);
  for (const SDPBackend backend : backends) {
    never_runs.push_back(never_runs_reason(backend, dtype));
  }
  const auto runnable = std::count(never_runs.begin(), never_runs.end(), std::nullopt);
  report.num_cases = cases.size() * (o.backward ? 2 : 1);  // one per (case, pass)
  size_t step = 0;
  const size_t steps = report.num_cases * static_cast<size_t>(runnable);
  for (const BenchCase& c : cases) {
    std::vector<Workload> workloads;
    try {
      workloads = make_workloads(c, o);
    } catch (const Error& e) {
      throw UsageError(c.describe() + ": " + e.what());  // every input came from a flag
    }
    for (const Workload& w : workloads) {
      const Explanation e = explain(w.params);
      const std::string what = c.describe() + " " + w.pass;
      for (size_t i = 0; i < backends.size(); ++i) {
        const SDPBackend backend = backends[i];
        const std::string name(backend_name(backend));
        if (never_runs[i]) {
          report.skipped.push_back({what, name, *never_runs[i]});
          continue;
        }
        std::cerr << "[" << ++step << "/" << steps << "] " << what << " " << name << ": ";
        if (const auto reason = skip_reason(backend, w, e, o)) {
          std::cerr << "skipped (" << *reason << ")\n";
          report.skipped.push_back({what, name, *reason});
          continue;
        }
        const sdpa_kernel only(backend);
        const Measurement m = measure(w.call, o.warmup, o.repeats);
        const double gflops = w.flops / (m.median_ms * 1e6);
        std::cerr << std::fixed << std::setprecision(3) << m.median_ms << " ms, "
                  << std::setprecision(1) << gflops << " GFLOP/s\n";
        std::vector<Cell> row = {c.batch,
                                 c.heads_q,
                                 c.heads_kv,
                                 c.seq_len,
                                 c.seq_len,
                                 c.head_dim,
                                 std::string(dtype_name(c.dtype)),
                                 c.causal,
                                 w.pass,
                                 name,
                                 m.median_ms,
                                 m.min_ms,
                                 gflops,
                                 m.peak_extra_bytes};
        if (peak) row.push_back(100.0 * gflops / peak_for(*peak, c.dtype));
        report.rows.push_back(std::move(row));
      }
    }
  }
  write_report(report,
               o.json  ? ReportFormat::kJson
               : o.csv ? ReportFormat::kCsv
                       : ReportFormat::kTable,
               std::cout);
  return kExitOk;
}

}  // namespace

Command add_bench_command(CLI::App& parent, std::string command_line) {
  CLI::App* app = parent.add_subcommand(
      "bench", "Time backends over a sweep of shapes (progress on stderr, results on stdout)");
  auto o = std::make_shared<BenchOptions>();
  o->command_line = std::move(command_line);
  const CLI::Validator positive = integer_in<int64_t>(1);
  app->add_option("-b,--batch", o->batch, "Batch size B")->check(positive)->capture_default_str();
  app->add_option("--heads-q", o->heads_q, "Query heads Hq")
      ->check(positive)
      ->capture_default_str();
  app->add_option("--heads-kv", o->heads_kv, "Key/value heads Hkv (default: Hq; GQA when fewer)")
      ->check(positive);
  app->add_option("--seq-lens", o->seq_lens, "Comma-separated sequence lengths (L = S)")
      ->delimiter(',')
      ->check(positive)
      ->capture_default_str();
  app->add_option("--head-dim", o->head_dim, "Head dim E = Ev")
      ->check(positive)
      ->capture_default_str();
  add_dtype_option(*app, o->dtype);
  app->add_option("--causal", o->causal, "Causal cases: both, on or off")
      ->check(CLI::IsMember({"both", "on", "off"}))
      ->capture_default_str();
  add_backends_option(*app, o->backends);
  app->add_flag("--backward", o->backward,
                "Also time the backward (GFLOP/s as FlashAttention: 2.5x the forward's FLOPs)");
  add_variant_options(*app, o->variant);
  app->add_flag("--peak", o->peak,
                "Measure fp32 FMA, bf16 dot (vdpbf16ps, AMX) and copy bandwidth peaks first; add "
                "pct_of_peak");
  app->add_flag("--peak-only", o->peak_only,
                "Only measure and print the peaks (as key: value lines, or JSON with --json; "
                "peak_bf16_gflops only on CPUs with avx512_bf16, peak_amx_bf16_gflops with AMX)");
  app->add_option("--repeats", o->repeats, "Timed calls per row")
      ->check(integer_in(1))
      ->capture_default_str();
  app->add_option("--warmup", o->warmup, "Untimed calls first (the first also measures memory)")
      ->check(integer_in(0))
      ->capture_default_str();
  app->add_option("--max-math-bytes", o->max_math_bytes,
                  "Skip MATH when its B*Hq*L*S float32 score buffer exceeds this (e.g. 2GiB)")
      ->transform(CLI::AsSizeValue(false))
      ->transform(byte_count())  // a check, added as a transform so that it runs first
      ->capture_default_str();
  app->add_option("--seed", o->seed, "Seed of the random inputs")
      ->check(integer_in<uint32_t>(0))
      ->capture_default_str();
  CLI::Option* json = app->add_flag("--json", o->json, "Write JSON instead of a table");
  CLI::Option* csv = app->add_flag("--csv", o->csv, "Write CSV instead of a table");
  json->excludes(csv);
  return {app, [o] { return run_bench(*o); }};
}

}  // namespace sdpa::cli
