// `sdpa run [FILE]`: runs every usable backend on attention inputs captured from a real
// model and checks each against the captured output (the accuracy gate of the project).
//
// FILE holds, per layer i, `layer{i}.q`, `layer{i}.k`, `layer{i}.v` [B, H, L, E], an
// optional `layer{i}.attn_mask` (bool broadcastable to [B, H, L, S], true = attend) and
// an optional `layer{i}.out` (the reference output); or the same names without the
// `layer{i}.` prefix for a single call. Metadata "scale", when present, is the softmax
// scale. Without `out`, MATH in float64 is the reference.

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <string>

#include "common.h"
#include "sdpa/safetensors.h"

namespace sdpa::cli {
namespace {

constexpr const char* kDefaultDataFile = "minilm_attention.safetensors";
// Metadata values longer than this (e.g. the captured sentences) are shortened on screen.
constexpr size_t kMaxMetadataChars = 160;

struct RunOptions {
  std::string file;
  int repeats = 5;
  double tolerance = 1e-5;
  std::vector<std::string> backends;
};

// One captured attention call.
struct CapturedCall {
  std::string label;  // "layer3", or "call" for an unprefixed file
  Tensor q, k, v, attn_mask, out;
};

// Returns i for "layer{i}.q", else -1.
int64_t layer_index(const std::string& name) {
  constexpr std::string_view kPrefix = "layer", kSuffix = ".q";
  if (name.size() <= kPrefix.size() + kSuffix.size() || !name.starts_with(kPrefix) ||
      !name.ends_with(kSuffix)) {
    return -1;
  }
  const std::string digits =
      name.substr(kPrefix.size(), name.size() - kPrefix.size() - kSuffix.size());
  if (digits.size() > 9 || !std::all_of(digits.begin(), digits.end(), [](unsigned char c) {
        return std::isdigit(c);
      })) {
    return -1;
  }
  return std::stoll(digits);
}

CapturedCall take_call(const SafetensorsFile& file, const std::string& path,
                       const std::string& prefix, std::string label) {
  auto get = [&](const std::string& role, bool required) {
    const auto it = file.tensors.find(prefix + role);
    if (it != file.tensors.end()) return it->second;
    SDPA_CHECK(!required, path, ": tensor '", prefix, role, "' is missing (", label,
               " needs ", prefix, "q, ", prefix, "k and ", prefix, "v)");
    return Tensor();
  };
  CapturedCall call;
  call.q = get("q", true);
  call.k = get("k", true);
  call.v = get("v", true);
  call.attn_mask = get("attn_mask", false);
  call.out = get("out", false);
  call.label = std::move(label);  // last: get() names it in its errors
  return call;
}

// Layers in numeric order (layer10 after layer9), or the one unprefixed call.
std::vector<CapturedCall> find_calls(const SafetensorsFile& file, const std::string& path) {
  std::map<int64_t, std::string> layers;
  for (const auto& [name, tensor] : file.tensors) {
    if (const int64_t i = layer_index(name); i >= 0) layers[i] = "layer" + std::to_string(i);
  }
  std::vector<CapturedCall> calls;
  for (const auto& [i, label] : layers) calls.push_back(take_call(file, path, label + ".", label));
  if (file.tensors.contains("q")) calls.push_back(take_call(file, path, "", "call"));
  SDPA_CHECK(!calls.empty(), path,
             ": expected tensors layer{i}.q, layer{i}.k, layer{i}.v (or q, k, v), found none");
  return calls;
}

SDPAOptions call_options(const CapturedCall& call, const SafetensorsMetadata& metadata,
                         const std::string& path) {
  SDPAOptions options;
  if (call.attn_mask.defined()) options.attn_mask = call.attn_mask;
  if (const auto it = metadata.find("scale"); it != metadata.end()) {
    size_t used = 0;
    double scale = 0.0;
    try {
      scale = std::stod(it->second, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    SDPA_CHECK(used == it->second.size() && used > 0, path,
               ": metadata 'scale': expected a number, got '", it->second, "'");
    options.scale = scale;
  }
  return options;
}

// MATH in float64: the reference when the file has no captured output.
Tensor float64_reference(const CapturedCall& call, SDPAOptions options) {
  const sdpa_kernel math_only(SDPBackend::MATH);
  if (call.attn_mask.defined() && call.attn_mask.dtype() != DType::kBool) {
    options.attn_mask = call.attn_mask.to(DType::kFloat64);
  }
  return scaled_dot_product_attention(call.q.to(DType::kFloat64), call.k.to(DType::kFloat64),
                                      call.v.to(DType::kFloat64), options);
}

void print_header(const std::string& path, const SafetensorsFile& file,
                  const std::vector<CapturedCall>& calls, const RunOptions& o) {
  std::printf("file: %s\n", path.c_str());
  for (const auto& [key, value] : file.metadata) {
    const std::string shown =
        value.size() > kMaxMetadataChars ? value.substr(0, kMaxMetadataChars) + "..." : value;
    std::printf("  %s: %s\n", key.c_str(), shown.c_str());
  }
  const CapturedCall& first = calls.front();
  std::printf("calls: %zu (%s: q %s, k %s, v %s, attn_mask %s)\n", calls.size(),
              first.label.c_str(), shape_str(first.q.sizes()).c_str(),
              shape_str(first.k.sizes()).c_str(), shape_str(first.v.sizes()).c_str(),
              first.attn_mask.defined() ? first.attn_mask.describe().c_str() : "none");
  std::printf("reference: %s\n", first.out.defined() ? "the captured 'out' tensors"
                                                     : "MATH in float64 (no 'out' in the file)");
  std::printf("check: max rel err = max|out - ref| / max|ref| <= %g; time: median of %d runs\n\n",
              o.tolerance, o.repeats);
  std::printf("%-8s %-20s %12s %12s %10s %10s  %s\n", "layer", "backend", "max abs err",
              "max rel err", "median ms", "GFLOP/s", "check");
}

// Tally of the checked runs, and the backends skipped with their reasons.
struct RunTally {
  int runs = 0;
  int failures = 0;
  std::set<std::string> skipped;  // "BACKEND:\n    - reason...", once each
};

// Runs every usable backend on one captured call and prints a row per backend.
void check_call(const CapturedCall& call, const SDPAOptions& options, const RunOptions& o,
                RunTally& tally) {
  const AttentionParams params = make_params(call.q, call.k, call.v, options);
  const Tensor reference = call.out.defined() ? call.out : float64_reference(call, options);
  for (const BackendVerdict& verdict : explain(params).verdicts) {
    if (!verdict.allowed || !verdict.supported) {
      std::string line = std::string(backend_name(verdict.backend)) + ":";
      for (const std::string& reason : verdict.reasons) line += "\n    - " + reason;
      tally.skipped.insert(line);
      continue;
    }
    const sdpa_kernel only(verdict.backend);
    AttentionResult result;
    const std::vector<double> ms = time_ms(
        [&] { result = scaled_dot_product_attention_with_lse(call.q, call.k, call.v, options); },
        /*warmup=*/1, o.repeats);
    const ErrorStats err = compare(result.out, reference);
    const bool ok = err.max_rel <= o.tolerance;  // false for NaN (max_rel is then inf)
    const double median_ms = median(ms);
    ++tally.runs;
    tally.failures += ok ? 0 : 1;
    std::printf("%-8s %-20s %12.3e %12.3e %10.3f %10.2f  %s\n", call.label.c_str(),
                std::string(backend_name(result.backend)).c_str(), err.max_abs, err.max_rel,
                median_ms, forward_flops(params, false) / (median_ms * 1e6), ok ? "ok" : "FAIL");
  }
}

int run_run(const RunOptions& o) {
  const std::string path = o.file.empty() ? data_file(kDefaultDataFile).string() : o.file;
  if (o.file.empty() && !std::filesystem::exists(path)) {
    throw Error(path + ": the default capture is missing; pass FILE or set SDPA_DATA_DIR");
  }
  const SafetensorsFile file = load_safetensors(path);
  const std::vector<CapturedCall> calls = find_calls(file, path);
  print_header(path, file, calls, o);

  std::unique_ptr<sdpa_kernel> restrict_to;
  if (!o.backends.empty()) restrict_to = std::make_unique<sdpa_kernel>(parse_backends(o.backends));
  RunTally tally;
  for (const CapturedCall& call : calls) {
    try {
      check_call(call, call_options(call, file.metadata, path), o, tally);
    } catch (const Error& e) {
      std::fflush(stdout);  // the rows so far first, then the error
      throw Error(path + ": " + call.label + ": " + e.what());
    }
  }
  if (!tally.skipped.empty()) {
    std::printf("\nskipped:\n");
    for (const std::string& line : tally.skipped) std::printf("  %s\n", line.c_str());
  }
  if (tally.runs == 0) throw Error(path + ": no backend could run any call (see skipped)");
  if (tally.failures > 0) {
    std::printf("\nFAILED: %d of %d runs exceed max rel err %g\n", tally.failures, tally.runs,
                o.tolerance);
    return kExitCheckFailed;
  }
  std::printf("\nok: %d runs within max rel err %g\n", tally.runs, o.tolerance);
  return kExitOk;
}

}  // namespace

Command add_run_command(CLI::App& parent) {
  CLI::App* app = parent.add_subcommand(
      "run", "Check every usable backend against attention tensors captured from a model");
  auto o = std::make_shared<RunOptions>();
  app->add_option("file", o->file,
                  std::string(".safetensors file (default: data/") + kDefaultDataFile +
                      ", or under $SDPA_DATA_DIR)");
  app->add_option("--repeats", o->repeats, "Timed runs per call (median reported)")
      ->check(integer_in(1))
      ->capture_default_str();
  app->add_option("--tolerance", o->tolerance, "Largest acceptable max rel err")
      ->check(number_at_least(0.0))
      ->capture_default_str();
  add_backends_option(*app, o->backends);
  return {app, [o] { return run_run(*o); }};
}

}  // namespace sdpa::cli
