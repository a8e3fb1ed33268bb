#pragma once
// Helpers shared by the `sdpa` subcommands: exit codes, backend lists, random inputs,
// timing, error metrics and FLOP counts.

#include <cstdint>
#include <filesystem>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "sdpa/sdpa.h"

namespace sdpa::cli {

/// Process exit codes of `sdpa`.
enum ExitCode : int {
  kExitOk = 0,
  kExitError = 1,        ///< sdpa::Error or I/O failure
  kExitUsage = 2,        ///< bad flags or flag combinations
  kExitCheckFailed = 3,  ///< `sdpa run`: a backend exceeded the tolerance
};

/// A flag or flag combination that cannot work; main prints it and exits with kExitUsage.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// A registered subcommand and the action to run once its flags are parsed.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_info_command(CLI::App& parent);
Command add_explain_command(CLI::App& parent);
Command add_run_command(CLI::App& parent);
/// `command_line`: the whole invocation, recorded in bench's context.
Command add_bench_command(CLI::App& parent, std::string command_line);

/// Validator accepting whatever sdpa::parse_backend accepts ("flash", "MATH", ...).
CLI::Validator backend_validator();
/// Parses backend names (already validated by backend_validator()).
std::vector<SDPBackend> parse_backends(const std::vector<std::string>& names);
/// Adds `--backends NAME,...` to `app`, storing into `names`.
CLI::Option* add_backends_option(CLI::App& app, std::vector<std::string>& names);

/// Validator of an integer flag stored as T, accepting [min, max]. Its message states
/// the bound in words ("expected an integer >= 1, got '0'"; a type's largest value as
/// "2^31 - 1"), where CLI11's Range would print the limits of a double.
template <class T>
CLI::Validator integer_in(T min, T max = std::numeric_limits<T>::max());
/// Validators of a real-valued flag: "expected a number >= 0 / > 0 / from 0 to 1, got ...".
CLI::Validator number_at_least(double min);
CLI::Validator number_above(double min);
CLI::Validator number_in(double min, double max);
/// Validator to run before CLI::AsSizeValue (which saturates too large a count without a
/// word): "expected a byte count from 0 to 2^64 - 1, ...".
CLI::Validator byte_count();

/// Adds `--dtype NAME` to `app`, storing into `name`: a floating dtype under any name
/// sdpa::parse_dtype accepts (float32, fp32, bf16, half, ...), rewritten to its
/// dtype_name(). The stored default is shown in the help.
CLI::Option* add_dtype_option(CLI::App& app, std::string& name);

/// A minimal CPU call ([1, 1, 1, 8], float32 unless given), the probe of `sdpa info` and
/// `sdpa bench`. A backend that cannot take it cannot run CPU tensors of that dtype at all
/// (not built, or for another device).
AttentionParams probe_params(DType dtype = DType::kFloat32);

/// Standard-normal tensor (std::mt19937 seeded with `seed`), converted to `dtype`. Never
/// zeros: zeros hide masking and softmax bugs.
Tensor randn(const Shape& shape, DType dtype, uint32_t seed);

/// Milliseconds of each of `repeats` calls of `fn`, after `warmup` untimed calls.
std::vector<double> time_ms(const std::function<void()>& fn, int warmup, int repeats);
/// Median of a non-empty sample (the upper median for an even count).
double median(std::vector<double> values);

/// How far `actual` is from `expected` (same shape, any dtypes), computed in float64.
struct ErrorStats {
  double max_abs = 0.0;  ///< max |actual - expected|; +inf when either holds a NaN
  double max_rel = 0.0;  ///< max_abs / max |expected|
};
/// Throws sdpa::Error when the shapes differ.
ErrorStats compare(const Tensor& actual, const Tensor& expected);

/// Multiply-adds of one forward call, counted as 2 FLOPs each: q k^T is B·Hq·L·S·E and
/// P v is B·Hq·L·S·Ev; a causal call computes about half of the scores.
double forward_flops(const AttentionParams& params, bool causal);

/// `items` separated by ", ".
std::string join(const std::vector<std::string>& items);

/// "1.5 KiB", "2.0 GiB".
std::string format_bytes(int64_t bytes);

/// The shipped capture data/<name>: under $SDPA_DATA_DIR when set, else the source tree.
std::filesystem::path data_file(const std::string& name);

}  // namespace sdpa::cli
